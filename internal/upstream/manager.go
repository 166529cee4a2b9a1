package upstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// States of a server. A call to a server that is connecting waits for
// it (Await); one to a server that has failed is refused at once.
const (
	// StateConnecting: its first attempt, an attempt after a failure, or
	// the short pause before a server that worked and stopped is started
	// again (it is expected back, and its tools stay listed meanwhile).
	StateConnecting = "connecting"
	StateReady      = "ready"
	// StateFailed: its last attempt failed, and it waits its backoff
	// before the next (or, for an entry that cannot be used, for ever).
	StateFailed = "failed"
)

// Status is how one server stands.
type Status struct {
	Name  string
	State string // StateConnecting, StateReady, StateFailed
	// Error says why the server is not ready (its last failure while it
	// is connecting again) and, when it has failed, when it is tried
	// again.
	Error string
	// How is how it is reached (Describe): never secrets.
	How   string
	Tools int
}

// Options configure a Manager.
type Options struct {
	Log                       *slog.Logger
	ClientName, ClientVersion string
	// Wrap, when set, wraps each server's transport (tests log the wire).
	Wrap func(server string, tr mcp.Transport) mcp.Transport
	// ConnectTimeout bounds starting a server and listing its tools;
	// default 60 s (npx may fetch a package first).
	ConnectTimeout time.Duration
	// RestartDelay is the first wait before a server that failed or
	// stopped is started again; it doubles up to a minute. Default 1 s.
	RestartDelay time.Duration
	// ConnectWait bounds how long a call to a server that is connecting
	// waits for it (Await), and how long after Start the tools' catalog
	// waits for servers on their first attempt (Settle); default 30 s,
	// the run's default timeout: an agent that starts pysandbox and calls
	// at once must not fail for being early, and a server that takes
	// longer is better reported than waited for by every run.
	ConnectWait time.Duration
}

// Manager keeps the upstream servers connected.
type Manager struct {
	opts    Options
	log     *slog.Logger
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	servers []*server // by name
	byName  map[string]*server
	once    sync.Once
	started time.Time
}

// server is one upstream.
type server struct {
	m   *Manager
	cfg ServerConfig

	mu    sync.Mutex
	state string
	err   string
	// retry is when a failed server is tried again; zero when never.
	retry time.Time
	// changed is closed, and replaced, whenever state changes: Await
	// waits on it.
	changed chan struct{}
	cs      *mcp.ClientSession
	// tools are listed while the server is ready, and kept while it
	// reconnects after it worked; byName are the callable ones, set only
	// while it is ready.
	tools   []Tool // by name
	byName  map[string]*Tool
	settled chan struct{} // closed once the first attempt is over
	settle  sync.Once

	refresh chan struct{} // tools/list_changed arrived
	stderr  *tailWriter
	pid     int // a stdio server's process while connected (tests)
}

// Start connects to every server of cfg in the background and keeps them
// connected until Close. Stdio servers are children of this process.
func Start(cfg *Config, o Options) *Manager {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.ClientName == "" {
		o.ClientName = "pysandbox"
	}
	if o.ClientVersion == "" {
		o.ClientVersion = "dev"
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = time.Minute
	}
	if o.RestartDelay <= 0 {
		o.RestartDelay = time.Second
	}
	if o.ConnectWait <= 0 {
		o.ConnectWait = 30 * time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &Manager{opts: o, log: o.Log, ctx: ctx, cancel: cancel, byName: map[string]*server{}, started: time.Now()}
	for _, sc := range cfg.Servers {
		s := &server{m: m, cfg: sc, state: StateConnecting, changed: make(chan struct{}), settled: make(chan struct{}),
			refresh: make(chan struct{}, 1), stderr: &tailWriter{max: 2048}}
		m.servers = append(m.servers, s)
		m.byName[sc.Name] = s
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			s.run(ctx)
		}()
	}
	sort.Slice(m.servers, func(i, j int) bool { return m.servers[i].cfg.Name < m.servers[j].cfg.Name })
	return m
}

// WaitReady returns once every server is ready or has failed once, or
// when ctx is done.
func (m *Manager) WaitReady(ctx context.Context) {
	for _, s := range m.servers {
		select {
		case <-s.settled:
		case <-ctx.Done():
			return
		}
	}
}

// Settle waits until every server's first attempt to connect is over
// (it is ready or has failed once), until ConnectWait after Start at the
// latest, and until ctx ends. A listing of the tools taken right after
// startup calls it, so that it has the tools of servers still starting:
// the tools module takes its catalog once per run, and could not call a
// tool it did not list. The bound counts from Start, not from each call,
// so that a server that never answers initialize delays only the
// listings of its first ConnectWait, not those of its whole first
// attempt; servers retried after failing are not waited for, for the
// same reason, and servers reconnecting after they worked keep their
// tools listed meanwhile.
func (m *Manager) Settle(ctx context.Context) {
	ctx, cancel := context.WithDeadline(ctx, m.started.Add(m.opts.ConnectWait))
	defer cancel()
	m.WaitReady(ctx)
}

