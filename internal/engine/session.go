package engine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/pysandbox/pysandbox/internal/sandbox"
	"github.com/pysandbox/pysandbox/internal/worker"
	"github.com/pysandbox/pysandbox/internal/workspace"
)

// SessionConfig configures sessions.
type SessionConfig struct {
	// MaxSessions caps the sessions alive at once.
	MaxSessions int
	// DefaultTTL is the idle time after which a session expires, when
	// create_session names none; MaxTTL caps what it may ask for.
	DefaultTTL, MaxTTL time.Duration
	// MemoryBudget caps the memory limits of all sessions together: each
	// session may use the per-run memory limit.
	MemoryBudget int64
	// OwnerLimit, when set, is the most sessions one owner may have open
	// (0: no bound but MaxSessions), asked at each create_session.
	OwnerLimit func(owner string) int
	// IDSuffix ends every session id: one replica of several names
	// itself there (internal/cluster), so any replica knows the owner.
	IDSuffix string
	// Draining, when set and true, refuses new sessions: the server is
	// stopping, and a session made now would be lost with it.
	Draining func() bool
	// Snapshots configures paused sessions (session_pause.go).
	Snapshots SnapshotConfig
	// Detached, when set, reports whether the connection a session was
	// last used through has ended (see CreateOptions.Holder): such a
	// session no longer counts against its owner's quota, and it is the
	// first to go when the server is full.
	Detached func(holder string) bool
}

// ErrDraining refuses a session on a server that is stopping.
var ErrDraining = errors.New("this server is shutting down and takes no new sessions; retry, and another server will take it")

// Sessions manages long-lived workers that keep their state between runs:
// the third way of running code, next to one-shot cold and pooled runs.
//
// A session whose worker dies (os._exit, the memory limit, a signal, a
// timeout it would not stop for) is marked dead, not restarted: restarting
// with empty state would let an agent believe its variables still exist.
// The next call on it says how it died and that a new session is needed.
type Sessions struct {
	e   *Engine
	cfg SessionConfig

	mu    sync.Mutex
	live  map[string]*Session
	gone  map[string]goneSession // id → why it ended, for clear errors (bounded)
	order []string               // gone ids, oldest first
	quit  chan struct{}
	wg    sync.WaitGroup
	snap  snapState
}

// Session is one long-lived sandboxed worker and its workspace.
type Session struct {
	ID      string
	Created time.Time
	TTL     time.Duration
	Owner   string

	sb   sandbox.Sandbox
	conn *worker.Conn
	ws   *workspace.Dir
	out  *router
	errs *router

	runMu runLock // one run at a time

	netStop func() // ends the session's network

	// renv is the session's interpreter and dependency environment (held
	// in the cache as in use while the session lives); reqs are all its
	// requirements, install_package's included.
	renv      *runEnv
	reqs      []string
	installed bool // install_package added packages to its workspace

	mu       sync.Mutex
	holder   string // see CreateOptions.Holder
	lastUsed time.Time
	runs     int
	dead     string // why it ended; "" while alive
	wsUsers  sync.WaitGroup
}

// SessionInfo is what list_sessions and create_session report.
type SessionInfo struct {
	ID          string    `json:"session_id"`
	Created     time.Time `json:"created"`
	LastUsed    time.Time `json:"last_used"`
	ExpiresAt   time.Time `json:"expires_at"`
	MemoryBytes int64     `json:"memory_bytes"`
	CPUTimeMS   int64     `json:"cpu_time_ms"` // all its processes, runs and between
	Runs        int       `json:"runs"`
	Owner       string    `json:"-"`
	// Holder is the connection it was last used through (CreateOptions.Holder).
	Holder string `json:"-"`
	// Python is the version of its interpreter, e.g. "3.13.1".
	Python string `json:"-"`
	// State is StateRunning or StatePaused. A paused session has no
	// memory or processes; ExpiresAt is then when it is deleted unless
	// resumed, and SnapshotBytes what its snapshot takes on disk.
	State         string     `json:"state"`
	SnapshotBytes int64      `json:"snapshot_bytes,omitempty"`
	PausedAt      *time.Time `json:"paused_at,omitempty"`
}

// Session states.
const (
	StateRunning = "running"
	StatePaused  = "paused"
)

// Errors that tell the agent what to do next.
var (
	ErrNoSession       = errors.New("no such session")
	ErrTooManySessions = errors.New("too many sessions")
)

// SessionGoneError says why a session no longer exists.
type SessionGoneError struct {
	ID, Why string
	owner   string
}

