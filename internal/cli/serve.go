package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pysandbox/pysandbox/internal/audit"
	"github.com/pysandbox/pysandbox/internal/httpserver"
	"github.com/pysandbox/pysandbox/internal/policy"
	"github.com/pysandbox/pysandbox/internal/tools"
	"github.com/pysandbox/pysandbox/internal/upstream"
)

// serve is `pysandbox serve`: it parses and checks the flags, assembles
// the server they describe, serves until the client goes (stdio) or a
// signal (HTTP), and closes every part, last built first.
func serve(args []string, stderr io.Writer) error {
	cfg, err := parseServeFlags(args, stderr)
	if err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	if cfg.Container != "" {
		return serveInContainer(cfg, args, stderr)
	}
	if cfg.Image != "" {
		return usageError{errors.New("--image goes with --container")}
	}
	s, err := assemble(cfg, stderr)
	if err != nil {
		return err
	}
	defer s.close()
	if !s.http() {
		return s.serveStdio()
	}
	return s.serveHTTP()
}

// serveStdio serves MCP on stdin and stdout until the client goes.
func (s *server) serveStdio() error {
	s.log.Info("serving MCP on stdio", "backend", s.posture.Backend, "posture", s.posture.Posture, "python", s.posture.Python.Version)
	if _, err := unix.IoctlGetTermios(int(os.Stdin.Fd()), unix.TCGETS); err == nil {
		// A person at a terminal, not a client: say what this waits for.
		fmt.Fprintln(s.stderr, "pysandbox: serve speaks MCP (JSON-RPC) on stdin and stdout, for an MCP client to start it: see pysandbox setup CLIENT, or try pysandbox run FILE. Ctrl-D or Ctrl-C ends it.")
	}
	// Run returns nil on a clean EOF from the client.
	// The client goes away (it closes stdin: it quits, or restarts), or
	// the server is told to stop (SIGTERM, SIGINT): either way the
	// sessions are paused, to be resumed by the next server on this state
	// directory, which is the next one this client starts. On a signal
	// the server keeps serving meanwhile, so that a run in flight, which
	// the drain interrupts at --drain-timeout, still gets its reply.
	runCtx, stopRun := context.WithCancel(context.Background())
	defer stopRun()
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		select {
		case <-s.ctx.Done():
			s.rep.draining.Store(true)
			s.pauseAll(time.Now().Add(s.rep.drainFor))
			stopRun()
		case <-runCtx.Done():
		}
	}()
	err := s.srv.Run(runCtx, tools.StdioTransport(os.Stdin, os.Stdout))
	if s.ctx.Err() != nil {
		<-drained
		return nil
	}
	stopRun()
	<-drained
	s.rep.draining.Store(true)
	s.pauseAll(time.Now().Add(s.rep.drainFor))
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// reloadPolicy replaces the policy when the server gets SIGHUP. A file
// that does not parse changes nothing: the policy in force stays, and the
// error is logged. A new policy is recorded in the audit log (by digest)
// before any call runs under it.
func reloadPolicy(ctx context.Context, hup <-chan os.Signal, path string, toolNames []string, w *audit.Writer, current *atomic.Pointer[policy.Policy], updates chan<- *policy.Policy, log *slog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		}
		pol, err := policy.Load(path, toolNames)
		if err != nil {
			log.Error("policy reload refused; the policy in force stays", "err", err)
			continue
		}
		if w != nil {
			if err := w.Append(&audit.Record{Event: audit.EventPolicy, Detail: map[string]string{"policy": pol.Source, "policy_sha256": pol.SHA256}}); err != nil {
				log.Error("policy reload refused: the audit log cannot record it", "err", err)
				continue
			}
		}
		current.Store(pol)
		select {
		case updates <- pol:
		case <-ctx.Done():
			return
		}
		logPolicy(log, pol, toolNames)
	}
}

