package policy

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"
)

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

func TestLimiterWindows(t *testing.T) {
	clock := &fakeClock{t: time.Date(2026, 11, 22, 10, 0, 30, 0, time.UTC)}
	l := NewLimiter(clock.now)
	lim := []Limit{{Counter: "runs", Window: "minute", Period: time.Minute, Max: 2, Scope: ScopeGrant}}
	for i := range 2 {
		if _, ex := l.Take(lim, "alice"); ex != nil {
			t.Fatalf("call %d refused: %v", i, ex)
		}
	}
	_, ex := l.Take(lim, "alice")
	if ex == nil {
		t.Fatal("third call in the minute allowed")
	}
	if want := time.Date(2026, 11, 22, 10, 1, 0, 0, time.UTC); !ex.ResetAt.Equal(want) {
		t.Errorf("resets at %s, want %s", ex.ResetAt, want)
	}
	if msg := ex.Error(); !strings.Contains(msg, `"runs": 2 per minute per identity`) || !strings.Contains(msg, "2026-11-22T10:01:00Z (in 30s)") {
		t.Errorf("message %q", msg)
	}
	// Per identity: bob has his own count.
	if _, ex := l.Take(lim, "bob"); ex != nil {
		t.Errorf("bob refused: %v", ex)
	}
	clock.add(30 * time.Second)
	if _, ex := l.Take(lim, "alice"); ex != nil {
		t.Errorf("new minute, alice refused: %v", ex)
	}
}

func TestLimiterGlobalSharedAndAtomic(t *testing.T) {
	clock := &fakeClock{t: time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)}
	l := NewLimiter(clock.now)
	// Two tools drawing on one global counter, one of them also with a
	// tight per-identity limit.
	shared := Limit{Counter: "exec", Window: "hour", Period: time.Hour, Max: 3, Scope: ScopeGlobal}
	tight := Limit{Counter: "burst", Window: "second", Period: time.Second, Max: 1, Scope: ScopeClient}
	if _, ex := l.Take([]Limit{shared, tight}, "a"); ex != nil {
		t.Fatal(ex)
	}
	// Refused by tight: shared must not be counted.
	if _, ex := l.Take([]Limit{shared, tight}, "a"); ex == nil || ex.Limit.Counter != "burst" {
		t.Fatalf("want burst exceeded, got %v", ex)
	}
	if _, ex := l.Take([]Limit{shared}, "b"); ex != nil {
		t.Fatal(ex)
	}
	if _, ex := l.Take([]Limit{shared}, "c"); ex != nil {
		t.Fatal(ex)
	}
	if _, ex := l.Take([]Limit{shared}, "d"); ex == nil || ex.Limit.Counter != "exec" {
		t.Fatalf("the shared global count should be used up: %v", ex)
	}
}

func TestLimiterCancel(t *testing.T) {
	clock := &fakeClock{t: time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)}
	l := NewLimiter(clock.now)
	lim := []Limit{{Counter: "c", Window: "day", Period: 24 * time.Hour, Max: 1, Scope: ScopeGlobal}}
	r, ex := l.Take(lim, "")
	if ex != nil {
		t.Fatal(ex)
	}
	r.Cancel()
	r.Cancel() // twice is harmless
	if _, ex := l.Take(lim, ""); ex != nil {
		t.Fatalf("cancelled call still counted: %v", ex)
	}
	if _, ex := l.Take(lim, ""); ex == nil {
		t.Fatal("second call allowed")
	}
}

func TestLimiterConcurrent(t *testing.T) {
	l := NewLimiter(nil)
	lim := []Limit{{Counter: "c", Window: "hour", Period: time.Hour, Max: 50, Scope: ScopeGlobal}}
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok := 0
	for range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, ex := l.Take(lim, ""); ex == nil {
				mu.Lock()
				ok++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	// A call made right at the turn of the hour could land in the next
	// window; allow for that.
	if ok < 50 || ok > 100 {
		t.Errorf("%d of 200 allowed, want 50", ok)
	}
}

func TestLimiterSweep(t *testing.T) {
	clock := &fakeClock{t: time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)}
	l := NewLimiter(clock.now)
	lim := []Limit{{Counter: "c", Window: "second", Period: time.Second, Max: 1, Scope: ScopeClient}}
	for i := range 5000 {
		l.Take(lim, strings.Repeat("x", i%50)+string(rune('a'+i%26))+time.Duration(i).String())
		clock.add(10 * time.Millisecond)
	}
	if n := len(l.counts); n > 4200 {
		t.Errorf("%d windows kept; ended ones should be swept", n)
	}
}

func TestLimiterCounts(t *testing.T) {
	clk := &fakeClock{t: time.Date(2026, 11, 25, 10, 30, 0, 0, time.UTC)}
	l := NewLimiter(clk.now)
	perID := Limit{Counter: "runs", Window: "hour", Max: 5, Scope: ScopeGrant, Period: time.Hour}
	all := Limit{Counter: "all", Window: "minute", Max: 50, Scope: ScopeGlobal, Period: time.Minute}
	l.Take([]Limit{perID, all}, "alice")
	l.Take([]Limit{perID, all}, "alice")
	l.Take([]Limit{perID, all}, "bob")
	n, reset, _ := l.Counts(context.Background(), perID, []string{"alice", "bob", "carol"})
	if len(n) != 3 || n[0] != 2 || n[1] != 1 || n[2] != 0 || !reset.Equal(time.Date(2026, 11, 25, 11, 0, 0, 0, time.UTC)) {
		t.Errorf("per identity: %v, resets %s", n, reset)
	}
	if n, _, _ := l.Counts(context.Background(), all, []string{"alice"}); len(n) != 1 || n[0] != 3 {
		t.Errorf("global: %v", n)
	}
	clk.add(time.Minute)
	if n, _, _ := l.Counts(context.Background(), all, nil); n[0] != 0 {
		t.Errorf("a new window: %v", n)
	}
}