func (e *SessionGoneError) Error() string {
	return fmt.Sprintf("session %s has ended: %s; its state is lost. Create a new session with create_session", e.ID, e.Why)
}

// NewSessions starts the session manager and its idle reaper.
func (e *Engine) NewSessions(cfg SessionConfig) *Sessions {
	if cfg.MaxSessions <= 0 {
		cfg.MaxSessions = 8
	}
	if cfg.DefaultTTL <= 0 {
		cfg.DefaultTTL = 10 * time.Minute
	}
	if cfg.MaxTTL < cfg.DefaultTTL {
		cfg.MaxTTL = max(cfg.DefaultTTL, 24*time.Hour)
	}
	if cfg.MemoryBudget <= 0 {
		cfg.MemoryBudget = int64(cfg.MaxSessions) * max(e.cfg.Limits.MemoryBytes, 1)
	}
	s := &Sessions{e: e, cfg: cfg, live: map[string]*Session{}, gone: map[string]goneSession{}, quit: make(chan struct{})}
	s.loadSnapshots()
	s.wg.Add(1)
	go s.reaper()
	return s
}

// SetDetached sets SessionConfig.Detached; call it before the first
// session is created (the MCP server that knows the connections is made
// after the sessions).
func (s *Sessions) SetDetached(f func(holder string) bool) {
	s.mu.Lock()
	s.cfg.Detached = f
	s.mu.Unlock()
}

// Config returns the effective configuration.
func (s *Sessions) Config() SessionConfig { return s.cfg }

// newID returns a session id: 128 random bits, since for callers without
// a token the id is the only proof of ownership (a capability), so it
// must be as hard to guess as a token.
func newID() string {
	var b [16]byte
	rand.Read(b[:])
	return "s-" + hex.EncodeToString(b[:])
}

// CreateOptions are a session's optional settings.
type CreateOptions struct {
	// Dependencies are installed (or found in the cache) first and are
	// importable in every run; PythonVersion selects the interpreter.
	Dependencies  []string
	PythonVersion string
	Progress      func(string)
	// Owner is who created the session (the MCP layer's caller identity);
	// the MCP layer lets only the owner use it.
	Owner string
	// Holder names the connection the session is used through, when its
	// owner is not one caller but everyone who knows the session's id
	// (HTTP without tokens); "" otherwise. See SessionConfig.Detached.
	Holder string
	// Network serves the session's proxy listener for its whole life;
	// nil: the session has no network.
	Network NetAttach
}

// Create starts a session. ttl 0 means the default.
func (s *Sessions) Create(ctx context.Context, ttl time.Duration, opts ...CreateOptions) (*SessionInfo, error) {
	var o CreateOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	if ttl <= 0 {
		ttl = s.cfg.DefaultTTL
	}
	ttl = min(ttl, s.cfg.MaxTTL)
	n, qerr := s.liveFor(o.Owner)
	if qerr != nil {
		return nil, qerr
	}
	if s.full(n) && s.evictDetached() {
		s.mu.Lock()
		n = len(s.live)
		s.mu.Unlock()
	}
	if n >= s.cfg.MaxSessions {
		return nil, fmt.Errorf("%w: %d of %d are open; close one with close_session (list_sessions shows them), or wait until one has been idle for %s and expires", ErrTooManySessions, n, s.cfg.MaxSessions, s.cfg.DefaultTTL)
	}
	if int64(n+1)*s.e.cfg.Limits.MemoryBytes > s.cfg.MemoryBudget {
		return nil, fmt.Errorf("%w: the sessions' memory budget (%d MiB) is used by %d sessions; close one with close_session", ErrTooManySessions, s.cfg.MemoryBudget>>20, n)
	}
	renv, err := s.e.resolve(ctx, "", o.PythonVersion, o.Owner, o.Dependencies, o.Progress)
	if err != nil {
		return nil, err
	}
	if s.cfg.Draining != nil && s.cfg.Draining() {
		renv.close()
		return nil, ErrDraining
	}
	sess := &Session{ID: newID() + s.cfg.IDSuffix, Created: time.Now(), TTL: ttl, Owner: o.Owner, holder: o.Holder, out: newRouter(), errs: newRouter(), renv: renv}
	sess.lastUsed = sess.Created
	if renv.env != nil {
		sess.reqs = renv.env.Requirements
	} else {
		sess.reqs = renv.declared
	}
	if err := s.start(ctx, sess, o.Network); err != nil {
		return nil, err
	}
	info := sess.info()
	return &info, nil
}

