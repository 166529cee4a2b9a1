package engine

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/pysandbox/pysandbox/internal/sandbox"
	"github.com/pysandbox/pysandbox/internal/snapshot"
)

// The drain of a stopping server, checkpoints, and the hand-over of
// paused sessions between replicas.

// Checkpoint writes a live session's snapshot, keeping it running
// (--checkpoint every-run does after each run).
func (s *Sessions) Checkpoint(ctx context.Context, id string) (*PauseResult, error) {
	return s.saveID(ctx, id, false)
}

// PauseAll is the drain of a server that stops: each session is paused
// once its run in flight finishes, until deadline. A session still
// running then keeps its last snapshot if it has one (a checkpoint);
// one without is interrupted as a timeout would, and paused as of then.
// It reports how many were paused, and how many could not be.
func (s *Sessions) PauseAll(deadline time.Time) (paused, failed int) {
	if s.cfg.Snapshots.Store == nil {
		return 0, 0
	}
	s.mu.Lock()
	all := make([]*Session, 0, len(s.live))
	for _, sess := range s.live {
		all = append(all, sess)
	}
	s.mu.Unlock()
	// All at once: each is bounded by the deadline (a snapshot still
	// running then is interrupted), so a session that takes long to save
	// cannot hold another's turn.
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, sess := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok := s.drainOne(sess, deadline)
			mu.Lock()
			if ok {
				paused++
			} else {
				failed++
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return paused, failed
}

func (s *Sessions) drainOne(sess *Session, deadline time.Time) bool {
	locked := false
	for !locked && time.Now().Before(deadline) {
		if locked = sess.runMu.TryLock(); !locked {
			time.Sleep(50 * time.Millisecond)
		}
	}
	if !locked {
		// A checkpoint taken after its last finished run is all there is
		// to keep. Anything older would lose the runs since: the run is
		// interrupted instead, as at a timeout (it ends with a
		// KeyboardInterrupt, and its caller gets that reply), and the
		// session is saved as of then.
		s.mu.Lock()
		e := s.snap.snaps[sess.ID]
		s.mu.Unlock()
		sess.mu.Lock()
		runs := sess.runs
		sess.mu.Unlock()
		if e != nil && e.info.Checkpoint && e.info.Runs == runs {
			s.e.log.Info("drain: a session still running keeps its checkpoint of its last finished run", "session", sess.ID)
			return true
		}
		if ssr, ok := sess.sb.(sandbox.Sessioner); ok {
			ssr.Interrupt()
		}
		end := time.Now().Add(3 * time.Second)
		for !locked && time.Now().Before(end) {
			if locked = sess.runMu.TryLock(); !locked {
				time.Sleep(50 * time.Millisecond)
			}
		}
		if !locked {
			if e != nil {
				s.e.log.Warn("drain: a run would not stop; the session keeps its last snapshot", "session", sess.ID, "of", e.info.PausedAt)
				return true
			}
			s.event(SnapshotEvent{Kind: "fail", ID: sess.ID, Owner: sess.Owner, Detail: "the drain's deadline passed during a run that would not stop"})
			return false
		}
	}
	defer sess.runMu.Unlock()
	// A session reached only after the deadline (it ran until then, and
	// was interrupted) still gets a few seconds to be saved.
	ctx, cancel := context.WithDeadline(context.Background(), later(deadline, time.Now().Add(5*time.Second)))
	defer cancel()
	if _, err := s.save(ctx, sess, true, false, true); err != nil {
		s.e.log.Warn("drain: a session could not be paused; it is lost", "session", sess.ID, "err", err)
		s.event(SnapshotEvent{Kind: "fail", ID: sess.ID, Owner: sess.Owner, Detail: err.Error()})
		return false
	}
	return true
}

// SnapshotStore is the store of paused sessions (nil: none).
func (s *Sessions) SnapshotStore() *snapshot.Store { return s.cfg.Snapshots.Store }

// PausedIDs lists the paused sessions of this server.
func (s *Sessions) PausedIDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for id, e := range s.snap.snaps {
		if _, live := s.live[id]; !live && e.paused {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// Adopt lists a snapshot another server handed over (its file is in the
// store already, verified by snapshot.Store.Import) as a paused session of
// this one.
func (s *Sessions) Adopt(info snapshot.Info) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, live := s.live[info.ID]; live {
		return
	}
	s.snap.snaps[info.ID] = &snapEntry{info: info, paused: true}
	delete(s.gone, info.ID)
}

// HandedOff forgets a paused session another server now holds, and
// deletes its snapshot here.
func (s *Sessions) HandedOff(id string) {
	s.mu.Lock()
	e, ok := s.snap.snaps[id]
	_, live := s.live[id]
	if ok && e.paused && !live {
		delete(s.snap.snaps, id)
	}
	s.mu.Unlock()
	if ok && e.paused && !live && s.cfg.Snapshots.Store != nil {
		s.cfg.Snapshots.Store.Remove(id)
	}
}
