package engine

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestSessionCancelWhileQueued: a call cancelled while it waits behind
// another run of its session leaves without running; the run ahead of it
// finishes and the session keeps its state. Before, the queued call ran
// once its turn came, its interrupt already spent, and the grace period
// killed the session.
func TestSessionCancelWhileQueued(t *testing.T) {
	s := newSessions(t, nil, SessionConfig{})
	id := create(t, s)
	srun(t, s, id, "x = 0")
	first := make(chan *Result, 1)
	go func() {
		r, err := s.Run(context.Background(), id, RunRequest{Code: "import time\nprint('ahead', flush=True)\ntime.sleep(1)\nx = 100", Timeout: time.Minute})
		if err != nil {
			t.Error(err)
		}
		first <- r
	}()
	// The queued call: cancelled while the first holds the session.
	time.Sleep(200 * time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	r, err := s.Run(ctx, id, RunRequest{Code: "x += 1", Timeout: time.Minute})
	if err != nil || r.Status != StatusCancelled || !strings.Contains(r.Message, "nothing ran") {
		// It may have found the session free (the first not started yet
		// on a slow machine) and been cancelled in its run: then it must
		// still have kept the session.
		t.Logf("the second call: %v %+v", err, r)
	}
	if r := <-first; r.Status != StatusSuccess {
		t.Fatalf("the run ahead: %+v", r)
	}
	if r := srun(t, s, id, "x"); fmt.Sprint(r.ReturnValue) != "100" {
		t.Fatalf("after a cancelled queued call, x = %v (%+v)", r.ReturnValue, r)
	}
}

// TestSessionCancelAtOnce: calls cancelled within a few milliseconds of
// being made, some before their run reaches the worker, never cost the
// session: each is cancelled (or done), and the state is there after.
func TestSessionCancelAtOnce(t *testing.T) {
	s := newSessions(t, nil, SessionConfig{})
	id := create(t, s)
	srun(t, s, id, "n = 0")
	for i := range 30 {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(time.Duration(i%6)*time.Millisecond, cancel)
		r, err := s.Run(ctx, id, RunRequest{Code: "n += 1\nimport time\ntime.sleep(30)", Timeout: time.Minute})
		cancel()
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if r.Status != StatusCancelled {
			t.Fatalf("call %d: %s: %s", i, r.Status, r.Message)
		}
	}
	if r := srun(t, s, id, "n <= 30"); fmt.Sprint(r.ReturnValue) != "true" {
		t.Fatalf("the session after 30 cancelled calls: %+v", r)
	}
}

// TestSessionCancelLetsCleanupRun: a run cancelled well after it started
// gets one interrupt, as at a timeout, so its own cleanup (a finally
// block) runs to its end; and one that catches the interrupt and goes on
// to its end is reported with its result, not as killed.
func TestSessionCancelLetsCleanupRun(t *testing.T) {
	s := newSessions(t, nil, SessionConfig{})
	id := create(t, s)
	srun(t, s, id, "state = []")
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(700*time.Millisecond, cancel)
	r, err := s.Run(ctx, id, RunRequest{Code: "import time\ntry:\n    time.sleep(30)\nfinally:\n    for i in range(10):\n        time.sleep(0.05)\n        state.append(i)", Timeout: time.Minute})
	if err != nil || r.Status != StatusCancelled {
		t.Fatalf("%v %+v", err, r)
	}
	if r := srun(t, s, id, "len(state)"); fmt.Sprint(r.ReturnValue) != "10" {
		t.Errorf("the finally block ran %v of 10 steps", r.ReturnValue)
	}
	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(700*time.Millisecond, cancel)
	r, err = s.Run(ctx, id, RunRequest{Code: "import time\ntry:\n    time.sleep(30)\nexcept KeyboardInterrupt:\n    pass\nn = 7\n'done'", Timeout: time.Minute})
	if err != nil || r.Status != StatusSuccess || fmt.Sprint(r.ReturnValue) != "done" || !strings.Contains(r.Message, "the call was cancelled, but the run had already gone to its end") {
		t.Errorf("a run that caught the interrupt: %v %+v", err, r)
	}
	if r := srun(t, s, id, "n"); fmt.Sprint(r.ReturnValue) != "7" {
		t.Errorf("n = %v", r.ReturnValue)
	}
}
