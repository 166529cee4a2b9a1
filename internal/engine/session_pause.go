package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/pysandbox/pysandbox/internal/sandbox"
	"github.com/pysandbox/pysandbox/internal/snapshot"
)

// Paused sessions. A session is paused by pause_session, by the drain of
// a server that stops (SIGTERM), or checkpointed after each run: its
// worker saves its globals object by object, inside its own sandbox, and
// the server writes them, its workspace files and a description to the
// snapshot store (internal/snapshot). A paused session has no process;
// the next call on it, or resume_session, starts a new sandbox under the
// same id and restores it there. A session's last snapshot stays on disk
// while it runs again, so a server killed without a drain loses only what
// changed since.

// SnapshotConfig configures paused sessions; the zero value has none.
type SnapshotConfig struct {
	// Store keeps the snapshots; nil: sessions cannot be paused, and die
	// with the server.
	Store *snapshot.Store
	// PausedTTL is how long a paused session is kept unused.
	PausedTTL time.Duration
	// MaxBytes caps one snapshot; OwnerBytes all of one owner's together.
	MaxBytes, OwnerBytes int64
	// MaxPaused caps the paused sessions of one owner; PausedLimit, when
	// set, says it per owner instead (0: MaxPaused).
	MaxPaused   int
	PausedLimit func(owner string) int
	// EveryRun checkpoints a session after each run (--checkpoint
	// every-run), so a crash loses at most the run in flight.
	EveryRun bool
	// Replica names this server in the snapshots it writes.
	Replica string
	// Unavailable says why Store is nil, for the refusals of pauses.
	Unavailable string
	// Events, when set, is told every pause, resume, expiry and refusal
	// (the audit log).
	Events func(SnapshotEvent)
}

// SnapshotEvent is something that happened to a snapshot.
type SnapshotEvent struct {
	// Kind is "pause", "checkpoint", "resume", "expire", "refuse" or
	// "fail".
	Kind  string
	ID    string
	Owner string
	// Caller is who asked (for a refusal, not the owner).
	Caller string
	Bytes  int64
	Detail string
	Saved  int
	// Unsaveable names the globals that could not be saved.
	Unsaveable []string
}

// Errors of pausing and resuming.
var (
	// ErrNoSnapshots: the server keeps no snapshots.
	ErrNoSnapshots = errors.New("this server keeps no session snapshots")
	// ErrSnapshotTooBig: the snapshot would pass a size cap; the session
	// keeps running.
	ErrSnapshotTooBig = errors.New("the session is too big to pause")
	// ErrPausedQuota: the owner has all the paused sessions it may.
	ErrPausedQuota = errors.New("paused session quota reached")
)

// PauseResult is what a pause or checkpoint saved.
type PauseResult struct {
	ID         string
	Bytes      int64
	Saved      []string
	Unsaveable []snapshot.Unsaveable
	Skipped    []string
	Files      int
	// ExpiresAt is when the paused session is deleted unless resumed.
	ExpiresAt time.Time
}

// snapEntry is a snapshot on disk: of a paused session, or the last one
// of a session that runs again.
type snapEntry struct {
	info   snapshot.Info
	paused bool
	// holder is the connection the session was last used through, while
	// this server runs (see CreateOptions.Holder): a caller without a
	// token lists its paused sessions as it listed them running.
	holder string
}

// snapState is Sessions' part for snapshots; guarded by Sessions.mu.
type snapState struct {
	snaps    map[string]*snapEntry
	resuming map[string]chan struct{}
	owners   map[string]*ownerLock
}

// loadSnapshots lists the snapshots in the store at start: each is a
// paused session (a session that ran again before a crash comes back as
// of its last snapshot).
func (s *Sessions) loadSnapshots() {
	s.snap.snaps = map[string]*snapEntry{}
	s.snap.resuming = map[string]chan struct{}{}
	st := s.cfg.Snapshots.Store
	if st == nil {
		return
	}
	infos, bad := st.List()
	for _, in := range infos {
		s.snap.snaps[in.ID] = &snapEntry{info: in, paused: true}
	}
	for name, err := range bad {
		s.e.log.Warn("session snapshot refused at start", "file", name, "err", err)
		s.event(SnapshotEvent{Kind: "refuse", ID: name, Detail: err.Error()})
	}
	if len(infos) > 0 {
		s.e.log.Info("paused sessions found", "count", len(infos), "dir", st.Dir())
	}
}

func (s *Sessions) event(ev SnapshotEvent) {
	if f := s.cfg.Snapshots.Events; f != nil {
		f(ev)
	}
}

