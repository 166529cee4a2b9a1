package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/pysandbox/pysandbox/internal/snapshot"
)

// Resuming a paused session: under its id, for its owner only, on the
// Python version it was saved with (or the same minor).

// ResumeResult is what a resume brought back.
type ResumeResult struct {
	ID       string
	PausedAt time.Time
	Restored []string
	// Failed are globals that were saved but could not be restored;
	// Unsaveable those the snapshot never held.
	Failed     []snapshot.Unsaveable
	Unsaveable []snapshot.Unsaveable
	Files      int
	// SkippedFiles are the saved files that could not be written back
	// (the workspace full, a file too large), as "path: why"; the rest
	// of the session was restored all the same.
	SkippedFiles []string
}

// Summary says in a sentence what came back, for the agent.
func (r *ResumeResult) Summary() string {
	msg := fmt.Sprintf("session %s was resumed from its snapshot of %s: %d variables restored, %d files", r.ID, r.PausedAt.UTC().Format(time.RFC3339), len(r.Restored), r.Files)
	var lost []string
	for _, u := range r.Unsaveable {
		lost = append(lost, u.Name+" ("+u.Reason+")")
	}
	for _, u := range r.Failed {
		lost = append(lost, u.Name+" ("+u.Reason+")")
	}
	if len(lost) > 0 {
		if len(lost) > 20 {
			lost = append(lost[:20], fmt.Sprintf("and %d more", len(lost)-20))
		}
		msg += fmt.Sprintf("; not restored: %s. Define these again", strings.Join(lost, ", "))
	}
	if len(r.SkippedFiles) > 0 {
		files := r.SkippedFiles
		if len(files) > 10 {
			files = append(files[:10:10], fmt.Sprintf("and %d more", len(files)-10))
		}
		msg += fmt.Sprintf("; files not restored: %s", strings.Join(files, ", "))
	}
	return msg
}

// ResumeOptions are a resume's settings, as a create's.
type ResumeOptions struct {
	Owner    string
	Holder   string
	Progress func(string)
	Network  NetAttach
}

