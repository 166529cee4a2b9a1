package cli

import (
	"context"
	"crypto/tls"
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

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/activity"
	"github.com/pysandbox/pysandbox/internal/audit"
	"github.com/pysandbox/pysandbox/internal/console"
	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/govern"
	"github.com/pysandbox/pysandbox/internal/httpserver"
	"github.com/pysandbox/pysandbox/internal/interp"
	"github.com/pysandbox/pysandbox/internal/metrics"
	"github.com/pysandbox/pysandbox/internal/policy"
	"github.com/pysandbox/pysandbox/internal/profiles"
	"github.com/pysandbox/pysandbox/internal/pydist"
	"github.com/pysandbox/pysandbox/internal/quota"
	"github.com/pysandbox/pysandbox/internal/tools"
	"github.com/pysandbox/pysandbox/internal/tracing"
	"github.com/pysandbox/pysandbox/internal/upstream"
)

// closers are what to close, in the order it was opened; close closes
// it in reverse, as defers would.
type closers []func()

func (c *closers) add(f func()) { *c = append(*c, f) }

func (c *closers) close() {
	for i := len(*c) - 1; i >= 0; i-- {
		(*c)[i]()
	}
	*c = nil
}

// server is a serve's parts, built by assemble in order, each with a
// closer; run serves with them and close closes them, last built first.
type server struct {
	cfg     *ServeConfig
	o       options // cfg's shared flags, with the policy's hooks
	stderr  io.Writer
	closers closers

	log       *slog.Logger
	tlsConfig *tls.Config
	keys      *httpserver.Keyring
	profs     []tools.Profile
	native    bool
	toolNames []string
	upCfg     *upstream.Config
	pol       *policy.Policy
	// current is the policy in force; SIGHUP replaces it.
	current atomic.Pointer[policy.Policy]
	// ctx ends on SIGINT or SIGTERM.
	ctx      context.Context
	eng      *engine.Engine
	posture  *engine.Posture
	quotas   *quota.Quotas
	sh       *shared
	rep      *replica
	sessions *engine.Sessions
	gov      tools.Governance
	ups      *upstream.Manager
	console  http.Handler
	// srv serves the callers; internal, the other replicas.
	srv, internal *mcp.Server
	// pyAudit records the installs of managed interpreters once the
	// audit log is open (the engine that makes them starts before it).
	pyAudit atomic.Pointer[audit.Writer]
	// stateNote says where paused sessions are kept, or why they are not.
	stateNote string
}

// assemble builds the server cfg (validated) describes, part by part. On
// an error it closes what it had built, and returns the error.
func assemble(cfg *ServeConfig, stderr io.Writer) (*server, error) {
	s := &server{cfg: cfg, o: *cfg.options, stderr: stderr}
	for _, step := range []func() error{
		s.openLog,
		s.loadTLS,
		s.openKeys,
		s.startTracing,
		s.warnPlainTokens,
		// The upstream servers' list and then the policy are read before
		// anything starts: a server with a broken policy must not start
		// at all, not even its sandboxes. The policy may name the
		// upstreams' tools.
		s.loadProfiles,
		s.loadUpstreams,
		s.loadPolicy,
		s.watchSignals,
		s.routePythonEvents,
		s.startEngine,
		s.openStore,
		s.joinCluster,
		s.openSessions,
		s.buildGovernance,
		s.openAudit,
		s.watchPolicy,
		s.watchTokens,
		s.startUpstreams,
		s.openConsole,
		s.newToolServers,
	} {
		if err := step(); err != nil {
			s.close()
			return nil, err
		}
	}
	return s, nil
}

// close closes every part, last built first.
func (s *server) close() { s.closers.close() }

func (s *server) http() bool { return s.cfg.HTTP != "" }

func (s *server) openLog() (err error) {
	s.log, err = s.o.logger(s.stderr)
	return err
}

func (s *server) loadTLS() error {
	if s.cfg.TLSCert == "" {
		return nil
	}
	cert, err := tls.LoadX509KeyPair(s.cfg.TLSCert, s.cfg.TLSKey)
	if err != nil {
		return fmt.Errorf("--tls-cert/--tls-key: %w", err)
	}
	s.tlsConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	return nil
}

