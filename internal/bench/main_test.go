package bench

import (
	"context"
	"flag"
	"os"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/pool"
	"github.com/pysandbox/pysandbox/internal/sandbox"
	"github.com/pysandbox/pysandbox/internal/testutil/enginetest"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

func TestMain(m *testing.M) {
	// The native backend re-executes this test binary as the sandbox init.
	sandbox.InitMain()
	os.Exit(m.Run())
}

// testEngines builds the engines a bench measures as the command line
// does, on enginetest's engine: with a warm pool when the variant has
// one. (No network: the command line's proxy is not built here.)
func testEngines(t *testing.T) EngineFunc {
	return func(ctx context.Context, v Variant) (*Engine, error) {
		cfg := enginetest.Config(t)
		if v.PoolSize == 0 {
			e, err := engine.New(cfg)
			return &Engine{Engine: e, Release: func() {}}, err
		}
		cold, err := engine.New(cfg)
		if err != nil {
			return nil, err
		}
		p, err := pool.New(ctx, pool.Config{Backend: cfg.Backend.(*sandbox.Native), Spec: cold.RunSpec(), Size: v.PoolSize, Learn: v.Learn,
			MaxConcurrent: cfg.MaxConcurrent, MemoryBudget: 1 << 30, Trace: v.Trace})
		if err != nil {
			return nil, err
		}
		cfg.Backend = p
		e, err := engine.New(cfg)
		if err != nil {
			p.Close()
			return nil, err
		}
		return &Engine{Engine: e, Pool: p, Release: func() { p.Close() }}, nil
	}
}

// durations are milliseconds as sorted durations.
func durations(msecs ...float64) []time.Duration {
	d := make([]time.Duration, len(msecs))
	for i, m := range msecs {
		d[i] = time.Duration(m * float64(time.Millisecond))
	}
	return d
}

func mustEqual[T comparable](t *testing.T, what string, got, want T) {
	t.Helper()
	if got != want {
		t.Errorf("%s: got %v, want %v", what, got, want)
	}
}