// Resume brings a paused session back under its id, for its owner only:
// for anyone else it does not exist. A session that is already running
// gives a nil result.
func (s *Sessions) Resume(ctx context.Context, id string, o ResumeOptions) (*ResumeResult, error) {
	st := s.cfg.Snapshots.Store
	for {
		s.mu.Lock()
		if _, live := s.live[id]; live {
			s.mu.Unlock()
			return nil, s.CheckOwner(id, o.Owner)
		}
		e, found := s.snap.snaps[id]
		if st == nil || !found || !e.paused {
			s.mu.Unlock()
			_, err := s.get(id)
			if err == nil {
				err = noSession(id)
			}
			if gone := (*SessionGoneError)(nil); errors.As(err, &gone) && gone.owner != o.Owner {
				err = noSession(id)
			}
			return nil, err
		}
		if e.info.Owner != o.Owner {
			s.mu.Unlock()
			s.event(SnapshotEvent{Kind: "refuse", ID: id, Owner: e.info.Owner, Caller: o.Owner, Detail: "resume by a caller who does not own the session"})
			return nil, noSession(id)
		}
		if wait, busy := s.snap.resuming[id]; busy {
			s.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		done := make(chan struct{})
		s.snap.resuming[id] = done
		s.mu.Unlock()
		res, err := s.resume(ctx, e.info, o)
		s.mu.Lock()
		delete(s.snap.resuming, id)
		s.mu.Unlock()
		close(done)
		return res, err
	}
}

// resume restores the session info describes; its id is marked resuming.
func (s *Sessions) resume(ctx context.Context, info snapshot.Info, o ResumeOptions) (*ResumeResult, error) {
	if s.cfg.Draining != nil && s.cfg.Draining() {
		return nil, ErrDraining
	}
	id := info.ID
	snap, err := s.cfg.Snapshots.Store.Open(id)
	if err != nil {
		why := fmt.Sprintf("its snapshot could not be used (%v), so it was deleted", err)
		if !errors.Is(err, snapshot.ErrTampered) && !errors.Is(err, snapshot.ErrNotFound) {
			// A read error may pass: keep the snapshot.
			return nil, fmt.Errorf("engine: read the session's snapshot: %w", err)
		}
		s.event(SnapshotEvent{Kind: "refuse", ID: id, Owner: info.Owner, Caller: o.Owner, Detail: err.Error()})
		s.dropSnapshot(id, info.Owner, why)
		return nil, &SessionGoneError{ID: id, Why: why, owner: info.Owner}
	}
	defer snap.Close()
	meta := snap.Meta
	if meta.Owner != o.Owner {
		// The meta read at start said otherwise: the file changed since.
		s.event(SnapshotEvent{Kind: "refuse", ID: id, Owner: meta.Owner, Caller: o.Owner, Detail: "the snapshot's owner is not the caller"})
		return nil, noSession(id)
	}
	// Room for it to run, as a create needs.
	n, qerr := s.liveFor(o.Owner)
	if qerr != nil {
		return nil, qerr
	}
	if s.full(n) {
		if !s.evictDetached() {
			return nil, &NoRoomError{ID: id, Max: s.cfg.MaxSessions}
		}
	}
	// The very interpreter it ran on when the host still has it (the
	// packages it imported from that interpreter's site-packages are
	// there); else another of its minor version, whose pickles and code
	// objects it reads.
	version := majorMinor(meta.Python)
	renv, err := s.e.resolve(ctx, "", meta.Python, o.Owner, meta.Base, o.Progress)
	if err != nil && ctx.Err() == nil && meta.Python != version {
		renv, err = s.e.resolve(ctx, "", version, o.Owner, meta.Base, o.Progress)
	}
	if err != nil {
		return nil, fmt.Errorf("resuming session %s (Python %s): %w", id, meta.Python, err)
	}
	if renv.py != nil && majorMinor(renv.py.Version) != version {
		renv.close()
		return nil, &RequestError{Msg: fmt.Sprintf("session %s was paused on Python %s, and this server has no Python %s to resume it on", id, meta.Python, version)}
	}
	sess := &Session{ID: id, Created: meta.Created, TTL: meta.TTL, Owner: meta.Owner, holder: o.Holder, out: newRouter(), errs: newRouter(), renv: renv,
		reqs: meta.Requirements, runs: meta.Runs, installed: meta.Installed}
	if sess.TTL <= 0 {
		sess.TTL = s.cfg.DefaultTTL
	}
	sess.lastUsed = time.Now()
	if err := s.start(ctx, sess, o.Network); err != nil {
		return nil, err
	}
	fail := func(err error) (*ResumeResult, error) {
		s.remove(sess, "it could not be resumed: "+err.Error())
		return nil, err
	}
	res := &ResumeResult{ID: id, PausedAt: meta.PausedAt, Unsaveable: meta.Unsaveable}
	sess.runMu.Lock()
	defer sess.runMu.Unlock()
	// Files first: modules the session wrote into its workspace are
	// imported again by the restore.
	if res.Files, res.SkippedFiles, err = snapshot.UnpackFiles(sess.ws, snap.Files(), max(s.e.cfg.Limits.TmpBytes, 1<<20)); err != nil {
		return fail(fmt.Errorf("engine: resume session %s: %w", id, err))
	}
	if meta.Installed && len(meta.Requirements) > 0 && s.e.cfg.Deps != nil {
		env, release, err := s.e.cfg.Deps.Ensure(ctx, sess.renv.py, meta.Requirements, o.Progress)
		if err != nil {
			return fail(fmt.Errorf("engine: resume session %s: install its packages again: %w", id, err))
		}
		err = copyTree(env.Site, sess.ws, sessionPackages)
		release()
		if err != nil {
			return fail(fmt.Errorf("engine: resume session %s: copy its packages: %w", id, err))
		}
	}
	s.idle(sess, false)
	rctx, stopBound := s.bounded(ctx, sess)
	restored, err := sess.conn.Restore(rctx, snap.Globals(), snap.Globals().Size())
	stopBound()
	s.idle(sess, true)
	if err != nil {
		return fail(fmt.Errorf("engine: resume session %s: restore its variables: %w", id, err))
	}
	res.Restored = restored.Restored
	for _, f := range restored.Failed {
		res.Failed = append(res.Failed, snapshot.Unsaveable{Name: f.Name, Reason: f.Reason})
	}
	s.mu.Lock()
	if e := s.snap.snaps[id]; e != nil {
		e.paused = false
	}
	s.mu.Unlock()
	ev := SnapshotEvent{Kind: "resume", ID: id, Owner: meta.Owner, Caller: o.Owner, Bytes: snap.Size, Saved: len(res.Restored)}
	for _, f := range append(slices.Clone(res.Unsaveable), res.Failed...) {
		ev.Unsaveable = append(ev.Unsaveable, f.Name)
	}
	s.event(ev)
	return res, nil
}

// majorMinor is "3.11" of "3.11.2" (and of "3.11").
func majorMinor(v string) string {
	dots := 0
	for i := 0; i < len(v); i++ {
		if v[i] == '.' {
			if dots++; dots == 2 {
				return v[:i]
			}
		}
	}
	return v
}
