// Package activity keeps what the server is doing now, for the operator
// console (internal/console): the tool calls in flight, each with a way to
// stop it, and the most recent calls with their decisions. The governance
// layer (internal/tools) reports to it; the console reads it and is told
// when it changes.
package activity

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"
	"unicode/utf8"
)

// Call is a tool call in flight.
type Call struct {
	ID       string    `json:"id"` // the call_id of its audit record
	Identity string    `json:"identity"`
	Tool     string    `json:"tool"`
	Session  string    `json:"session,omitempty"`
	Code     string    `json:"code,omitempty"` // its first lines (CodeLines, CodeBytes)
	Started  time.Time `json:"started"`
	// CPUMS and MemoryBytes are what its sandbox has used so far (CPU
	// time, memory now), read when the call is listed; HasUsage is false
	// until the run has a sandbox that can be measured.
	CPUMS       int64 `json:"cpu_ms"`
	MemoryBytes int64 `json:"memory_bytes"`
	HasUsage    bool  `json:"has_usage"`
	cancel      context.CancelCauseFunc
	probe       Probe
}

// Probe reads what a call's sandbox has used so far: CPU time and the
// memory it holds now.
type Probe func() (cpu time.Duration, memoryBytes int64)

// Done is a finished (or refused) call.
type Done struct {
	ID         string    `json:"id"`
	Identity   string    `json:"identity"`
	Tool       string    `json:"tool"`
	Decision   string    `json:"decision"`
	Status     string    `json:"status,omitempty"`
	DurationMS int64     `json:"duration_ms"`
	At         time.Time `json:"at"`
}

// Bounds on what is kept.
const (
	CodeLines = 6
	CodeBytes = 600
	Recent    = 200
)

// Killed is the cause of a call an operator stopped.
type Killed struct{ By string }

func (k *Killed) Error() string { return "stopped by operator " + k.By }

// Registry is the server's activity. The zero value is not usable; use New.
type Registry struct {
	mu      sync.Mutex
	running map[string]*Call
	recent  []Done // newest last, at most Recent
	subs    map[chan struct{}]bool
	pending map[string]*Approval
}

// New returns an empty Registry.
func New() *Registry {
	return &Registry{running: map[string]*Call{}, subs: map[chan struct{}]bool{}}
}

// Begin notes a call in flight; the returned context ends when an
// operator kills it (its cause is a *Killed), and end is to be called
// when it is over.
func (r *Registry) Begin(ctx context.Context, c Call) (context.Context, func()) {
	if r == nil {
		return ctx, func() {}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	c.cancel = cancel
	c.Code = head(c.Code)
	if c.Started.IsZero() {
		c.Started = time.Now()
	}
	r.mu.Lock()
	r.running[c.ID] = &c
	r.mu.Unlock()
	r.changed()
	return ctx, func() {
		r.mu.Lock()
		delete(r.running, c.ID)
		r.mu.Unlock()
		cancel(nil)
		r.changed()
	}
}

// Finish records a call that is over (or was refused before it ran).
func (r *Registry) Finish(d Done) {
	if r == nil {
		return
	}
	if d.At.IsZero() {
		d.At = time.Now()
	}
	r.mu.Lock()
	r.recent = append(r.recent, d)
	if len(r.recent) > Recent {
		r.recent = append(r.recent[:0:0], r.recent[len(r.recent)-Recent:]...)
	}
	r.mu.Unlock()
	r.changed()
}

// Running lists the calls in flight, oldest first.
func (r *Registry) Running() []Call {
	r.mu.Lock()
	out := make([]Call, 0, len(r.running))
	probes := make([]Probe, 0, len(r.running))
	for _, c := range r.running {
		cc := *c
		cc.cancel, cc.probe = nil, nil
		out = append(out, cc)
		probes = append(probes, c.probe)
	}
	r.mu.Unlock()
	// The probes read cgroup files: not under the lock.
	for i, p := range probes {
		if p != nil {
			cpu, mem := p()
			out[i].CPUMS, out[i].MemoryBytes, out[i].HasUsage = cpu.Milliseconds(), mem, cpu > 0 || mem > 0
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Started.Before(out[j].Started) })
	return out
}

// SetProbe gives the call in flight of that id a way to read its usage
// (once its run has a sandbox); a call that ended is left alone.
func (r *Registry) SetProbe(id string, p Probe) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.running[id]; ok {
		c.probe = p
	}
}

// RecentCalls lists up to n of the most recent calls, newest first.
func (r *Registry) RecentCalls(n int) []Done {
	r.mu.Lock()
	defer r.mu.Unlock()
	n = min(n, len(r.recent))
	out := make([]Done, 0, n)
	for i := len(r.recent) - 1; i >= len(r.recent)-n; i-- {
		out = append(out, r.recent[i])
	}
	return out
}

// ErrNoCall: no call of that id is in flight.
var ErrNoCall = errors.New("no call of that id is in flight (it may have ended)")

// Kill stops a call in flight; by names the operator.
func (r *Registry) Kill(id, by string) (Call, error) {
	r.mu.Lock()
	c, ok := r.running[id]
	r.mu.Unlock()
	if !ok {
		return Call{}, fmt.Errorf("%w: %q", ErrNoCall, id)
	}
	c.cancel(&Killed{By: by})
	out := *c
	out.cancel = nil
	return out, nil
}

// Subscribe returns a channel that receives (without blocking the sender;
// changes coalesce) whenever the activity changes, and a func to stop.
func (r *Registry) Subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	r.mu.Lock()
	r.subs[ch] = true
	r.mu.Unlock()
	return ch, func() {
		r.mu.Lock()
		delete(r.subs, ch)
		r.mu.Unlock()
	}
}

func (r *Registry) changed() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for ch := range r.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// head is the first CodeLines lines of code, at most CodeBytes, cut at a
// character boundary.
func head(code string) string {
	lines := 0
	for i, ch := range code {
		if ch == '\n' {
			lines++
			if lines == CodeLines {
				code = code[:i] + "\n…"
				break
			}
		}
	}
	if len(code) > CodeBytes {
		cut := CodeBytes
		for cut > 0 && !utf8.RuneStart(code[cut]) {
			cut--
		}
		code = code[:cut] + "…"
	}
	return code
}
