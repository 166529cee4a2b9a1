package engine

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"
)

// TestUsageObserver: a run in flight hands its observer a probe that sees
// the memory the code holds and the CPU it has burnt so far, read from
// outside while the code runs (the operator console's CPU and memory
// columns); a session run's CPU counts from the run's start.
func TestUsageObserver(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("usage comes from the sandbox's cgroup, which an unprivileged test run does not get here")
	}
	e := newEngine(t, nil)
	code := "import time\nb = bytearray(64 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nt = time.time()\nwhile time.time() - t < 1.5: pass\nprint('done')\n"
	check := func(t *testing.T, run func(ctx context.Context) (*Result, error)) {
		var (
			mu    sync.Mutex
			probe UsageProbe
		)
		ctx := WithUsageObserver(context.Background(), func(p UsageProbe) { mu.Lock(); probe = p; mu.Unlock() })
		var peak Usage
		done := make(chan *Result, 1)
		go func() {
			r, err := run(ctx)
			if err != nil {
				t.Error(err)
			}
			done <- r
		}()
		for {
			select {
			case r := <-done:
				if r == nil || r.Status != StatusSuccess {
					t.Fatalf("the run: %+v", r)
				}
				if peak.MemoryBytes < 64<<20 || peak.CPU <= 0 {
					t.Errorf("seen while running: %+v", peak)
				}
				t.Logf("seen while running: %d MiB, %s CPU", peak.MemoryBytes>>20, peak.CPU)
				return
			case <-time.After(50 * time.Millisecond):
				mu.Lock()
				p := probe
				mu.Unlock()
				if p != nil {
					u := p()
					peak.MemoryBytes, peak.CPU = max(peak.MemoryBytes, u.MemoryBytes), max(peak.CPU, u.CPU)
				}
			}
		}
	}
	t.Run("one-shot", func(t *testing.T) {
		check(t, func(ctx context.Context) (*Result, error) {
			return e.Run(ctx, RunRequest{Code: code, Timeout: time.Minute})
		})
	})
	t.Run("session", func(t *testing.T) {
		s := e.NewSessions(SessionConfig{MaxSessions: 2})
		defer s.Shutdown()
		info, err := s.Create(context.Background(), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		// CPU burnt by an earlier run is not this run's.
		if r, err := s.Run(context.Background(), info.ID, RunRequest{Code: "t = __import__('time').time()\nwhile __import__('time').time() - t < 1: pass", Timeout: time.Minute}); err != nil || r.Status != StatusSuccess {
			t.Fatalf("warm-up: %v %+v", err, r)
		}
		check(t, func(ctx context.Context) (*Result, error) {
			return s.Run(ctx, info.ID, RunRequest{Code: code, Timeout: time.Minute})
		})
	})
}