// Await waits while the server of full (SERVER.TOOL) is connecting, for
// at most Options.ConnectWait and until ctx ends. It returns nil once the
// server is ready, or when full names no configured server (a lookup
// says what is wrong then); ctx's error when ctx ended first; otherwise
// an error that says why its tools cannot be called: it has failed (why,
// and when it is tried again: a failed server is not waited for, its
// next attempt may be a minute away and fail the same way), or it is
// still connecting after the wait.
func (m *Manager) Await(ctx context.Context, full string) error {
	name, _, _ := strings.Cut(full, ".")
	s := m.byName[name]
	if s == nil {
		return nil
	}
	return s.await(ctx)
}

func (s *server) await(ctx context.Context) error {
	var timeout <-chan time.Time
	for {
		s.mu.Lock()
		state, changed := s.state, s.changed
		s.mu.Unlock()
		switch state {
		case StateReady:
			return nil
		case StateFailed:
			return s.unavailable(0)
		}
		if timeout == nil {
			t := time.NewTimer(s.m.opts.ConnectWait)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.m.ctx.Done():
			return fmt.Errorf("the upstream server %q is stopping with pysandbox", s.cfg.Name)
		case <-timeout:
			return s.unavailable(s.m.opts.ConnectWait)
		}
	}
}

// unavailable says why the server's tools cannot be called; waited is
// how long a call waited for it to connect.
func (s *server) unavailable(waited time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.state == StateFailed:
		return fmt.Errorf("the upstream server %q failed (%s); %s", s.cfg.Name, s.err, retryText(s.retry))
	case s.state == StateReady:
		// It came back after the caller looked: the caller may try again.
		return fmt.Errorf("the upstream server %q reconnected during the call", s.cfg.Name)
	case waited > 0 && s.err != "":
		return fmt.Errorf("the upstream server %q is still connecting after %s (its last attempt: %s)", s.cfg.Name, waited, s.err)
	case waited > 0:
		return fmt.Errorf("the upstream server %q is still connecting after %s", s.cfg.Name, waited)
	case s.err != "":
		return fmt.Errorf("the upstream server %q is connecting (its last attempt: %s)", s.cfg.Name, s.err)
	}
	return fmt.Errorf("the upstream server %q is connecting", s.cfg.Name)
}

// retryText says when a failed server is tried again.
func retryText(retry time.Time) string {
	if retry.IsZero() {
		return "it is not tried again until pysandbox restarts"
	}
	d := time.Until(retry).Round(time.Second)
	if d < time.Second {
		return "it is tried again within a second"
	}
	return fmt.Sprintf("it is tried again in %s", d)
}

// Close stops every server (a stdio server's process group is killed once
// its session is closed) and returns when they are gone.
func (m *Manager) Close() error {
	m.once.Do(func() {
		m.cancel()
		m.wg.Wait()
	})
	return nil
}

// Status reports each server, by name.
func (m *Manager) Status() []Status {
	out := make([]Status, 0, len(m.servers))
	for _, s := range m.servers {
		st := s.status()
		st.How, st.Tools = s.cfg.Describe(), s.toolCount()
		out = append(out, st)
	}
	return out
}

func (s *server) status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Status{Name: s.cfg.Name, State: s.state, Error: s.err}
	if s.state == StateFailed {
		// When it comes back is what an agent needs to know to decide
		// whether to wait.
		st.Error += "; " + retryText(s.retry)
	}
	return st
}

// setStateLocked changes the state and wakes the calls waiting on it.
func (s *server) setStateLocked(state string) {
	s.state = state
	close(s.changed)
	s.changed = make(chan struct{})
}

