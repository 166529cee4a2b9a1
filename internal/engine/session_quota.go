package engine

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// ErrSessionQuota means the caller has all the sessions its quota allows.
var ErrSessionQuota = errors.New("session quota reached")

// ownerQuota refuses a session its owner has no quota for. s.mu is held.
func (s *Sessions) ownerQuota(owner string) error {
	if s.cfg.OwnerLimit == nil {
		return nil
	}
	limit := s.cfg.OwnerLimit(owner)
	if limit <= 0 {
		return nil
	}
	n := 0
	var next time.Time
	for _, sess := range s.live {
		if sess.Owner == owner && !s.detached(sess) {
			n++
			sess.mu.Lock()
			if exp := sess.lastUsed.Add(sess.TTL); next.IsZero() || exp.Before(next) {
				next = exp
			}
			sess.mu.Unlock()
		}
	}
	if n >= limit {
		return &QuotaError{Owner: owner, Open: n, NextExpiry: next}
	}
	return nil
}

// QuotaError says that an owner has all the sessions its quota allows.
type QuotaError struct {
	Owner string
	Open  int
	// NextExpiry is when the first of them expires unless it is used.
	NextExpiry time.Time
}

func (e *QuotaError) Error() string {
	return fmt.Sprintf("%v: %s has %d sessions open, its quota; close one with close_session (list_sessions shows them), or wait: the first expires at %s unless used", ErrSessionQuota, e.Owner, e.Open, e.NextExpiry.UTC().Format(time.RFC3339))
}

func (e *QuotaError) Unwrap() error { return ErrSessionQuota }

// detached reports whether sess was last used through a connection that
// has ended. s.mu is held.
func (s *Sessions) detached(sess *Session) bool {
	if s.cfg.Detached == nil {
		return false
	}
	sess.mu.Lock()
	h := sess.holder
	sess.mu.Unlock()
	return h != "" && s.cfg.Detached(h)
}

// evictDetached makes room on a full server by closing the session idle
// longest among those whose connection has ended: nobody can name them
// but a client that kept their id, and the server-wide cap would
// otherwise lock everyone out until they expire. It reports whether it
// closed one.
func (s *Sessions) evictDetached() bool {
	s.mu.Lock()
	var detached []*Session
	for _, sess := range s.live {
		if s.detached(sess) {
			detached = append(detached, sess)
		}
	}
	s.mu.Unlock()
	lastUsed := func(sess *Session) time.Time {
		sess.mu.Lock()
		defer sess.mu.Unlock()
		return sess.lastUsed
	}
	slices.SortFunc(detached, func(a, b *Session) int { return lastUsed(a).Compare(lastUsed(b)) })
	for _, victim := range detached {
		// Never one in the middle of a run.
		if !victim.runMu.TryLock() {
			continue
		}
		victim.runMu.Unlock()
		s.remove(victim, fmt.Sprintf("it was closed to make room for a new session: the server had all the sessions it allows (%d), and the connection that last used this one had ended", s.cfg.MaxSessions))
		return true
	}
	return false
}

// liveFor is how many sessions live, and why owner may not have another
// (its quota), nil when it may.
func (s *Sessions) liveFor(owner string) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.live), s.ownerQuota(owner)
}

// full reports whether n live sessions leave no room for one more: by
// their number, or by the memory budget.
func (s *Sessions) full(n int) bool {
	return n >= s.cfg.MaxSessions || int64(n+1)*s.e.cfg.Limits.MemoryBytes > s.cfg.MemoryBudget
}

// CheckOwner refuses a session that owner did not create exactly as if it
// did not exist, so callers cannot even learn that another's session is
// there.
func (s *Sessions) CheckOwner(id, owner string) error {
	sess, err := s.get(id)
	if gone := (*SessionGoneError)(nil); errors.As(err, &gone) && gone.owner != owner {
		return noSession(id)
	}
	if p := (*PausedError)(nil); errors.As(err, &p) {
		if p.owner != owner {
			s.event(SnapshotEvent{Kind: "refuse", ID: id, Owner: p.owner, Caller: owner, Detail: "a caller who does not own the paused session named it"})
			return noSession(id)
		}
		return nil
	}
	if err != nil {
		return err
	}
	if sess.Owner != owner {
		return noSession(id)
	}
	return nil
}

// Attach records the connection a session is used through now (see
// CreateOptions.Holder; "" for none that can end): it counts against its
// owner's quota again, and the connection lists it.
func (s *Sessions) Attach(id, holder string) {
	if sess, err := s.get(id); err == nil {
		sess.mu.Lock()
		sess.holder = holder
		sess.mu.Unlock()
	}
}