// start starts sess's sandbox and worker and registers it, or releases
// what it took (its environment included) and fails.
func (s *Sessions) start(ctx context.Context, sess *Session, network NetAttach) error {
	renv := sess.renv
	spec := s.e.specFor(renv, false, sess.out, sess.errs)
	sb, err := s.e.cfg.Backend.Start(ctx, spec)
	if err != nil {
		renv.close()
		if ctx.Err() == nil {
			return startError(err)
		}
		return fmt.Errorf("engine: start session: %w", err)
	}
	sess.sb = sb
	sess.netStop = attachNetwork(sb, network)
	fail := func(err error) error {
		sess.netStop()
		sb.Close()
		renv.close()
		return err
	}
	ssr, ok := sb.(sandbox.Sessioner)
	if !ok {
		return fail(fmt.Errorf("engine: the %s backend cannot host sessions", s.e.cfg.Backend.Kind()))
	}
	sess.conn = worker.NewConn(sb.Control())
	if _, err := sess.conn.Ready(ctx); err != nil {
		return fail(fmt.Errorf("engine: session worker did not start: %w", err))
	}
	s.idle(sess, true)
	f, err := ssr.OpenWorkspace()
	if err != nil {
		return fail(err)
	}
	if sess.ws, err = workspace.Open(f); err != nil {
		f.Close()
		return fail(fmt.Errorf("engine: %w", err))
	}
	s.mu.Lock()
	if len(s.live) >= s.cfg.MaxSessions {
		s.mu.Unlock()
		sess.ws.Close()
		return fail(fmt.Errorf("%w: %d of %d are open; close one with close_session", ErrTooManySessions, len(s.live), s.cfg.MaxSessions))
	}
	// Again, now that the session exists: concurrent creates by one owner
	// all passed the first check.
	if err := s.ownerQuota(sess.Owner); err != nil {
		s.mu.Unlock()
		sess.ws.Close()
		return fail(err)
	}
	s.live[sess.ID] = sess
	s.mu.Unlock()
	s.wg.Add(1)
	go s.watch(sess)
	return nil
}

// watch notices a worker that dies between runs.
func (s *Sessions) watch(sess *Session) {
	defer s.wg.Done()
	exit := sess.sb.Wait()
	sess.mu.Lock()
	if sess.dead == "" {
		sess.dead = describeExit(exit, s.e.cfg.Limits.MemoryBytes)
	}
	why := sess.dead
	sess.mu.Unlock()
	s.remove(sess, why)
}

// describeExit says in words how a session's worker ended.
func describeExit(exit sandbox.Exit, memLimit int64) string {
	switch {
	case exit.OOMKilled:
		return fmt.Sprintf("its worker was killed for exceeding the %d MiB memory limit (files in /tmp and /work count towards it: they are held in memory)", memLimit>>20)
	case exit.Signal != 0:
		return "its worker was killed by " + signalWords(exit.Signal)
	default:
		return fmt.Sprintf("its worker exited with code %d", exit.Code)
	}
}

// remove forgets a session (keeping why it ended) and releases everything
// it held on the host.
func (s *Sessions) remove(sess *Session, why string) {
	s.unlist(sess, why)
	s.release(sess)
}

// unlist takes sess out of the live sessions, so that every later call
// finds it ended, for why; its sandbox is released apart (release).
func (s *Sessions) unlist(sess *Session, why string) {
	s.mu.Lock()
	if s.live[sess.ID] == sess {
		delete(s.live, sess.ID)
		s.forget(sess.ID, sess.Owner, why)
	}
	s.mu.Unlock()
	sess.mu.Lock()
	if sess.dead == "" {
		sess.dead = why
	}
	sess.mu.Unlock()
}

// forget remembers why a session ended (bounded). s.mu is held.
func (s *Sessions) forget(id, owner, why string) {
	if _, ok := s.gone[id]; !ok {
		s.order = append(s.order, id)
	}
	s.gone[id] = goneSession{why: why, owner: owner}
	if len(s.order) > 1024 {
		delete(s.gone, s.order[0])
		s.order = s.order[1:]
	}
}

// release frees everything a session that is no longer listed held on
// the host.
func (s *Sessions) release(sess *Session) {
	sess.sb.Kill()
	sess.netStop()
	// File operations in flight finish first: the workspace descriptor
	// keeps the session's tmpfs alive until it is closed.
	sess.wsUsers.Wait()
	if sess.ws != nil {
		sess.ws.Close()
	}
	sess.conn.Close()
	sess.sb.Close()
	if sess.renv != nil {
		sess.renv.close()
	}
}

