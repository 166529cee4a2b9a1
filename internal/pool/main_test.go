package pool

import (
	"context"
	"os"
	"testing"

	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/sandbox"
	"github.com/pysandbox/pysandbox/internal/testutil/enginetest"
)

func TestMain(m *testing.M) {
	// The zygote's sandbox is a native one: this binary is its init.
	sandbox.InitMain()
	os.Exit(m.Run())
}

// newPooledEngine returns an engine whose backend is a real pool over the
// native sandbox, as `pysandbox serve` builds it.
func newPooledEngine(t testing.TB, size int, preload []string, mods ...func(*engine.Config)) (*engine.Engine, *Pool) {
	t.Helper()
	cfg := enginetest.Config(t)
	native := cfg.Backend.(*sandbox.Native)
	for _, m := range mods {
		m(&cfg)
	}
	cold, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(context.Background(), Config{Backend: native, Spec: cold.RunSpec(), Preload: preload, Size: size, MaxConcurrent: 16, MemoryBudget: 2 << 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	cfg.Backend = p
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e, p
}

func nativeOf(t testing.TB) *sandbox.Native {
	t.Helper()
	return sandbox.NewNative()
}

// engineWith builds an engine over an existing pool.
func engineWith(t testing.TB, p *Pool) *engine.Engine { return engineOver(t, p) }

// engineOver builds an engine with the pool tests' settings over backend:
// the same as newPooledEngine's, since only runs with the pool's exact
// spec are pooled.
func engineOver(t testing.TB, backend sandbox.Backend) *engine.Engine {
	t.Helper()
	return enginetest.New(t, func(c *engine.Config) { c.Backend = backend })
}
