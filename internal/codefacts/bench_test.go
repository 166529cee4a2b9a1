package codefacts

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/pool"
	"github.com/pysandbox/pysandbox/internal/sandbox"
	"github.com/pysandbox/pysandbox/internal/testutil"
)

// BenchmarkSpawnPython is the baseline: starting the system interpreter
// directly, with no isolation.
func BenchmarkSpawnPython(b *testing.B) {
	for b.Loop() {
		if err := exec.Command("/usr/bin/python3", "-c", "pass").Run(); err != nil {
			b.Fatal(err)
		}
	}
}

// script500 is a generated script of 500 lines: program's statements
// while they fit, then one-line ones.
func script500() string {
	var b strings.Builder
	for _, line := range strings.SplitAfter(program(64<<10), "\n") {
		n := strings.Count(b.String(), "\n")
		if n == 500 {
			break
		}
		if strings.HasPrefix(line, " ") || n < 499 || !strings.HasSuffix(strings.TrimSpace(line), ":") {
			b.WriteString(line)
		} else {
			b.WriteString("pass\n")
		}
	}
	return b.String()
}

// BenchmarkDerive500Lines derives the facts of a 500-line script, in a
// cold sandbox and from a warm pool (as the server runs by default); the
// ratio to spawning python3 -c pass is reported as x_python3.
func BenchmarkDerive500Lines(b *testing.B) {
	code := script500()
	for _, pooled := range []bool{false, true} {
		name := "cold"
		if pooled {
			name = "pooled"
		}
		b.Run(name, func(b *testing.B) {
			e := newEngine(b, func(c *engine.Config) {
				if pooled {
					poolize(b, c)
				}
			})
			base := testutil.SpawnBaseline(b)
			ctx := context.Background()
			f, err := Derive(ctx, e, code, "") // warm up
			if err != nil {
				b.Fatal(err)
			}
			b.Logf("%s", f.Summary())
			var total time.Duration
			for b.Loop() {
				t := time.Now()
				f, err := Derive(ctx, e, code, "")
				total += time.Since(t)
				if err != nil || f.Lines != 500 || f.SyntaxError != "" || len(f.ProcessCalls) == 0 {
					b.Fatal(err, f)
				}
			}
			b.ReportMetric(float64(total)/float64(b.N)/float64(base), "x_python3")
			b.ReportMetric(float64(base.Microseconds())/1000, "python3_ms")
		})
	}
}

// poolize makes c's backend a warm pool over it, as the server's.
func poolize(b testing.TB, c *engine.Config) {
	cold, err := engine.New(*c)
	if err != nil {
		b.Fatal(err)
	}
	p, err := pool.New(context.Background(), pool.Config{
		Backend: c.Backend.(*sandbox.Native), Spec: cold.RunSpec(), Size: 2,
		MaxConcurrent: c.MaxConcurrent, MemoryBudget: 1 << 30,
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { p.Close() })
	c.Backend = p
}
