package engine

import (
	"github.com/pysandbox/pysandbox/internal/testutil"
	"github.com/pysandbox/pysandbox/internal/testutil/pypi"

	"context"
	"os/exec"
	"testing"
	"time"
)

// BenchmarkSpawnPython is the baseline every other figure is compared
// with: starting the system interpreter directly, with no isolation.
func BenchmarkSpawnPython(b *testing.B) {
	for b.Loop() {
		if err := exec.Command("/usr/bin/python3", "-c", "pass").Run(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRunHello is one-shot print('hi') in a fresh native sandbox. The
// ratio to BenchmarkSpawnPython is reported as x_python3.
func BenchmarkRunHello(b *testing.B) {
	e := newEngine(b, nil)
	base := testutil.SpawnBaseline(b)
	ctx := context.Background()
	var total time.Duration
	for b.Loop() {
		t := time.Now()
		r, err := e.Run(ctx, RunRequest{Code: "print('hi')"})
		total += time.Since(t)
		if err != nil || r.Status != StatusSuccess {
			b.Fatalf("%v %+v", err, r)
		}
	}
	b.ReportMetric(float64(total)/float64(b.N)/float64(base), "x_python3")
}

// BenchmarkRunHelloParallel measures throughput with many runs in flight.
func BenchmarkRunHelloParallel(b *testing.B) {
	e := newEngine(b, nil)
	ctx := context.Background()
	b.SetParallelism(8) // 8 × GOMAXPROCS goroutines: 16 in flight on 2 cores
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r, err := e.Run(ctx, RunRequest{Code: "print('hi')"})
			if err != nil || r.Status != StatusSuccess {
				b.Errorf("%v %+v", err, r)
				return
			}
		}
	})
}

// BenchmarkSessionRoundTrip is one run_python call on a live session doing
// `x += 1`: the Python work is ~50 ns, so ns/op is the round trip's own
// cost (request, compile, run, output sync, reply).
func BenchmarkSessionRoundTrip(b *testing.B) {
	e := newEngine(b, nil)
	s := e.NewSessions(SessionConfig{})
	defer s.Shutdown()
	info, err := s.Create(context.Background(), 0)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if _, err := s.Run(ctx, info.ID, RunRequest{Code: "x = 0"}); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		r, err := s.Run(ctx, info.ID, RunRequest{Code: "x += 1"})
		if err != nil || r.Status != StatusSuccess {
			b.Fatalf("%v %+v", err, r)
		}
	}
}

// BenchmarkCachedDependencies compares a one-shot run whose dependencies
// are already in the cache with the same run without dependencies, both
// from a warm pool (the environment gets a zygote of its own); the
// difference, over_ms, is what the dependencies cost per run.
func BenchmarkCachedDependencies(b *testing.B) {
	idx := pypi.NewIndex(b, alpha, beta)
	e := newEngine(b, func(c *Config) {
		c.Deps = testDeps(b, idx, c.Limits)
		poolize(b, c)
	})
	ctx := context.Background()
	with := RunRequest{Code: "import pysbx_alpha\npysbx_alpha.VALUE", Dependencies: []string{"pysbx-alpha"}}
	without := RunRequest{Code: "'alpha+pysbx-beta-1.2.0'"}
	for _, r := range []RunRequest{with, without, with, without} { // build, then warm both zygotes
		if res, err := e.Run(ctx, r); err != nil || res.Status != StatusSuccess {
			b.Fatalf("%v %+v", err, res)
		}
	}
	var tWith, tWithout time.Duration
	for b.Loop() {
		for i, r := range []RunRequest{with, without} {
			t := time.Now()
			res, err := e.Run(ctx, r)
			d := time.Since(t)
			if err != nil || res.Status != StatusSuccess {
				b.Fatalf("%v %+v", err, res)
			}
			if i == 0 {
				tWith += d
			} else {
				tWithout += d
			}
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(tWith.Microseconds())/1000/n, "with_ms")
	b.ReportMetric(float64(tWithout.Microseconds())/1000/n, "without_ms")
	b.ReportMetric(float64((tWith-tWithout).Microseconds())/1000/n, "over_ms")
}
