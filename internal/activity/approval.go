package activity

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"
)

// Approval is a call waiting for an operator's decision (a policy rule
// with by: operator). It belongs to the one call that waits on it, so an
// answer is bound to that call's exact arguments (Digest) and is used
// once.
type Approval struct {
	ID       string `json:"id"` // the call_id
	Identity string `json:"identity"`
	Tool     string `json:"tool"`
	// Facts are what the call will do besides its code, one per line:
	// session, packages, inputs, limits. They come first, whole.
	Facts string `json:"facts"`
	// Code is the code it will run: whole from Get, its first lines
	// (CodeLines, CodeBytes) from Pending.
	Code string `json:"code,omitempty"`
	// CodeBytes is the length of the whole code; CodeCut says Code is
	// only its first lines.
	CodeBytes int  `json:"code_bytes"`
	CodeCut   bool `json:"code_cut,omitempty"`
	// Detail is the values of the call's other arguments (a run's
	// inputs, an upload's content), indented JSON; DetailCut says it was
	// too long to show whole.
	Detail    string `json:"detail,omitempty"`
	DetailCut bool   `json:"detail_cut,omitempty"`
	// DetailBytes is Detail's length (Pending leaves Detail out).
	DetailBytes int `json:"detail_bytes,omitempty"`
	// Group is whose share of the queue the call takes (its Identity
	// when empty): callers without tokens share one.
	Group string `json:"-"`
	// Digest is the SHA-256 of the call's arguments as the client sent
	// them: an operator's answer names it, so it applies to what they saw.
	Digest  string    `json:"digest"`
	Created time.Time `json:"created"`
	answer  chan verdict
}

type verdict struct {
	approved bool
	by       string
}

// Bounds on calls waiting for operators: an agent cannot bury the one
// call that matters under thousands of others, or make the console's
// state huge.
const (
	MaxWaitingPerIdentity = 4
	MaxWaiting            = 64
)

// ErrNoApproval: no call waits under that id (it was decided, or gave up).
var ErrNoApproval = errors.New("no call waits for approval under that id (it was decided already, or stopped waiting)")

// ErrTooManyWaiting: the identity (or everyone) has as many calls
// waiting for operators as allowed.
var ErrTooManyWaiting = errors.New("too many calls wait for an operator")

// ErrChanged: the answer names other arguments than the waiting call's.
var ErrChanged = errors.New("the call waiting under that id is not the one shown (its arguments differ); reload the page and review it again")

// Await registers a and waits for an operator's decision, or ctx's end.
func (r *Registry) Await(ctx context.Context, a Approval) (approved bool, by string, err error) {
	a.answer = make(chan verdict, 1)
	a.CodeBytes, a.DetailBytes = len(a.Code), len(a.Detail)
	if a.Created.IsZero() {
		a.Created = time.Now()
	}
	r.mu.Lock()
	if r.pending == nil {
		r.pending = map[string]*Approval{}
	}
	if a.Group == "" {
		a.Group = a.Identity
	}
	mine := 0
	for _, p := range r.pending {
		if p.Group == a.Group {
			mine++
		}
	}
	switch {
	case mine >= MaxWaitingPerIdentity:
		r.mu.Unlock()
		return false, "", fmt.Errorf("%w: %d of yours (%s) already wait (at most %d)", ErrTooManyWaiting, mine, a.Group, MaxWaitingPerIdentity)
	case len(r.pending) >= MaxWaiting:
		r.mu.Unlock()
		return false, "", fmt.Errorf("%w: %d wait (at most %d on this server)", ErrTooManyWaiting, len(r.pending), MaxWaiting)
	}
	r.pending[a.ID] = &a
	r.mu.Unlock()
	r.changed()
	defer func() {
		r.mu.Lock()
		delete(r.pending, a.ID)
		r.mu.Unlock()
		r.changed()
	}()
	select {
	case v := <-a.answer:
		return v.approved, v.by, nil
	case <-ctx.Done():
		return false, "", ctx.Err()
	}
}

// Decide answers a waiting call; by names the operator. An approval must
// name the digest of the arguments the operator reviewed; a decline needs
// none (declining the wrong call runs nothing).
func (r *Registry) Decide(id string, approve bool, by, digest string) (Approval, error) {
	r.mu.Lock()
	a, ok := r.pending[id]
	if ok && approve && digest != a.Digest {
		r.mu.Unlock()
		return Approval{}, ErrChanged
	}
	if ok {
		// Taken out at once: a second answer finds nothing.
		delete(r.pending, id)
	}
	r.mu.Unlock()
	if !ok {
		return Approval{}, fmt.Errorf("%w: %q", ErrNoApproval, id)
	}
	a.answer <- verdict{approve, by}
	out := *a
	out.answer = nil
	r.changed()
	return out, nil
}

// Get is the call waiting under id, with its whole code.
func (r *Registry) Get(id string) (Approval, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a, ok := r.pending[id]
	if !ok {
		return Approval{}, false
	}
	out := *a
	out.answer = nil
	return out, true
}

// Pending lists the calls waiting for an operator, oldest first, each
// with the first lines of its code.
func (r *Registry) Pending() []Approval {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Approval, 0, len(r.pending))
	for _, a := range r.pending {
		aa := *a
		aa.answer = nil
		if h := head(aa.Code); h != aa.Code {
			aa.Code, aa.CodeCut = h, true
		}
		// The values are shown on the call's own page, whole.
		aa.DetailBytes, aa.Detail = len(aa.Detail), ""
		out = append(out, aa)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out
}