// openKeys reads every token file together: a bad one, or a token in two
// of them, stops the server. SIGHUP reads them again (watchTokens).
func (s *server) openKeys() error {
	keys, warnings, err := httpserver.OpenKeyring(httpserver.TokenFiles{Agents: s.cfg.AuthTokenFile, Operators: s.cfg.OperatorTokenFile, Metrics: s.cfg.MetricsTokenFile})
	if err != nil {
		return err
	}
	s.keys = keys
	for _, w := range warnings {
		s.log.Warn(w)
	}
	return nil
}

// startTracing sends OpenTelemetry traces of the tool calls when
// OTEL_EXPORTER_OTLP_ENDPOINT is set; nothing otherwise.
func (s *server) startTracing() error {
	stopTracing, err := tracing.Setup(context.Background(), version)
	if err != nil {
		return err
	}
	s.closers.add(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		stopTracing(ctx)
	})
	if tracing.Enabled() {
		s.log.Info("sending OpenTelemetry traces of tool calls over OTLP/HTTP")
	}
	return nil
}

func (s *server) warnPlainTokens() error {
	if host, _, _ := net.SplitHostPort(s.cfg.HTTP); s.keys.Agents != nil && s.tlsConfig == nil && !isLoopback(host) {
		s.log.Warn("bearer tokens travel in clear text over plain HTTP on a non-loopback address; use --tls-cert/--tls-key or a TLS-terminating proxy")
	}
	return nil
}

func (s *server) loadProfiles() error {
	profs, native, err := s.cfg.Profiles.selectProfiles()
	if err != nil {
		return usageError{err}
	}
	s.profs, s.native, s.toolNames = profs, native, profiles.ToolNames(profs, native)
	return nil
}

func (s *server) loadUpstreams() error {
	if s.cfg.Upstream == "" {
		return nil
	}
	upCfg, err := upstream.Load(s.cfg.Upstream)
	if err != nil {
		return err
	}
	for _, w := range upCfg.Warnings {
		s.log.Warn("upstream servers", "file", s.cfg.Upstream, "warning", w)
	}
	s.upCfg = upCfg
	s.toolNames = append(slices.Clip(s.toolNames), upstreamPatterns(upCfg)...)
	return nil
}

// loadPolicy reads the policy, and gives the engine its network and
// package rules, which follow the policy in force.
func (s *server) loadPolicy() error {
	s.pol = policy.AllowAll()
	if s.cfg.Policy != "" {
		pol, err := policy.Load(s.cfg.Policy, s.toolNames)
		if err != nil {
			return err
		}
		s.pol = pol
		if pol.Network != nil {
			s.o.netRules = func() *policy.NetworkRules {
				if n := s.current.Load().Network; n != nil {
					return n
				}
				// A reload that drops the section drops the network.
				return &policy.NetworkRules{Limits: policy.DefaultNetLimits}
			}
		}
		s.o.checkPackage = func(name string, requested bool) error {
			rules := s.current.Load().Packages
			if requested {
				return rules.Check(name)
			}
			return rules.CheckInstalled(name)
		}
		s.o.checkPython = func(version string) error {
			return s.current.Load().Python.Check(version)
		}
	}
	s.current.Store(s.pol)
	return nil
}

func (s *server) watchSignals() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	s.ctx = ctx
	s.closers.add(stop)
	return nil
}

// routePythonEvents sends the installs and removals of managed
// interpreters to the audit log, once it is open, and to the log.
func (s *server) routePythonEvents() error {
	s.o.onPython = func(e pydist.Event) {
		switch {
		case e.Action == "install" && e.Outcome == "installed":
			s.log.Info("python installed", "version", e.Version, "url", e.URL, "bytes", e.Bytes, "took", e.Duration.Round(time.Millisecond))
		case e.Outcome != "installed" && e.Outcome != "removed":
			s.log.Warn("python "+e.Action+" "+e.Outcome, "version", e.Version, "url", e.URL, "err", e.Error)
		}
		if w := s.pyAudit.Load(); w != nil {
			if err := w.Append(pythonRecord(e)); err != nil {
				s.log.Error("audit log: python record", "err", err)
			}
		}
	}
	return nil
}

