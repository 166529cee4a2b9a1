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
// answer is bound to that call's exact arguments and is used once.
type Approval struct {
	ID       string    `json:"id"` // the call_id
	Identity string    `json:"identity"`
	Tool     string    `json:"tool"`
	Summary  string    `json:"summary"` // what the call will do (code, packages)
	Created  time.Time `json:"created"`
	answer   chan verdict
}

type verdict struct {
	approved bool
	by       string
}

// ErrNoApproval: no call waits under that id (it was decided, or gave up).
var ErrNoApproval = errors.New("no call waits for approval under that id (it was decided already, or stopped waiting)")

// Await registers a and waits for an operator's decision, or ctx's end.
func (r *Registry) Await(ctx context.Context, a Approval) (approved bool, by string, err error) {
	a.answer = make(chan verdict, 1)
	a.Summary = head(a.Summary)
	if a.Created.IsZero() {
		a.Created = time.Now()
	}
	r.mu.Lock()
	if r.pending == nil {
		r.pending = map[string]*Approval{}
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

// Decide answers a waiting call; by names the operator.
func (r *Registry) Decide(id string, approve bool, by string) (Approval, error) {
	r.mu.Lock()
	a, ok := r.pending[id]
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

// Pending lists the calls waiting for an operator, oldest first.
func (r *Registry) Pending() []Approval {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Approval, 0, len(r.pending))
	for _, a := range r.pending {
		aa := *a
		aa.answer = nil
		out = append(out, aa)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out
}
