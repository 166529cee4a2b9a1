package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/pysandbox/pysandbox/internal/activity"
	"github.com/pysandbox/pysandbox/internal/audit"
	"github.com/pysandbox/pysandbox/internal/console"
	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/httpserver"
	"github.com/pysandbox/pysandbox/internal/interp"
	"github.com/pysandbox/pysandbox/internal/metrics"
	"github.com/pysandbox/pysandbox/internal/policy"
	"github.com/pysandbox/pysandbox/internal/profiles"
	"github.com/pysandbox/pysandbox/internal/quota"
	"github.com/pysandbox/pysandbox/internal/tools"
	"github.com/pysandbox/pysandbox/internal/tracing"
	"github.com/pysandbox/pysandbox/internal/upstream"
)

func serve(args []string, stderr io.Writer) error {
	fs, o := newFlagSet("serve", "serve [--http ADDR] [flags]", stderr)
	httpAddr := fs.String("http", "", "serve MCP over streamable HTTP on this address (e.g. 127.0.0.1:8080) instead of stdio; a non-loopback address needs --auth-token-file")
	maxSessions := fs.Int("max-sessions", 8, "sessions open at once")
	sessionTTL := duration(10 * time.Minute)
	fs.Var(&sessionTTL, "session-ttl", "idle time after which a session expires, when create_session names none")
	maxSessionTTL := duration(24 * time.Hour)
	fs.Var(&maxSessionTTL, "max-session-ttl", "largest ttl_seconds create_session may ask for")
	sessionsMemory := size(4 << 30)
	fs.Var(&sessionsMemory, "sessions-memory", "memory budget of all sessions together (each may use --memory)")
	maxUpload := size(16 << 20)
	fs.Var(&maxUpload, "max-upload", "largest file upload_file accepts")
	maxReply := size(tools.DefaultMaxReply)
	fs.Var(&maxReply, "max-reply", "largest tool result on the wire, JSON escapes included: figures beyond it become resource links and output is cut further (clients drop connections at about 10MiB)")
	upstreamFile := fs.String("upstream", "", "MCP servers whose tools Python code may call (import tools), in the mcpServers JSON format of Claude Desktop, Cursor and VS Code: {\"mcpServers\": {\"NAME\": {\"command\": ..., \"args\": [...], \"env\": {...}} or {\"url\": ..., \"headers\": {...}}}}. They run as children of this server, with its credentials; the policy names their tools NAME.TOOL")
	policyFile := fs.String("policy", "", "policy file (JSON or YAML): which tools are allowed, denied or need the user's approval, rate limits, package rules; default: everything allowed. SIGHUP reloads it (a broken file changes nothing)")
	auditLog := fs.String("audit-log", "", "append a tamper-evident record of every tool call to this file (JSON lines, hash-chained; check it with 'pysandbox audit verify')")
	auditSyncEach := fs.Bool("audit-sync-each", false, "make each audit record durable (fdatasync) before its call's result is returned, rather than in the background right after (costs a disk flush per call)")
	auditMaxSize := size(100 << 20)
	fs.Var(&auditMaxSize, "audit-max-size", "rotate the audit log to FILE.1, FILE.2, ... when it would grow past this size (the chain continues across files); 0 never rotates")
	tokenFile := fs.String("auth-token-file", "", "require a bearer token on /mcp (and /metrics, unless --metrics-token-file): a file of 'NAME TOKEN' lines; NAME becomes the caller's identity in the audit log and rate limits. SIGHUP rereads every token file (a broken one changes nothing)")
	tlsCert := fs.String("tls-cert", "", "with --http: serve HTTPS with this PEM certificate (chain) file; needs --tls-key")
	tlsKey := fs.String("tls-key", "", "with --http: the PEM private key of --tls-cert")
	consoleOn := fs.Bool("console", false, "with --http: serve the operator console at /console (live runs and sessions, kill, the audit trail, the policy); needs --operator-token-file")
	operatorTokens := fs.String("operator-token-file", "", "with --console: the operators' tokens ('NAME TOKEN' lines, as --auth-token-file); an agent's token never opens the console, and an operator's never runs code. SIGHUP reloads it: a removed operator's console sessions end")
	metricsTokens := fs.String("metrics-token-file", "", "with --http: the tokens that open /metrics ('NAME TOKEN' lines, as --auth-token-file) and nothing else; with it, agents' tokens no longer open /metrics. SIGHUP reloads it")
	insecure := fs.Bool("insecure-no-auth", false, "allow --http on a non-loopback address without --auth-token-file: ANYONE who can reach the port can run code")
	pflags := addProfileFlags(fs, o)
	qflags := addQuotaFlags(fs)
	sflags := addStoreFlags(fs)
	rflags := addReplicaFlags(fs)
	var allowedHosts listFlag
	fs.Var(&allowedHosts, "allowed-host", "with --http: a further Host name clients may use (e.g. sandbox.example.com behind a proxy); repeat or separate with commas. Loopback names and the listen address are always allowed")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("serve takes no arguments, got %q", fs.Args())}
	}
	if *httpAddr == "" && (*tokenFile != "" || *metricsTokens != "" || *insecure || len(allowedHosts) > 0 || *tlsCert != "" || *tlsKey != "") {
		return usageError{errors.New("--auth-token-file, --metrics-token-file, --insecure-no-auth, --allowed-host, --tls-cert and --tls-key apply to --http only")}
	}
	if *consoleOn && (*httpAddr == "" || *operatorTokens == "") || !*consoleOn && *operatorTokens != "" {
		return usageError{errors.New("--console needs --http and --operator-token-file (and --operator-token-file goes with --console)")}
	}
	if (*tlsCert == "") != (*tlsKey == "") {
		return usageError{errors.New("--tls-cert and --tls-key go together")}
	}
	var tlsConfig *tls.Config
	if *tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(*tlsCert, *tlsKey)
		if err != nil {
			return fmt.Errorf("--tls-cert/--tls-key: %w", err)
		}
		tlsConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	// Every token file, read together: a bad one, or a token in two of
	// them, stops the server. SIGHUP reads them again (below).
	keys, keyWarnings, err := httpserver.OpenKeyring(httpserver.TokenFiles{Agents: *tokenFile, Operators: *operatorTokens, Metrics: *metricsTokens})
	if err != nil {
		return err
	}
	tokens := keys.Agents
	if *httpAddr != "" {
		if err := checkExposure(*httpAddr, tokens != nil, *insecure); err != nil {
			return usageError{err}
		}
	}
	log, err := o.logger(stderr)
	if err != nil {
		return err
	}
	for _, w := range keyWarnings {
		log.Warn(w)
	}
	// OpenTelemetry traces of the tool calls, when OTEL_EXPORTER_OTLP_ENDPOINT
	// is set; nothing otherwise.
	stopTracing, err := tracing.Setup(context.Background(), version)
	if err != nil {
		return err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		stopTracing(ctx)
	}()
	if tracing.Enabled() {
		log.Info("sending OpenTelemetry traces of tool calls over OTLP/HTTP")
	}
	if host, _, _ := net.SplitHostPort(*httpAddr); tokens != nil && tlsConfig == nil && !isLoopback(host) {
		log.Warn("bearer tokens travel in clear text over plain HTTP on a non-loopback address; use --tls-cert/--tls-key or a TLS-terminating proxy")
	}
	// The upstream servers' list and then the policy are read first: a
	// server with a broken policy must not start at all, not even its
	// sandboxes. The policy may name the upstreams' tools.
	profs, native, err := pflags.selectProfiles()
	if err != nil {
		return usageError{err}
	}
	toolNames := profiles.ToolNames(profs, native)
	var upCfg *upstream.Config
	if *upstreamFile != "" {
		if upCfg, err = upstream.Load(*upstreamFile); err != nil {
			return err
		}
		for _, w := range upCfg.Warnings {
			log.Warn("upstream servers", "file", *upstreamFile, "warning", w)
		}
		toolNames = append(slices.Clip(toolNames), upstreamPatterns(upCfg)...)
	}
	pol := policy.AllowAll()
	// current is the policy in force; SIGHUP replaces it (see below).
	var current atomic.Pointer[policy.Policy]
	if *policyFile != "" {
		if pol, err = policy.Load(*policyFile, toolNames); err != nil {
			return err
		}
		if pol.Network != nil {
			o.netRules = func() *policy.NetworkRules {
				if n := current.Load().Network; n != nil {
					return n
				}
				// A reload that drops the section drops the network.
				return &policy.NetworkRules{Limits: policy.DefaultNetLimits}
			}
		}
		o.checkPackage = func(name string, requested bool) error {
			rules := current.Load().Packages
			if requested {
				return rules.Check(name)
			}
			return rules.CheckInstalled(name)
		}
	}
	current.Store(pol)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	eng, release, err := o.engine(ctx, log)
	if err != nil {
		return err
	}
	defer release()
	// Measure the posture before taking any request: a server whose
	// sandbox does not work refuses to start instead of running code
	// with less isolation than it claims.
	posture := eng.Measure(ctx, interp.Discover(ctx))
	if !posture.Usable() {
		return fmt.Errorf("the %s sandbox does not work here:\n  - %s\nrun 'pysandbox check' for the full report", posture.Backend, strings.Join(posture.Problems, "\n  - "))
	}
	if posture.Posture != "sandboxed" {
		log.Warn("UNSANDBOXED: --sandbox none runs code directly on this machine with the server's privileges")
	}
	for _, p := range posture.Problems {
		log.Warn("sandbox", "problem", p)
	}
	if *maxSessions < 1 || sessionTTL <= 0 || maxSessionTTL < sessionTTL || maxUpload < 1 || auditMaxSize < 0 || maxReply < 256<<10 {
		return usageError{fmt.Errorf("--max-sessions must be at least 1, --session-ttl positive and at most --max-session-ttl, --max-upload positive, --audit-max-size not negative, --max-reply at least 256KiB")}
	}
	qlim, err := qflags.limits(*httpAddr != "", o.maxConcurrent, o.maxQueue, *maxSessions)
	if err != nil {
		return usageError{err}
	}
	quotas := quota.New(quotaFunc(qlim, &current))
	sh, err := sflags.open(ctx, log)
	if err != nil {
		return err
	}
	defer sh.close()
	rep, err := rflags.join(ctx, sh, *httpAddr, log)
	if err != nil {
		return err
	}
	defer rep.leave()
	sessions := eng.NewSessions(engine.SessionConfig{
		IDSuffix:     rep.sessionSuffix(),
		Draining:     rep.draining.Load,
		MaxSessions:  *maxSessions,
		DefaultTTL:   time.Duration(sessionTTL),
		MaxTTL:       time.Duration(maxSessionTTL),
		MemoryBudget: int64(sessionsMemory),
		OwnerLimit:   quotas.SessionLimit,
	})
	// Every session's processes, cgroups and files go when the server does.
	defer sessions.Shutdown()

	transport := "stdio"
	if *httpAddr != "" {
		transport = "http"
	}
	gov := tools.Governance{
		Policy: pol,
		Metrics: metrics.New(metrics.Gauges{
			Sessions: func() int { return len(sessions.List()) },
			Queued:   eng.Waiting,
			Running:  eng.Running,
		}),
	}
	sh.apply(&gov)
	if *auditLog != "" {
		w, err := audit.Open(*auditLog, audit.Options{MaxSize: int64(auditMaxSize), SyncEach: *auditSyncEach})
		if err != nil {
			return err
		}
		defer func() {
			// The head hash, logged somewhere other than the file, is what
			// shows later that no records were cut from the end or the
			// whole chain rewritten.
			seq, head := w.Head()
			log.Info("audit log closed", "file", *auditLog, "records", seq, "head_sha256", head)
			w.Close()
		}()
		// The start record ties the calls that follow to the policy in
		// force, by its digest.
		detail := map[string]string{
			"version": version, "transport": transport, "backend": posture.Backend, "posture": posture.Posture,
			"policy": pol.Source, "policy_sha256": pol.SHA256,
		}
		if rep.cl != nil {
			// Each replica keeps a chain of its own; its start records
			// say whose it is.
			detail["replica"], detail["incarnation"] = rep.cl.Self().Name, rep.cl.Self().Incarnation
		}
		if err := w.Append(&audit.Record{Event: "start", Detail: detail}); err != nil {
			return err
		}
		if rep.cl != nil {
			// Its head goes to the shared store now and then and when it
			// stops (before the log closes: defers run last first).
			defer anchorAudit(sh.store, rep.cl.Self().Name, w, log)()
		}
		gov.Audit = w
	}
	logPolicy(log, pol, toolNames)
	if *policyFile != "" {
		updates := make(chan *policy.Policy)
		gov.Updates = updates
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
		go reloadPolicy(ctx, hup, *policyFile, toolNames, gov.Audit, &current, updates, log)
	}
	if *tokenFile != "" || *operatorTokens != "" || *metricsTokens != "" {
		// A channel of its own: every channel notified of SIGHUP gets it,
		// so one signal reloads the policy and the tokens.
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
		go reloadTokens(ctx, hup, keys, gov.Audit, log)
	}
	var ups *upstream.Manager
	if upCfg != nil {
		// They connect in the background: one that is slow or fails to
		// start is a warning, and the server serves meanwhile. They are
		// this process's children and stop with it.
		ups = upstream.Start(upCfg, upstream.Options{Log: log, ClientName: "pysandbox", ClientVersion: version})
		defer ups.Close()
	}
	var act *activity.Registry
	var consoleHandler http.Handler
	if *consoleOn {
		act = activity.New()
		gov.Activity = act
		if gov.Limiter == nil {
			// One limiter, shared with the console, which shows its counts.
			gov.Limiter = policy.NewLimiter(nil)
		}
		con, err := console.New(console.Config{Operators: keys.Operators, Activity: act, Sessions: sessions, Engine: eng, AuditPath: *auditLog,
			Audit: gov.Audit, Policy: current.Load, Limiter: gov.Limiter, Log: log})
		if err != nil {
			return err
		}
		consoleHandler = con.Handler()
	}
	srv, internal := tools.NewServers(tools.Options{Engine: eng, Posture: posture, Sessions: sessions, MaxUploadBytes: int64(maxUpload), MaxReplyBytes: int64(maxReply), Quotas: quotas, Governance: gov, Network: o.proxy, Upstreams: ups,
		Cluster: rep.cl, Forwarder: rep.fwd, Profiles: profs, NoNative: !native, Logger: log, SDKLogger: sdkLogger(log)})
	if *httpAddr == "" {
		log.Info("serving MCP on stdio", "backend", posture.Backend, "posture", posture.Posture, "python", posture.Python.Version)
		// Run returns nil on a clean EOF from the client.
		err := srv.Run(ctx, tools.StdioTransport(os.Stdin, os.Stdout))
		if ctx.Err() != nil {
			return nil
		}
		return err
	}

	ln, err := net.Listen("tcp", *httpAddr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	handler, err := httpserver.Handler(httpserver.Config{
		Server:       srv,
		Tokens:       tokens,
		Listen:       ln.Addr(),
		AllowedHosts: allowedHosts,
		Metrics:      gov.Metrics.Handler(),
		Health:       map[string]string{"backend": posture.Backend, "posture": posture.Posture},
		// Room for the largest upload in base64, plus JSON.
		MaxRequestBytes: int64(maxUpload)*4/3 + 1<<20,
		Logger:          sdkLogger(log),
		Cluster:         rep.cl,
		Ready:           func() bool { return !rep.draining.Load() },
		Console:         consoleHandler,
		Sessions:        qflags.mcp,
		MetricsTokens:   keys.Metrics,
	})
	if err != nil {
		ln.Close()
		return usageError{err}
	}
	ln, maxConns := httpserver.LimitConnections(ln)
	log.Debug("connections open at once", "max", maxConns)
	hs := &http.Server{Handler: rep.count(handler), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: httpserver.IdleTimeout, TLSConfig: tlsConfig, MaxHeaderBytes: 64 << 10}
	scheme := "http"
	if tlsConfig != nil {
		ln = tls.NewListener(ln, tlsConfig)
		scheme = "https"
	}
	auth := "none (loopback only)"
	switch {
	case tokens != nil:
		auth = "bearer tokens: " + strings.Join(tokens.Names(), ", ")
	case *insecure:
		auth = "NONE on a non-loopback address (--insecure-no-auth)"
	}
	log.Info("serving MCP over HTTP", "url", scheme+"://"+ln.Addr().String()+"/mcp", "auth", auth, "backend", posture.Backend, "posture", posture.Posture)
	rep.serveInternal(handler, internal, int64(maxUpload)*4/3+1<<20, log)
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	// SIGTERM: /readyz fails (the Service stops sending requests here), no
	// new session is taken, and runs in flight finish first. Then both
	// endpoints stop taking requests, and what a last request started
	// finishes before the audit log closes.
	rep.drain(eng, log)
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	internalDone := make(chan struct{})
	go func() { rep.shutdown(5 * time.Second); close(internalDone) }()
	err = hs.Shutdown(shutdown)
	<-internalDone
	rep.waitIdle(eng, 5*time.Second)
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
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
	for _, name := range names {
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
	// Rules that parse but can never take effect: most likely not what
	// the policy's author meant.
	for _, w := range pol.Warnings {
		log.Warn("policy rule that never takes effect", "source", pol.Source, "warning", w)
	}
}

// checkExposure refuses an address other machines could reach unless
// callers must authenticate, or the operator explicitly chose not to:
// anyone who can reach the port can run code.
func checkExposure(addr string, authenticated, insecure bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--http %q: want HOST:PORT such as 127.0.0.1:8080", addr)
	}
	if !authenticated && !insecure && !isLoopback(host) {
		return fmt.Errorf("--http %q: refusing a non-loopback address without authentication, because anyone who can reach it could run code; pass --auth-token-file FILE (lines of 'NAME TOKEN'), or --insecure-no-auth if something in front of this server authenticates callers", addr)
	}
	return nil
}

// isLoopback reports whether a listen host is reachable from this machine
// only.
func isLoopback(host string) bool {
	ip := net.ParseIP(host)
	return host == "localhost" || (ip != nil && ip.IsLoopback())
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

func (a atLeast) WithAttrs(attrs []slog.Attr) slog.Handler {
	return atLeast{a.Handler.WithAttrs(attrs), a.min}
}

func (a atLeast) WithGroup(name string) slog.Handler {
	return atLeast{a.Handler.WithGroup(name), a.min}
}