// pausedTTL is how long a paused session is kept.
func (s *Sessions) pausedTTL() time.Duration {
	if t := s.cfg.Snapshots.PausedTTL; t > 0 {
		return t
	}
	return 7 * 24 * time.Hour
}

// ownerSnapBytes is what owner's snapshots take on disk, except id's.
// s.mu is held.
func (s *Sessions) ownerSnapBytes(owner, except string) int64 {
	var n int64
	for id, e := range s.snap.snaps {
		if id != except && e.info.Owner == owner {
			n += e.info.Size
		}
	}
	return n
}

// pausedCount counts owner's paused sessions (all, for owner "\x00").
// s.mu is held.
func (s *Sessions) pausedCount(owner string) int {
	n := 0
	for _, e := range s.snap.snaps {
		if e.paused && (owner == "\x00" || e.info.Owner == owner) {
			n++
		}
	}
	return n
}

// Pause snapshots a session and stops it: its memory and processes are
// freed, and it comes back under the same id on its next call.
func (s *Sessions) Pause(ctx context.Context, id string) (*PauseResult, error) {
	return s.saveID(ctx, id, true)
}

// saveID saves the session id once its run in flight is done: a pause
// (stop) or a checkpoint.
func (s *Sessions) saveID(ctx context.Context, id string, stop bool) (*PauseResult, error) {
	if s.cfg.Snapshots.Store == nil {
		if why := s.cfg.Snapshots.Unavailable; why != "" {
			return nil, fmt.Errorf("%w: %s", ErrNoSnapshots, why)
		}
		return nil, ErrNoSnapshots
	}
	sess, err := s.get(id)
	if err != nil {
		return nil, err
	}
	if err := sess.runMu.LockCtx(ctx); err != nil {
		return nil, err // cancelled while a run had the session: nothing done
	}
	defer sess.runMu.Unlock()
	return s.save(ctx, sess, stop, !stop, false)
}

// pausedWhy marks a stopped session that was paused, not ended.
const pausedWhy = "it was paused"

// maxPausedTotal bounds the paused sessions of a server, whoever owns
// them: each is an entry in memory and a file on disk.
const maxPausedTotal = 10000

// pausable refuses a pause the owner's paused quota has no room for.
func (s *Sessions) pausable(sess *Session) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	limit := s.cfg.Snapshots.MaxPaused
	if f := s.cfg.Snapshots.PausedLimit; f != nil {
		if n := f(sess.Owner); n > 0 {
			limit = n
		}
	}
	if limit > 0 && s.pausedCount(sess.Owner) >= limit {
		return fmt.Errorf("%w: %d sessions of yours are paused, all your quota allows; resume one and close it, or close one you no longer need", ErrPausedQuota, limit)
	}
	if s.pausedCount("\x00") >= maxPausedTotal {
		return fmt.Errorf("%w: the server holds %d paused sessions, all it keeps; close paused sessions you no longer need", ErrPausedQuota, maxPausedTotal)
	}
	return nil
}