// reloadTokens reads every token file again when the server gets SIGHUP.
// A removed token stops opening anything from the next request on, and
// a removed operator's console sessions end. A file that does not parse,
// or a token in two files, changes nothing: the tokens in force stay, and
// the error is logged.
func reloadTokens(ctx context.Context, hup <-chan os.Signal, keys *httpserver.Keyring, w *audit.Writer, log *slog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		}
		warnings, err := keys.Reload()
		if err != nil {
			log.Error("token reload refused; the tokens in force stay", "err", err)
			continue
		}
		for _, warning := range warnings {
			log.Warn(warning)
		}
		names := keys.Names()
		log.Info("tokens reloaded", "agents", names["agents"], "operators", names["operators"], "metrics", names["metrics"])
		// Unlike a policy, new tokens are in force before the record is
		// written: a revocation must not wait on the audit log.
		if w != nil {
			if err := w.Append(&audit.Record{Event: "tokens", Detail: names}); err != nil {
				log.Error("tokens reloaded, but the audit log cannot record it", "err", err)
			}
		}
	}
}

// logPolicy says at startup what the policy does, so an operator can see
// that the file they meant is in force.
func logPolicy(log *slog.Logger, pol *policy.Policy, names []string) {
	var allow, deny, approve []string
	upstream := slices.ContainsFunc(names, func(n string) bool { return strings.HasSuffix(n, policy.UpstreamPattern("")) })
	for _, name := range names {
		if name == "list_tools_in_sandbox" && !upstream {
			continue // offered only with --upstream
		}
		switch pol.Decide(name).Action {
		case policy.Allow:
			allow = append(allow, name)
		case policy.Deny:
			deny = append(deny, name)
		case policy.Approve:
			approve = append(approve, name)
		}
	}
	log.Info("policy", "source", pol.Source, "allow", strings.Join(allow, ","), "approve", strings.Join(approve, ","), "deny", strings.Join(deny, ","),
		"package_rules", !pol.Packages.Empty())
	if len(allow) == 0 && len(approve) == 0 && len(names) > 0 {
		// A policy file with only a network section is the usual way in:
		// without a default it denies every tool it does not list.
		log.Warn("the policy allows no tool: every call will be refused and tools/list is empty. A policy denies the tools it does not list unless it says default: allow; add that, or list the tools", "source", pol.Source)
	}
	// Rules that parse but can never take effect: most likely not what
	// the policy's author meant.
	for _, w := range pol.Warnings {
		log.Warn("policy rule that never takes effect", "source", pol.Source, "warning", w)
	}
}

// upstreamPatterns are the names under which a policy may name the
// upstream servers' tools (SERVER.*, and through it SERVER.TOOL).
func upstreamPatterns(cfg *upstream.Config) []string {
	var out []string
	for _, sc := range cfg.Servers {
		out = append(out, policy.UpstreamPattern(sc.Name))
	}
	return out
}

// sdkLogger is log for the MCP SDK: warnings and errors only. Its
// informational lines (three for every sessionless request) drown the
// server's own, and they name every MCP session id, which on a server
// without tokens is enough to use that connection's sessions.
func sdkLogger(log *slog.Logger) *slog.Logger {
	return slog.New(atLeast{log.Handler(), slog.LevelWarn})
}

// atLeast passes on the records of h at level min and above.
type atLeast struct {
	slog.Handler
	min slog.Level
}

func (a atLeast) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= a.min && a.Handler.Enabled(ctx, l)
}

// Handle drops the SDK's report of its own Run ending because the server
// stopped it (SIGTERM, SIGINT): that is the server's plan, logged by the
// server in its own words, not an error.
func (a atLeast) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "server run cancelled" {
		return nil
	}
	return a.Handler.Handle(ctx, r)
}

func (a atLeast) WithAttrs(attrs []slog.Attr) slog.Handler {
	return atLeast{a.Handler.WithAttrs(attrs), a.min}
}

func (a atLeast) WithGroup(name string) slog.Handler {
	return atLeast{a.Handler.WithGroup(name), a.min}
}
