package activity

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestBeginKillFinish(t *testing.T) {
	r := New()
	changes, stop := r.Subscribe()
	defer stop()
	ctx, end := r.Begin(context.Background(), Call{ID: "c1", Identity: "alice", Tool: "run_python",
		Code: strings.Repeat("x = 1\n", 20)})
	select {
	case <-changes:
	case <-time.After(time.Minute):
		t.Fatal("no change notified")
	}
	running := r.Running()
	if len(running) != 1 || running[0].ID != "c1" || strings.Count(running[0].Code, "\n") != CodeLines {
		t.Fatalf("running %+v", running)
	}
	if _, err := r.Kill("nope", "op"); !errors.Is(err, ErrNoCall) {
		t.Errorf("kill of nothing: %v", err)
	}
	if _, err := r.Kill("c1", "op-bob"); err != nil {
		t.Fatal(err)
	}
	<-ctx.Done()
	var k *Killed
	if !errors.As(context.Cause(ctx), &k) || k.By != "op-bob" {
		t.Errorf("cause %v", context.Cause(ctx))
	}
	end()
	if len(r.Running()) != 0 {
		t.Error("still running after end")
	}
	for i := 0; i < Recent+10; i++ {
		r.Finish(Done{ID: "d", Decision: "allow"})
	}
	r.Finish(Done{ID: "last", Decision: "deny"})
	got := r.RecentCalls(5)
	if len(got) != 5 || got[0].ID != "last" || len(r.RecentCalls(10000)) != Recent {
		t.Errorf("recent %+v", got)
	}
}

func TestHeadCutsAtCharacters(t *testing.T) {
	code := strings.Repeat("é", CodeBytes)
	h := head(code)
	if !strings.HasSuffix(h, "…") || len(h) > CodeBytes+len("…") || strings.ContainsRune(h[:len(h)-len("…")], '\uFFFD') {
		t.Errorf("%q", h)
	}
}

func TestAwaitDecide(t *testing.T) {
	r := New()
	got := make(chan string, 1)
	code := strings.Repeat("print(1)\n", 20)
	go func() {
		ok, by, err := r.Await(context.Background(), Approval{ID: "a1", Identity: "ci", Tool: "run_python", Facts: "Limits: 30s", Code: code, Digest: "d1"})
		got <- fmt.Sprint(ok, " ", by, " ", err)
	}()
	for len(r.Pending()) == 0 {
		time.Sleep(time.Millisecond)
	}
	if p := r.Pending()[0]; !p.CodeCut || p.CodeBytes != len(code) || strings.Count(p.Code, "\n") > CodeLines {
		t.Errorf("the listed call: %+v", p)
	}
	if a, ok := r.Get("a1"); !ok || a.Code != code {
		t.Errorf("Get: %+v", a)
	}
	if _, err := r.Decide("nope", true, "olga", "d1"); !errors.Is(err, ErrNoApproval) {
		t.Errorf("%v", err)
	}
	// An approval of other arguments than the waiting call's is refused,
	// and the call still waits.
	if _, err := r.Decide("a1", true, "olga", "other"); !errors.Is(err, ErrChanged) || len(r.Pending()) != 1 {
		t.Errorf("a stale digest: %v", err)
	}
	if _, err := r.Decide("a1", true, "olga", "d1"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Decide("a1", false, "olga", ""); !errors.Is(err, ErrNoApproval) {
		t.Errorf("a second answer: %v", err)
	}
	if s := <-got; s != "true olga <nil>" {
		t.Errorf("%s", s)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if ok, _, err := r.Await(ctx, Approval{ID: "a2"}); ok || err == nil || len(r.Pending()) != 0 {
		t.Errorf("a call that gave up: %v %v", ok, err)
	}
}

// TestWaitingBounds: one identity may have MaxWaitingPerIdentity calls
// waiting, the server MaxWaiting; the excess is refused at once.
func TestWaitingBounds(t *testing.T) {
	r := New()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, 200)
	wait := func(id, who string) {
		go func() {
			_, _, err := r.Await(ctx, Approval{ID: id, Identity: who})
			errs <- err
		}()
	}
	for i := 0; i < MaxWaitingPerIdentity+3; i++ {
		wait(fmt.Sprint("m", i), "mallory")
	}
	for i := 0; i < 3; i++ {
		if err := <-errs; !errors.Is(err, ErrTooManyWaiting) {
			t.Fatalf("the excess of one identity: %v", err)
		}
	}
	for i := 0; len(r.Pending()) < MaxWaiting; i++ {
		wait(fmt.Sprint("o", i), fmt.Sprint("other", i))
		for len(r.Pending()) < MaxWaitingPerIdentity+i+1 {
			time.Sleep(time.Millisecond)
		}
	}
	wait("last", "someone")
	if err := <-errs; !errors.Is(err, ErrTooManyWaiting) {
		t.Errorf("the server's excess: %v", err)
	}
}

func TestProbe(t *testing.T) {
	r := New()
	_, end := r.Begin(context.Background(), Call{ID: "c1", Identity: "ci", Tool: "run_python"})
	if c := r.Running(); len(c) != 1 || c[0].HasUsage {
		t.Fatalf("before a probe: %+v", c)
	}
	r.SetProbe("c1", func() (time.Duration, int64) { return 2500 * time.Millisecond, 7 << 20 })
	r.SetProbe("gone", func() (time.Duration, int64) { t.Error("probe of a call not in flight"); return 0, 0 })
	if c := r.Running(); len(c) != 1 || !c[0].HasUsage || c[0].CPUMS != 2500 || c[0].MemoryBytes != 7<<20 {
		t.Errorf("with a probe: %+v", c)
	}
	end()
	if c := r.Running(); len(c) != 0 {
		t.Errorf("after the end: %+v", c)
	}
}