// startEngine starts the engine and measures its posture before taking
// any request: a server whose sandbox does not work refuses to start
// instead of running code with less isolation than it claims.
func (s *server) startEngine() error {
	eng, release, err := s.o.engine(s.ctx, s.log)
	if err != nil {
		return err
	}
	s.eng = eng
	s.closers.add(release)
	if err := s.current.Load().Python.Check(eng.Config().Python.Version); err != nil {
		s.log.Warn("the policy refuses the default interpreter: every run that names no python_version will be refused", "python", eng.Config().Python.Version, "err", err)
	}
	s.posture = eng.Measure(s.ctx, interp.Discover(s.ctx))
	if !s.posture.Usable() {
		return fmt.Errorf("the %s sandbox does not work here:\n  - %s\nrun 'pysandbox check' for the full report", s.posture.Backend, strings.Join(s.posture.Problems, "\n  - "))
	}
	if s.posture.Posture != "sandboxed" {
		s.log.Warn("UNSANDBOXED: --sandbox none runs code directly on this machine with the server's privileges")
	}
	for _, p := range s.posture.Problems {
		s.log.Warn("sandbox", "problem", p)
	}
	return nil
}

// openStore sets the per-caller quotas and opens the state shared with
// other replicas (none without --store).
func (s *server) openStore() error {
	qlim := s.cfg.Quotas.limits(s.http(), s.o.maxConcurrent, s.o.maxQueue, s.cfg.MaxSessions)
	s.quotas = quota.New(quotaFunc(qlim, &s.current))
	sh, err := s.cfg.Store.open(s.ctx, s.log)
	if err != nil {
		return err
	}
	s.sh = sh
	s.closers.add(sh.close)
	return nil
}

func (s *server) joinCluster() error {
	rep, err := s.cfg.Replica.join(s.ctx, s.sh, s.log)
	if err != nil {
		return err
	}
	s.rep = rep
	s.closers.add(rep.leave)
	return nil
}

// openSessions opens the sessions; every session's processes, cgroups and
// files go when the server does.
func (s *server) openSessions() error {
	snaps, err := s.openState()
	if err != nil {
		return err
	}
	s.sessions = s.eng.NewSessions(engine.SessionConfig{
		Snapshots:    snaps,
		IDSuffix:     s.rep.sessionSuffix(),
		Draining:     s.rep.draining.Load,
		MaxSessions:  s.cfg.MaxSessions,
		DefaultTTL:   time.Duration(s.cfg.SessionTTL),
		MaxTTL:       time.Duration(s.cfg.MaxSessionTTL),
		MemoryBudget: int64(s.cfg.SessionsMemory),
		OwnerLimit:   s.quotas.SessionLimit,
	})
	s.closers.add(s.sessions.Shutdown)
	// A replica takes the snapshots of others that stop, and hands its
	// own over when it stops (internal/cli/handoff.go).
	s.rep.attach(s.sessions, int64(s.cfg.State.maxBytes), time.Duration(s.cfg.State.pausedTTL), s.log)
	return nil
}

func (s *server) buildGovernance() error {
	s.gov = newGovernance(s.pol, s.sessions, s.eng, s.sh)
	return nil
}

// newGovernance is what governs the tool calls: the policy, the metrics,
// and the limiter, approval nonces and key shared with other replicas.
// The audit log, the policy's updates and the console's activity are
// added to it afterwards.
func newGovernance(pol *policy.Policy, sessions *engine.Sessions, eng *engine.Engine, sh *shared) tools.Governance {
	gov := tools.Governance{
		Policy:     pol,
		FactsCache: govern.DefaultFactsCache,
		Metrics: metrics.New(metrics.Gauges{
			Sessions: func() int { return len(sessions.List()) },
			Queued:   eng.Waiting,
			Running:  eng.Running,
		}),
	}
	sh.apply(&gov)
	return gov
}