// run keeps the server connected until ctx ends.
func (s *server) run(ctx context.Context) {
	defer s.settle.Do(func() { close(s.settled) })
	log := s.m.log.With("upstream", s.cfg.Name)
	if s.cfg.Err != "" {
		s.fail(errors.New(s.cfg.Err), time.Time{})
		log.Warn("upstream server not started", "err", s.cfg.Err)
		return
	}
	delay := s.m.opts.RestartDelay
	for attempt := 1; ; attempt++ {
		err := s.session(ctx, log)
		if ctx.Err() != nil {
			return
		}
		wasReady := s.wasReady()
		if wasReady {
			// It worked until now: come back soon, whatever made it stop
			// (code in a run can make a server stop, e.g. with a result
			// beyond the SDK's 16 MiB frame, and must not be able to keep
			// it down for longer and longer).
			delay = s.m.opts.RestartDelay
			// It is expected back after a short pause: it counts as
			// connecting, so calls wait for it and its tools stay listed
			// (a run that took its catalog now can still call them).
			s.reconnecting(err)
		} else {
			s.fail(err, time.Now().Add(delay))
		}
		// Its stderr goes to the log only: it is the operator's to read,
		// not the agent's or the code's (it may print secrets).
		if attempt == 1 || wasReady {
			log.Warn("upstream server unavailable; its tools are not callable until it is back", "how", s.cfg.Describe(), "err", err, "stderr", s.stderr.tail(), "retry_in", delay)
		} else {
			log.Debug("upstream server still unavailable", "err", err, "stderr", s.stderr.tail(), "attempt", attempt, "retry_in", delay)
		}
		s.settle.Do(func() { close(s.settled) })
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(delay*2, time.Minute)
		s.mu.Lock()
		if s.state != StateConnecting {
			s.setStateLocked(StateConnecting)
		}
		s.retry = time.Time{}
		s.mu.Unlock()
	}
}

func (s *server) wasReady() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cs != nil
}

// fail records a failed attempt; retry is when the next begins (zero:
// never).
func (s *server) fail(err error, retry time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.err, s.retry, s.cs, s.tools, s.byName = err.Error(), retry, nil, nil, nil
	s.setStateLocked(StateFailed)
}

// reconnecting records that a server that worked stopped, and is to be
// started again shortly; its tools stay listed, not callable.
func (s *server) reconnecting(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.err, s.retry, s.cs, s.byName = err.Error(), time.Time{}, nil, nil
	s.setStateLocked(StateConnecting)
}

// session connects once, serves until the connection ends, and says why
// it ended.
func (s *server) session(ctx context.Context, log *slog.Logger) error {
	tr, cmd, err := s.transport()
	if err != nil {
		return err
	}
	if w := s.m.opts.Wrap; w != nil {
		tr = w(s.cfg.Name, tr)
	}
	client := mcp.NewClient(&mcp.Implementation{Name: s.m.opts.ClientName, Version: s.m.opts.ClientVersion}, &mcp.ClientOptions{
		// No roots, sampling or elicitation: an upstream gets nothing of
		// the agent's through this server.
		Capabilities: &mcp.ClientCapabilities{},
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			select {
			case s.refresh <- struct{}{}:
			default:
			}
		},
	})
	cctx, cancel := context.WithTimeout(ctx, s.m.opts.ConnectTimeout)
	defer cancel()
	cs, err := client.Connect(cctx, tr, nil)
	if err != nil {
		killGroup(cmd)
		if cctx.Err() != nil && ctx.Err() == nil {
			return fmt.Errorf("it did not answer initialize within %s (its stderr is in the server's log)", s.m.opts.ConnectTimeout)
		}
		return fmt.Errorf("start: %v (its stderr is in the server's log)", err)
	}
	if cmd != nil && cmd.Process != nil {
		s.mu.Lock()
		s.pid = cmd.Process.Pid
		s.mu.Unlock()
	}
	ended := make(chan error, 1)
	go func() { ended <- cs.Wait() }()
	stop := func() {
		cs.Close()
		<-ended
		killGroup(cmd)
	}
	tools, warns, err := s.list(cctx, cs)
	if err != nil {
		stop()
		return fmt.Errorf("list its tools: %v", err)
	}
	for _, w := range warns {
		log.Warn("upstream tool left out", "warning", w)
	}
	s.ready(cs, tools)
	log.Info("upstream server ready", "how", s.cfg.Describe(), "tools", len(tools))
	for {
		select {
		case <-ctx.Done():
			stop()
			return ctx.Err()
		case err := <-ended:
			killGroup(cmd)
			if err == nil {
				err = errors.New("the connection closed")
			}
			return fmt.Errorf("it stopped: %v (its stderr is in the server's log)", err)
		case <-s.refresh:
			lctx, cancel := context.WithTimeout(ctx, s.m.opts.ConnectTimeout)
			tools, warns, err := s.list(lctx, cs)
			cancel()
			if err != nil {
				log.Warn("upstream tools/list_changed: listing failed; the previous list stays", "err", err)
				continue
			}
			for _, w := range warns {
				log.Warn("upstream tool left out", "warning", w)
			}
			s.ready(cs, tools)
			log.Info("upstream tools changed", "tools", len(tools))
		}
	}
}

func (s *server) ready(cs *mcp.ClientSession, tools []Tool) {
	by := make(map[string]*Tool, len(tools))
	for i := range tools {
		by[tools[i].Name] = &tools[i]
	}
	s.mu.Lock()
	s.err, s.retry, s.cs, s.tools, s.byName = "", time.Time{}, cs, tools, by
	s.setStateLocked(StateReady)
	s.mu.Unlock()
	s.settle.Do(func() { close(s.settled) })
}
