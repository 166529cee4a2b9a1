package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/pool"
)

// measure runs f once to warm up, then n times, and returns the sorted
// durations.
func measure(n int, f func() error) ([]time.Duration, error) {
	return measureBetween(n, nil, f)
}

// measureBetween is measure with between (when not nil) run, untimed,
// before each call.
func measureBetween(n int, between, f func() error) ([]time.Duration, error) {
	if err := f(); err != nil {
		return nil, err
	}
	d := make([]time.Duration, 0, n)
	for range n {
		if between != nil {
			if err := between(); err != nil {
				return nil, err
			}
		}
		t := time.Now()
		if err := f(); err != nil {
			return nil, err
		}
		d = append(d, time.Since(t))
	}
	slices.Sort(d)
	return d, nil
}

// throughput runs f total times with conc calls in flight and returns the
// calls per second.
func throughput(total, conc int, f func() error) (float64, error) {
	var done atomic.Int64
	var firstErr error
	var mu sync.Mutex
	start := time.Now()
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for done.Add(1) <= int64(total) {
				if err := f(); err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return 0, firstErr
	}
	return float64(total) / time.Since(start).Seconds(), nil
}

// pct is the p-th percentile of sorted (nearest rank).
func pct(sorted []time.Duration, p int) time.Duration {
	i := (len(sorted)*p + 99) / 100
	return sorted[min(max(i-1, 0), len(sorted)-1)]
}

// ratio is a/b, 0 when b is not positive.
func ratio(a, b time.Duration) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// median sorts v and returns its middle (the upper one of an even count).
func median(v []int64) int64 {
	slices.Sort(v)
	return v[len(v)/2]
}

// ms formats d in milliseconds to a tenth; msd to a hundredth.
func ms(d time.Duration) string  { return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000) }
func msd(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d.Microseconds())/1000) }

// waitPoolFull waits until every child the pool keeps is ready (nothing
// to wait for without a pool).
func waitPoolFull(p *pool.Pool, limit time.Duration) {
	if p == nil {
		return
	}
	deadline := time.Now().Add(limit)
	for st := p.Stats(); st.Ready < st.Target && time.Now().Before(deadline); st = p.Stats() {
		time.Sleep(2 * time.Millisecond)
	}
}

// runOK runs req and fails unless it succeeded.
func runOK(ctx context.Context, eng *engine.Engine, req engine.RunRequest) error {
	r, err := eng.Run(ctx, req)
	if err != nil {
		return err
	}
	if r.Status != engine.StatusSuccess {
		return fmt.Errorf("bench run ended %s: %s %s", r.Status, r.Message, r.Stderr)
	}
	return nil
}