// openAudit opens the audit log and writes its start record, which ties
// the calls that follow to the policy in force, by its digest.
func (s *server) openAudit() error {
	if s.cfg.AuditLog == "" {
		return nil
	}
	w, err := audit.Open(s.cfg.AuditLog, audit.Options{MaxSize: int64(s.cfg.AuditMaxSize), SyncEach: s.cfg.AuditSyncEach})
	if err != nil {
		return err
	}
	s.closers.add(func() {
		// The head hash, logged somewhere other than the file, is what
		// shows later that no records were cut from the end or the
		// whole chain rewritten.
		seq, head := w.Head()
		s.log.Info("audit log closed", "file", s.cfg.AuditLog, "records", seq, "head_sha256", head)
		w.Close()
	})
	if err := w.Append(&audit.Record{Event: "start", Detail: s.startDetail()}); err != nil {
		return err
	}
	if s.rep.cl != nil {
		// Its head goes to the shared store now and then and when it
		// stops (before the log closes: closers run last first).
		s.closers.add(anchorAudit(s.sh.store, s.rep.cl.Self().Name, w, s.log))
	}
	s.gov.Audit = w
	s.pyAudit.Store(w)
	return nil
}

// startDetail is the audit log's start record.
func (s *server) startDetail() map[string]string {
	transport := "stdio"
	if s.http() {
		transport = "http"
	}
	detail := map[string]string{
		"version": version, "transport": transport, "backend": s.posture.Backend, "posture": s.posture.Posture,
		"policy": s.pol.Source, "policy_sha256": s.pol.SHA256,
	}
	if s.rep.cl != nil {
		// Each replica keeps a chain of its own; its start records say
		// whose it is.
		detail["replica"], detail["incarnation"] = s.rep.cl.Self().Name, s.rep.cl.Self().Incarnation
	}
	return detail
}

// watchPolicy says what the policy does, and reloads it on SIGHUP.
func (s *server) watchPolicy() error {
	logPolicy(s.log, s.pol, s.toolNames)
	if s.cfg.Policy == "" {
		return nil
	}
	updates := make(chan *policy.Policy)
	s.gov.Updates = updates
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	s.closers.add(func() { signal.Stop(hup) })
	go reloadPolicy(s.ctx, hup, s.cfg.Policy, s.toolNames, s.gov.Audit, &s.current, updates, s.log)
	return nil
}

// watchTokens reloads the token files on SIGHUP. A channel of its own:
// every channel notified of SIGHUP gets it, so one signal reloads the
// policy and the tokens.
func (s *server) watchTokens() error {
	if s.cfg.AuthTokenFile == "" && s.cfg.OperatorTokenFile == "" && s.cfg.MetricsTokenFile == "" {
		return nil
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	s.closers.add(func() { signal.Stop(hup) })
	go reloadTokens(s.ctx, hup, s.keys, s.gov.Audit, s.log)
	return nil
}

// startUpstreams connects the upstream servers in the background: one
// that is slow or fails to start is a warning, and the server serves
// meanwhile. They are this process's children and stop with it.
func (s *server) startUpstreams() error {
	if s.upCfg == nil {
		return nil
	}
	s.ups = upstream.Start(s.upCfg, upstream.Options{Log: s.log, ClientName: "pysandbox", ClientVersion: version})
	s.closers.add(func() { s.ups.Close() })
	return nil
}

func (s *server) openConsole() error {
	if !s.cfg.Console {
		return nil
	}
	act := activity.New()
	s.gov.Activity = act
	if s.gov.Limiter == nil {
		// One limiter, shared with the console, which shows its counts.
		s.gov.Limiter = policy.NewLimiter(nil)
	}
	con, err := console.New(console.Config{Operators: s.keys.Operators, Activity: act, Sessions: s.sessions, Engine: s.eng, AuditPath: s.cfg.AuditLog,
		Audit: s.gov.Audit, Policy: s.current.Load, Limiter: s.gov.Limiter, Log: s.log})
	if err != nil {
		return err
	}
	s.console = con.Handler()
	return nil
}

func (s *server) newToolServers() error {
	s.srv, s.internal = tools.NewServers(tools.Options{Engine: s.eng, Posture: s.posture, Sessions: s.sessions, StateNote: s.stateNote,
		MaxUploadBytes: int64(s.cfg.MaxUpload), MaxReplyBytes: int64(s.cfg.MaxReply), MaxStreamReplyBytes: int64(s.cfg.MaxReplyOutput), Quotas: s.quotas, Governance: s.gov,
		Network: s.o.proxy, Upstreams: s.ups, Cluster: s.rep.cl, Forwarder: s.rep.fwd, Profiles: s.profs, NoNative: !s.native,
		Logger: s.log, SDKLogger: sdkLogger(s.log)})
	return nil
}
