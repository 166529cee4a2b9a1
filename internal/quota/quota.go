// Package quota bounds what one caller (an identity: a bearer token's name,
// an MCP session, or stdio) may hold at once: runs executing, runs waiting
// for them, and sessions. The engine's own caps (--max-concurrent,
// --max-queue, --max-sessions) are shared by everyone; without a share of
// its own, one token holder could take every slot and queue place and lock
// the other tenants out.
//
// It sits between the tools (which know who calls) and the engine (which
// does not), in the flow MCP tool → policy → quota → engine.
package quota

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Limits bound one identity. Zero means no bound.
type Limits struct {
	Runs     int // runs executing at once
	Queue    int // runs waiting for one of those
	Sessions int // sessions open at once (enforced by the engine, see SessionLimit)
}

// ErrQuota is the error of a call refused by its caller's quota.
var ErrQuota = errors.New("quota: the caller's quota is used up")

// Error names the quota a call hit.
type Error struct {
	Identity string
	Limits   Limits
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s may have %d runs executing and %d waiting at once, and all are taken by its own calls; wait for one to finish", e.Identity, e.Limits.Runs, e.Limits.Queue)
}

func (e *Error) Unwrap() error { return ErrQuota }

// Quotas counts runs per identity. Safe for concurrent use.
type Quotas struct {
	limits func(identity string) Limits

	mu    sync.Mutex
	state map[string]*counts
}

type counts struct {
	running, waiting int
	// freed is closed (and replaced) when a run of this identity ends, to
	// wake its waiters.
	freed chan struct{}
}

// New returns quotas whose limits for an identity are limits(identity),
// asked on every call (so a reloaded policy applies at once).
func New(limits func(identity string) Limits) *Quotas {
	return &Quotas{limits: limits, state: map[string]*counts{}}
}

// For is the identity's limits.
func (q *Quotas) For(identity string) Limits {
	if q == nil || q.limits == nil {
		return Limits{}
	}
	return q.limits(identity)
}

// Run takes one of identity's run slots, waiting (in one of its queue
// places) while they are all taken, until ctx ends. It returns the release
// function, or an *Error when the queue places are taken too.
func (q *Quotas) Run(ctx context.Context, identity string) (func(), error) {
	if q == nil {
		return func() {}, nil
	}
	lim := q.For(identity)
	if lim.Runs <= 0 {
		return func() {}, nil
	}
	q.mu.Lock()
	c := q.state[identity]
	if c == nil {
		c = &counts{freed: make(chan struct{})}
		q.state[identity] = c
	}
	if c.running >= lim.Runs {
		if c.waiting >= lim.Queue {
			q.mu.Unlock()
			return nil, &Error{Identity: identity, Limits: lim}
		}
		c.waiting++
		for c.running >= lim.Runs {
			freed := c.freed
			q.mu.Unlock()
			select {
			case <-freed:
			case <-ctx.Done():
				q.mu.Lock()
				c.waiting--
				q.forget(identity, c)
				q.mu.Unlock()
				return nil, ctx.Err()
			}
			q.mu.Lock()
			lim = q.For(identity)
			if lim.Runs <= 0 {
				break
			}
		}
		c.waiting--
	}
	c.running++
	q.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			q.mu.Lock()
			c.running--
			close(c.freed)
			c.freed = make(chan struct{})
			q.forget(identity, c)
			q.mu.Unlock()
		})
	}, nil
}

// forget drops an identity with nothing running or waiting, so the map
// does not grow with every caller ever seen. q.mu is held.
func (q *Quotas) forget(identity string, c *counts) {
	if c.running == 0 && c.waiting == 0 && q.state[identity] == c {
		delete(q.state, identity)
	}
}

// InUse reports an identity's runs executing and waiting.
func (q *Quotas) InUse(identity string) (running, waiting int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if c := q.state[identity]; c != nil {
		return c.running, c.waiting
	}
	return 0, 0
}

// SessionLimit is the identity's session quota (0: none), for the engine.
func (q *Quotas) SessionLimit(identity string) int { return q.For(identity).Sessions }
