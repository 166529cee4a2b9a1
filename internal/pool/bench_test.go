package pool

import (
	"github.com/pysandbox/pysandbox/internal/testutil"

	"context"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/engine"
)

// BenchmarkPooledHello is one-shot print('hi') from the warm pool, each in
// a fresh sandbox; x_python3 is its ratio to spawning python3 -c pass.
func BenchmarkPooledHello(b *testing.B) {
	e, _ := newPooledEngine(b, 4, nil)
	base := testutil.SpawnBaseline(b)
	time.Sleep(500 * time.Millisecond) // let the pool fill
	var total time.Duration
	for b.Loop() {
		t := time.Now()
		r, err := e.Run(context.Background(), engine.RunRequest{Code: "print('hi')"})
		total += time.Since(t)
		if err != nil || r.Status != engine.StatusSuccess {
			b.Fatalf("%v %+v", err, r)
		}
	}
	b.ReportMetric(float64(total)/float64(b.N)/float64(base), "x_python3")
}

// BenchmarkPooledThroughput keeps 16 runs in flight and reports isolated
// runs per second and the whole machine's CPU time per run.
func BenchmarkPooledThroughput(b *testing.B) {
	e, _ := newPooledEngine(b, 4, nil)
	time.Sleep(500 * time.Millisecond)
	var ru0, ru1 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				r, err := e.Run(context.Background(), engine.RunRequest{Code: "print('hi')"})
				if err != nil || r.Status != engine.StatusSuccess {
					b.Errorf("%v %+v", err, r)
					return
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	server := (ru1.Utime.Nano() + ru1.Stime.Nano()) - (ru0.Utime.Nano() + ru0.Stime.Nano())
	b.ReportMetric(float64(b.N)/el.Seconds(), "runs/s")
	b.ReportMetric(float64(server)/1e6/float64(b.N), "server-cpu-ms/run")
}
