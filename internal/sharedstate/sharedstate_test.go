package sharedstate

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/policy"
	"github.com/pysandbox/pysandbox/internal/testutil/redisserver"
)

func open(t *testing.T, url string) *Store {
	t.Helper()
	s, err := Open(context.Background(), url, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func limit(counter, window string, max int64, scope string) policy.Limit {
	periods := map[string]time.Duration{"second": time.Second, "minute": time.Minute, "hour": time.Hour, "day": 24 * time.Hour}
	return policy.Limit{Counter: counter, Window: window, Max: max, Scope: scope, Period: periods[window]}
}

// TestExactlyNAcrossReplicas: four replicas (each its own connection),
// 25 callers each, 20 attempts each, against a global limit of 137: exactly
// 137 are allowed, as on one replica.
func TestExactlyNAcrossReplicas(t *testing.T) {
	r := redisserver.Start(t)
	lim := []policy.Limit{limit("runs", "day", 137, policy.ScopeGlobal)}
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for replica := 0; replica < 4; replica++ {
		l := open(t, r.URL()).Limiter()
		for caller := 0; caller < 25; caller++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 20; i++ {
					_, ex, err := l.Reserve(context.Background(), lim, "someone")
					if err != nil {
						t.Error(err)
						return
					}
					if ex == nil {
						allowed.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	if n := allowed.Load(); n != 137 {
		t.Errorf("%d allowed, want exactly 137", n)
	}
}

// TestSemantics: the local Limiter's rules, kept: all or nothing over
// several limits, a counter named twice counted once, per-identity
// scopes, Cancel, and the reset time.
func TestSemantics(t *testing.T) {
	r := redisserver.Start(t)
	a, b := open(t, r.URL()).Limiter(), open(t, r.URL()).Limiter()
	ctx := context.Background()
	perMin := limit("x", "minute", 2, policy.ScopeGlobal)
	perDay := limit("y", "day", 100, policy.ScopeGlobal)
	// All or nothing: when x is exhausted, y is not counted.
	for i := 0; i < 2; i++ {
		if _, ex, err := a.Reserve(ctx, []policy.Limit{perMin, perDay}, "alice"); ex != nil || err != nil {
			t.Fatalf("call %d: %v %v", i, ex, err)
		}
	}
	_, ex, _ := b.Reserve(ctx, []policy.Limit{perDay, perMin}, "bob")
	if ex == nil || ex.Limit.Counter != "x" || !strings.Contains(ex.Error(), "resets at") {
		t.Fatalf("the third call: %v", ex)
	}
	if time.Until(ex.ResetAt) > time.Minute || time.Until(ex.ResetAt) < -5*time.Second {
		t.Errorf("reset at %v", ex.ResetAt)
	}
	// y counted twice, not three times: 98 more fit.
	y := []policy.Limit{perDay}
	for i := 0; i < 98; i++ {
		if _, ex, err := b.Reserve(ctx, y, "bob"); ex != nil || err != nil {
			t.Fatalf("y call %d: %v %v", i, ex, err)
		}
	}
	res, ex, _ := a.Reserve(ctx, y, "alice")
	if ex == nil {
		res.Cancel()
		t.Fatal("y over its limit")
	}
	// The same counter twice in one call counts once.
	twice := []policy.Limit{limit("z", "hour", 3, policy.ScopeGlobal), limit("z", "hour", 3, policy.ScopeGlobal)}
	for i := 0; i < 3; i++ {
		if _, ex, _ := a.Reserve(ctx, twice, "alice"); ex != nil {
			t.Fatalf("z call %d refused", i)
		}
	}
	// Per identity.
	grant := []policy.Limit{limit("g", "hour", 1, policy.ScopeGrant)}
	if _, ex, _ := a.Reserve(ctx, grant, "alice"); ex != nil {
		t.Fatal("alice refused")
	}
	if _, ex, _ := b.Reserve(ctx, grant, "bob"); ex != nil {
		t.Fatal("bob refused: scopes are per identity")
	}
	if _, ex, _ := b.Reserve(ctx, grant, "alice"); ex == nil {
		t.Fatal("alice's second call through another replica allowed")
	}
	// Cancel gives the count back, through any replica.
	c := []policy.Limit{limit("c", "hour", 1, policy.ScopeGlobal)}
	res, _, _ = a.Reserve(ctx, c, "alice")
	if _, ex, _ := b.Reserve(ctx, c, "bob"); ex == nil {
		t.Fatal("over the limit")
	}
	res.Cancel()
	if _, ex, _ := b.Reserve(ctx, c, "bob"); ex != nil {
		t.Fatal("the cancelled count was not given back")
	}
}

// TestStoreDown: a store that stops answering refuses calls (an error),
// quickly; counting resumes when it is back.
func TestStoreDown(t *testing.T) {
	r := redisserver.Start(t)
	s, err := Open(context.Background(), r.URL(), Options{Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r.Stop()
	lim := []policy.Limit{limit("runs", "minute", 10, policy.ScopeGlobal)}
	start := time.Now()
	if _, _, err := s.Limiter().Reserve(context.Background(), lim, "x"); err == nil || !strings.Contains(err.Error(), "did not answer") {
		t.Errorf("a store that is down: %v", err)
	}
	if d := time.Since(start); d > time.Minute {
		t.Errorf("took %v", d)
	}
	if _, err := s.Nonces().UseOnce(context.Background(), "n1", time.Now().Add(time.Minute)); err == nil {
		t.Error("a nonce checked against a store that is down")
	}
	if _, err := Open(context.Background(), r.URL(), Options{Timeout: 500 * time.Millisecond}); err == nil || !strings.Contains(err.Error(), "does not answer") {
		t.Errorf("open: %v", err)
	}
	if _, err := Open(context.Background(), "redis://user:hunter2@127.0.0.1:1/0", Options{Timeout: 200 * time.Millisecond}); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("the password is shown: %v", err)
	}
}

// TestApprovalAcrossReplicas: two replicas sharing the key and the store
// honour each other's approval state, once.
func TestApprovalAcrossReplicas(t *testing.T) {
	r := redisserver.Start(t)
	key := []byte("0123456789abcdef0123456789abcdef")
	a, err := policy.NewSharedSealer(key, time.Minute, nil, open(t, r.URL()).Nonces())
	if err != nil {
		t.Fatal(err)
	}
	b, err := policy.NewSharedSealer(key, time.Minute, nil, open(t, r.URL()).Nonces())
	if err != nil {
		t.Fatal(err)
	}
	args := []byte(`{"code": "print(1)"}`)
	state, err := a.Seal("run_python", "alice", args)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Open(state, "run_python", "bob", args); err != policy.ErrStateMismatch {
		t.Errorf("another caller: %v", err)
	}
	if err := b.Open(state, "run_python", "alice", args); err != nil {
		t.Errorf("through the other replica: %v", err)
	}
	if err := a.Open(state, "run_python", "alice", args); err != policy.ErrStateUsed {
		t.Errorf("a second use, through the first replica: %v", err)
	}
	// Without the shared store, a replica cannot know: each would honour
	// it once (the reason for the store).
	c, _ := policy.NewSharedSealer(key, time.Minute, nil, nil)
	state, _ = a.Seal("run_python", "alice", args)
	if err := c.Open(state, "run_python", "alice", args); err != nil {
		t.Errorf("shared key: %v", err)
	}
}

// TestCounts: the console reads the counts every replica made, per
// identity and global, with the window's reset on the store's clock.
func TestCounts(t *testing.T) {
	r := redisserver.Start(t)
	a, b := open(t, r.URL()).Limiter(), open(t, r.URL()).Limiter()
	ctx := context.Background()
	perID := limit("runs", "hour", 10, policy.ScopeGrant)
	all := limit("all", "day", 100, policy.ScopeGlobal)
	for i, who := range []string{"alice", "alice", "bob"} {
		l := a
		if i%2 == 1 {
			l = b
		}
		if _, ex, err := l.Reserve(ctx, []policy.Limit{perID, all}, who); ex != nil || err != nil {
			t.Fatal(ex, err)
		}
	}
	cr := a.(policy.CountReader)
	n, reset, err := cr.Counts(ctx, perID, []string{"alice", "bob", "carol"})
	if err != nil || len(n) != 3 || n[0] != 2 || n[1] != 1 || n[2] != 0 {
		t.Errorf("per identity: %v %v", n, err)
	}
	if until := time.Until(reset); until <= 0 || until > time.Hour+time.Minute {
		t.Errorf("reset in %s", until)
	}
	if n, _, err := cr.Counts(ctx, all, []string{"alice", "bob"}); err != nil || len(n) != 1 || n[0] != 3 {
		t.Errorf("global: %v %v", n, err)
	}
	r.Stop()
	if _, _, err := cr.Counts(ctx, all, nil); err == nil {
		t.Error("counts from a store that is down")
	}
}