// save writes sess's snapshot; with stop, the session is then stopped
// and listed as paused. sess.runMu is held. A failure leaves the session
// running, and its previous snapshot (if any) in place.
func (s *Sessions) save(ctx context.Context, sess *Session, stop, checkpoint, drain bool) (*PauseResult, error) {
	sess.mu.Lock()
	dead := sess.dead
	sess.mu.Unlock()
	if dead == pausedWhy {
		return nil, &PausedError{ID: sess.ID, owner: sess.Owner}
	}
	if dead != "" {
		return nil, &SessionGoneError{ID: sess.ID, Why: dead}
	}
	cfg := s.cfg.Snapshots
	// One snapshot of an owner at a time: its caps are checked against
	// what its others take, and two written at once would both pass.
	unlock := s.lockOwner(sess.Owner)
	defer unlock()
	if stop && !drain {
		if err := s.pausable(sess); err != nil {
			s.event(SnapshotEvent{Kind: "refuse", ID: sess.ID, Owner: sess.Owner, Caller: sess.Owner, Detail: err.Error()})
			return nil, err
		}
	}
	limit := cfg.MaxBytes
	s.mu.Lock()
	others := s.ownerSnapBytes(sess.Owner, sess.ID)
	s.mu.Unlock()
	if cfg.OwnerBytes > 0 {
		room := cfg.OwnerBytes - others
		if room <= 0 {
			return nil, fmt.Errorf("%w: your other snapshots take %d MiB, all the %d MiB your snapshots may take together; close paused sessions you no longer need", ErrSnapshotTooBig, others>>20, cfg.OwnerBytes>>20)
		}
		if limit <= 0 || room < limit {
			limit = room
		}
	}
	w, err := cfg.Store.Create(sess.ID, limit)
	if err != nil {
		return nil, err
	}
	tooBig := func(what string) error {
		w.Abort()
		return fmt.Errorf("%w: its %s pass the limit of %d MiB a snapshot of yours may take now (per session %d MiB, all of yours %d MiB); the session keeps running. Delete what you no longer need (del big_variable, or remove files) and pause again", ErrSnapshotTooBig, what, limit>>20, cfg.MaxBytes>>20, cfg.OwnerBytes>>20)
	}
	// Between runs the session is held to a thousandth of a CPU: the
	// pickling is a run of the worker's own.
	s.idle(sess, false)
	idleAfter := true // not once the session has stopped: its sandbox is gone
	defer func() {
		if idleAfter {
			s.idle(sess, true)
		}
	}()
	sctx, stopBound := s.bounded(ctx, sess)
	defer stopBound()
	bound := limit
	if bound <= 0 {
		bound = 1 << 62 // no cap: the worker still needs a number
	}
	res, err := sess.conn.Snapshot(sctx, w, bound)
	switch {
	case errors.Is(err, snapshot.ErrTooBig) || err == nil && res.TooBig:
		return nil, tooBig("variables")
	case err != nil:
		w.Abort()
		return nil, fmt.Errorf("engine: save the session's variables: %w", err)
	}
	w.EndGlobals()
	files, skipped, err := snapshot.PackFiles(sess.ws, w, w.Room())
	switch {
	case errors.Is(err, snapshot.ErrTooBig):
		return nil, tooBig("variables and files")
	case err != nil:
		w.Abort()
		return nil, fmt.Errorf("engine: save the session's files: %w", err)
	}
	sess.mu.Lock()
	meta := snapshot.Meta{
		ID: sess.ID, Owner: sess.Owner, Created: sess.Created.UTC(), PausedAt: time.Now().UTC(), TTL: sess.TTL,
		Requirements: slices.Clone(sess.reqs), Installed: sess.installed, Runs: sess.runs,
		Saved: res.Saved, Files: files, Skipped: skipped, Replica: cfg.Replica, Checkpoint: !stop,
	}
	sess.mu.Unlock()
	for _, u := range res.Unsaveable {
		meta.Unsaveable = append(meta.Unsaveable, snapshot.Unsaveable{Name: u.Name, Reason: u.Reason})
	}
	if sess.renv != nil && sess.renv.py != nil {
		meta.Python = sess.renv.py.Version
	}
	if sess.renv != nil && sess.renv.env != nil {
		meta.Base = slices.Clone(sess.renv.env.Requirements)
	}
	size, err := w.Commit(meta)
	if err != nil {
		return nil, err
	}
	info := snapshot.Info{Meta: meta, Size: size, Modified: time.Now()}
	sess.mu.Lock()
	holder := sess.holder
	sess.mu.Unlock()
	s.mu.Lock()
	s.snap.snaps[sess.ID] = &snapEntry{info: info, paused: false, holder: holder}
	s.mu.Unlock()
	out := &PauseResult{ID: sess.ID, Bytes: size, Saved: meta.Saved, Unsaveable: meta.Unsaveable, Skipped: skipped, Files: files}
	kind := "pause"
	if checkpoint {
		kind = "checkpoint"
	}
	ev := SnapshotEvent{Kind: kind, ID: sess.ID, Owner: sess.Owner, Caller: sess.Owner, Bytes: size, Saved: len(meta.Saved)}
	for _, u := range meta.Unsaveable {
		ev.Unsaveable = append(ev.Unsaveable, u.Name)
	}
	if !stop {
		s.event(ev)
		return out, nil
	}
	// The session stops; its snapshot is its state from now on.
	s.mu.Lock()
	if s.live[sess.ID] == sess {
		delete(s.live, sess.ID)
	}
	e := s.snap.snaps[sess.ID]
	e.paused = true
	s.mu.Unlock()
	sess.mu.Lock()
	sess.dead = pausedWhy
	sess.mu.Unlock()
	idleAfter = false
	s.release(sess)
	out.ExpiresAt = meta.PausedAt.Add(s.pausedTTL())
	s.event(ev)
	return out, nil
}

// CanPause reports whether sessions can be paused (a state directory
// keeps their snapshots).
func (s *Sessions) CanPause() bool { return s.cfg.Snapshots.Store != nil }