// get returns a live session or an error that says what to do.
func (s *Sessions) get(id string) (*Session, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sess, ok := s.live[id]; ok {
		return sess, nil
	}
	if e, ok := s.snap.snaps[id]; ok && e.paused {
		return nil, &PausedError{ID: id, owner: e.info.Owner}
	}
	if g, ok := s.gone[id]; ok {
		return nil, &SessionGoneError{ID: id, Why: g.why, owner: g.owner}
	}
	return nil, noSession(id)
}

// goneSession is what is kept of an ended session: why it ended, told
// only to its owner.
type goneSession struct{ why, owner string }

func noSession(id string) error {
	return fmt.Errorf("%w %q (it never existed, it ended long ago, or it was lost when a server stopped without saving it)", ErrNoSession, id)
}

// Close ends a session, running or paused, and deletes its workspace and
// snapshot.
func (s *Sessions) Close(id string) error {
	const why = "it was closed with close_session"
	// A resume in flight finishes first, then the session it made is
	// closed: closing the snapshot under it would let it come back.
	for {
		s.mu.Lock()
		wait, busy := s.snap.resuming[id]
		s.mu.Unlock()
		if !busy {
			break
		}
		<-wait
	}
	sess, err := s.get(id)
	if p := (*PausedError)(nil); errors.As(err, &p) {
		s.dropSnapshot(id, p.owner, why)
		return nil
	}
	if err != nil {
		return err
	}
	s.remove(sess, why)
	sess.sb.Wait()
	s.dropSnapshot(id, sess.Owner, why)
	return nil
}

// PausedError is a call on a paused session that does not resume it.
type PausedError struct {
	ID    string
	owner string
}

func (e *PausedError) Error() string {
	return fmt.Sprintf("session %s is paused; resume it with resume_session (or call run_python on it)", e.ID)
}

// List reports every live session.
func (s *Sessions) List() []SessionInfo {
	s.mu.Lock()
	all := make([]*Session, 0, len(s.live))
	for _, sess := range s.live {
		all = append(all, sess)
	}
	s.mu.Unlock()
	out := make([]SessionInfo, 0, len(all))
	for _, sess := range all {
		out = append(out, sess.info())
	}
	return append(out, s.pausedInfos()...)
}

func (sess *Session) info() SessionInfo {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	i := SessionInfo{ID: sess.ID, State: StateRunning, Created: sess.Created.UTC(), LastUsed: sess.lastUsed.UTC(), ExpiresAt: sess.lastUsed.Add(sess.TTL).UTC(), Runs: sess.runs, Owner: sess.Owner, Holder: sess.holder}
	if sess.renv != nil && sess.renv.py != nil {
		i.Python = sess.renv.py.Version
	}
	i.CPUTimeMS = sessionCPU(sess).Milliseconds()
	if m, ok := sess.sb.(interface{ MemoryCurrent() int64 }); ok {
		i.MemoryBytes = m.MemoryCurrent()
	}
	return i
}

func (sess *Session) touch() {
	sess.mu.Lock()
	sess.lastUsed = time.Now()
	sess.mu.Unlock()
}

// reaper closes sessions idle for longer than their TTL.
func (s *Sessions) reaper() {
	defer s.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-s.quit:
			return
		case now := <-t.C:
			s.mu.Lock()
			var expired []*Session
			for _, sess := range s.live {
				sess.mu.Lock()
				idle := now.Sub(sess.lastUsed) > sess.TTL
				sess.mu.Unlock()
				// A session in the middle of a run is not idle.
				if idle && sess.runMu.TryLock() {
					sess.runMu.Unlock()
					expired = append(expired, sess)
				}
			}
			s.mu.Unlock()
			for _, sess := range expired {
				why := fmt.Sprintf("it expired after %s without use", sess.TTL)
				s.remove(sess, why)
				s.dropSnapshot(sess.ID, sess.Owner, why)
			}
			s.expirePaused(now)
		}
	}
}

// Shutdown closes every session; nothing of them is left on the host.
func (s *Sessions) Shutdown() {
	select {
	case <-s.quit:
		return
	default:
		close(s.quit)
	}
	s.mu.Lock()
	all := make([]*Session, 0, len(s.live))
	for _, sess := range s.live {
		all = append(all, sess)
	}
	s.mu.Unlock()
	for _, sess := range all {
		s.remove(sess, "the server shut down")
	}
	s.wg.Wait()
}
