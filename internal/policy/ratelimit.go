package policy

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// RateLimiter counts calls against rate limits in fixed windows aligned
// to the clock. Limiter counts in this process; a shared store
// (internal/sharedstate) counts across the replicas of a deployment, with
// the same semantics.
type RateLimiter interface {
	// Reserve counts one call by identity against every limit, or none
	// of them when any is exhausted (Exceeded names the first). An error
	// means nothing could be counted (a shared store is unreachable): the
	// call must be refused.
	Reserve(ctx context.Context, limits []Limit, identity string) (Reservation, *Exceeded, error)
}

// CountReader is a RateLimiter that can say how much of a limit is used:
// the operator console shows it against the limits.
type CountReader interface {
	// Counts reads lim's count in its current window for each identity
	// (one count, identities ignored, for a global limit), and when the
	// window resets.
	Counts(ctx context.Context, lim Limit, identities []string) (counts []int64, resetAt time.Time, err error)
}

// Reservation is a counted call; Cancel gives the count back while its
// windows are current.
type Reservation interface{ Cancel() }

// Reserve is Take, as a RateLimiter.
func (l *Limiter) Reserve(_ context.Context, limits []Limit, identity string) (Reservation, *Exceeded, error) {
	r, e := l.Take(limits, identity)
	if e != nil {
		return nil, e, nil
	}
	return r, nil, nil
}

// NewExceeded reports limit lim as exhausted until resetAt, as of now.
func NewExceeded(lim Limit, resetAt, now time.Time) *Exceeded {
	return &Exceeded{Limit: lim, ResetAt: resetAt, now: now}
}

// Limiter counts calls against rate limits in fixed windows aligned to the
// clock (a "minute" limit resets at the start of every minute), which is
// what gateway policies mean and makes "resets at" exact. It is safe for
// concurrent use.
type Limiter struct {
	mu     sync.Mutex
	now    func() time.Time
	counts map[counterKey]*window
	takes  int
}

type counterKey struct {
	counter, scope string
	period         time.Duration
	identity       string // "" for global limits
}

type window struct {
	start time.Time
	n     int64
}

// NewLimiter returns an empty Limiter; now is the clock (nil: time.Now).
func NewLimiter(now func() time.Time) *Limiter {
	if now == nil {
		now = time.Now
	}
	return &Limiter{now: now, counts: map[counterKey]*window{}}
}

// Exceeded is a call refused by a rate limit.
type Exceeded struct {
	Limit   Limit
	ResetAt time.Time
	now     time.Time
}

func (e *Exceeded) Error() string {
	wait := e.ResetAt.Sub(e.now).Round(time.Second)
	if wait < time.Second {
		wait = time.Second
	}
	return fmt.Sprintf("rate limit %s reached; it resets at %s (in %s)", e.Limit, e.ResetAt.UTC().Format(time.RFC3339), wait)
}

// LocalReservation is a call Limiter counted.
type LocalReservation struct {
	l     *Limiter
	taken []taken
}

type taken struct {
	key   counterKey
	start time.Time
}

// Take counts one call by identity against every limit, or none of them
// when any is exhausted, in which case it reports the first such limit.
func (l *Limiter) Take(limits []Limit, identity string) (*LocalReservation, *Exceeded) {
	if len(limits) == 0 {
		return &LocalReservation{}, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	l.sweep(now)
	keys := make([]counterKey, len(limits))
	// The same counter may appear twice (say 10 a minute and 100 a day):
	// count what this call adds per key, so one call is counted once per
	// key.
	for i, lim := range limits {
		k := counterKey{counter: lim.Counter, scope: lim.Scope, period: lim.Period}
		if lim.Scope != ScopeGlobal {
			k.identity = identity
		}
		keys[i] = k
		w := l.counts[k]
		start := now.Truncate(lim.Period)
		if w != nil && w.start.Equal(start) && w.n >= lim.Max {
			return nil, &Exceeded{Limit: lim, ResetAt: start.Add(lim.Period), now: now}
		}
	}
	r := &LocalReservation{l: l}
	seen := map[counterKey]bool{}
	for i, k := range keys {
		if seen[k] {
			continue
		}
		seen[k] = true
		start := now.Truncate(limits[i].Period)
		w := l.counts[k]
		if w == nil || !w.start.Equal(start) {
			w = &window{start: start}
			l.counts[k] = w
		}
		w.n++
		r.taken = append(r.taken, taken{key: k, start: start})
	}
	return r, nil
}

// Cancel gives back what Take counted, if its windows are still current:
// a call that never ran (it is waiting for approval, or was declined)
// should not use up the budget.
func (r *LocalReservation) Cancel() {
	if r == nil || r.l == nil {
		return
	}
	r.l.mu.Lock()
	defer r.l.mu.Unlock()
	for _, t := range r.taken {
		if w := r.l.counts[t.key]; w != nil && w.start.Equal(t.start) && w.n > 0 {
			w.n--
		}
	}
	r.taken = nil
}

// Counts reads lim's count in its current window (CountReader).
func (l *Limiter) Counts(_ context.Context, lim Limit, identities []string) ([]int64, time.Time, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	start := now.Truncate(lim.Period)
	if lim.Scope == ScopeGlobal {
		identities = []string{""}
	}
	out := make([]int64, len(identities))
	for i, id := range identities {
		k := counterKey{counter: lim.Counter, scope: lim.Scope, period: lim.Period, identity: id}
		if w := l.counts[k]; w != nil && w.start.Equal(start) {
			out[i] = w.n
		}
	}
	return out, start.Add(lim.Period), nil
}

// sweep drops windows that have ended, now and then, so per-connection
// identities do not pile up.
func (l *Limiter) sweep(now time.Time) {
	l.takes++
	if l.takes%256 != 0 && len(l.counts) < 4096 {
		return
	}
	for k, w := range l.counts {
		if !now.Before(w.start.Add(k.period)) {
			delete(l.counts, k)
		}
	}
}