// Paused reports whether id is a paused session, and its owner.
func (s *Sessions) Paused(id string) (owner string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, found := s.snap.snaps[id]; found && e.paused {
		if _, live := s.live[id]; !live {
			return e.info.Owner, true
		}
	}
	return "", false
}

// bounded is the context a snapshot or restore of sess talks to its
// worker under. Cutting the connection would kill the session (a worker
// that is not answered dies with it): so when the caller gives up (a
// cancelled call, the drain's deadline) or the server's longest run time
// passes, the worker is interrupted instead, as a run at its timeout is,
// which ends the snapshot or restore with an error and keeps the session.
// Only a worker that does not answer within the grace after that is cut
// off. stop releases the timers.
func (s *Sessions) bounded(ctx context.Context, sess *Session) (context.Context, func()) {
	const grace = 3 * time.Second
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var once sync.Once
	interrupt := func() {
		once.Do(func() {
			if ssr, ok := sess.sb.(sandbox.Sessioner); ok {
				ssr.Interrupt()
			}
			time.AfterFunc(grace, cancel)
		})
	}
	limit := max(s.e.cfg.MaxTimeout, 10*time.Second)
	timer := time.AfterFunc(limit, interrupt)
	stopCtx := context.AfterFunc(ctx, interrupt)
	return cctx, func() {
		timer.Stop()
		stopCtx()
		cancel()
	}
}

// lockOwner serialises the snapshots of one owner; the returned func
// unlocks.
func (s *Sessions) lockOwner(owner string) func() {
	s.mu.Lock()
	if s.snap.owners == nil {
		s.snap.owners = map[string]*ownerLock{}
	}
	l := s.snap.owners[owner]
	if l == nil {
		l = &ownerLock{}
		s.snap.owners[owner] = l
	}
	l.users++
	s.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		s.mu.Lock()
		if l.users--; l.users == 0 {
			delete(s.snap.owners, owner)
		}
		s.mu.Unlock()
	}
}

// ownerLock is one owner's snapshot lock, kept while anyone uses it.
type ownerLock struct {
	mu    sync.Mutex
	users int
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// NoRoomError: a paused session cannot be resumed while the server has
// all the sessions it allows running.
type NoRoomError struct {
	ID  string
	Max int
}

func (e *NoRoomError) Error() string {
	return fmt.Sprintf("session %s is paused, and resuming it needs a free place: all %d are taken; close or pause one of your sessions (list_sessions shows them), then call again", e.ID, e.Max)
}

func (e *NoRoomError) Unwrap() error { return ErrTooManySessions }

// dropSnapshot deletes id's snapshot and remembers why the session ended.
func (s *Sessions) dropSnapshot(id, owner, why string) {
	if st := s.cfg.Snapshots.Store; st != nil {
		if err := st.Remove(id); err != nil {
			s.e.log.Warn("session snapshot: remove", "session", id, "err", err)
		}
	}
	s.mu.Lock()
	if e, ok := s.snap.snaps[id]; ok {
		delete(s.snap.snaps, id)
		if _, live := s.live[id]; !live && e.paused {
			s.forget(id, owner, why)
		}
	}
	s.mu.Unlock()
}

// expirePaused deletes paused sessions unused for the paused TTL.
func (s *Sessions) expirePaused(now time.Time) {
	ttl := s.pausedTTL()
	s.mu.Lock()
	var expired []snapshot.Info
	for id, e := range s.snap.snaps {
		if _, busy := s.snap.resuming[id]; e.paused && !busy && now.Sub(e.info.PausedAt) > ttl {
			expired = append(expired, e.info)
		}
	}
	s.mu.Unlock()
	for _, in := range expired {
		s.dropSnapshot(in.ID, in.Owner, fmt.Sprintf("it was paused and not resumed within %s", ttl))
		s.event(SnapshotEvent{Kind: "expire", ID: in.ID, Owner: in.Owner, Bytes: in.Size})
	}
}

// pausedInfos lists the paused sessions as list_sessions shows them.
func (s *Sessions) pausedInfos() []SessionInfo {
	ttl := s.pausedTTL()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []SessionInfo
	for id, e := range s.snap.snaps {
		if _, live := s.live[id]; live || !e.paused {
			continue
		}
		m := e.info.Meta
		paused := m.PausedAt.UTC()
		out = append(out, SessionInfo{ID: id, State: StatePaused, Created: m.Created.UTC(), LastUsed: paused, ExpiresAt: paused.Add(ttl),
			Runs: m.Runs, Owner: m.Owner, Holder: e.holder, Python: m.Python, SnapshotBytes: e.info.Size, PausedAt: &paused})
	}
	return out
}
