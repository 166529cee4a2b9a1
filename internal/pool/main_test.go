package pool

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/interp"
	"github.com/pysandbox/pysandbox/internal/sandbox"
)

func TestMain(m *testing.M) {
	// The zygote's sandbox is a native one: this binary is its init.
	sandbox.InitMain()
	os.Exit(m.Run())
}

var runLimits = sandbox.Limits{MemoryBytes: 256 << 20, MaxProcs: 64, TmpBytes: 64 << 20}

// newPooledEngine returns an engine whose backend is a real pool over the
// native sandbox, as `pysandbox serve` builds it.
func newPooledEngine(t testing.TB, size int, preload []string, mods ...func(*engine.Config)) (*engine.Engine, *Pool) {
	t.Helper()
	ctx := context.Background()
	py, err := interp.Find(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	native := sandbox.NewNative()
	cfg := engine.Config{
		Backend:        native,
		Python:         py,
		Limits:         runLimits,
		DefaultTimeout: 20 * time.Second,
		MaxTimeout:     60 * time.Second,
		MaxOutput:      1 << 20,
		MaxConcurrent:  16,
		MaxQueue:       64,
	}
	for _, m := range mods {
		m(&cfg)
	}
	cold, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(ctx, Config{Backend: native, Spec: cold.RunSpec(), Preload: preload, Size: size, MaxConcurrent: 16, MemoryBudget: 2 << 30})
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

// engineOver builds an engine with the pool tests' settings over backend.
func engineOver(t testing.TB, backend sandbox.Backend) *engine.Engine {
	t.Helper()
	py, err := interp.Find(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	// The same settings as newPooledEngine: only runs with the pool's exact
	// spec are pooled.
	e, err := engine.New(engine.Config{Backend: backend, Python: py, Limits: runLimits, DefaultTimeout: 20 * time.Second,
		MaxTimeout: 60 * time.Second, MaxOutput: 1 << 20, MaxConcurrent: 16, MaxQueue: 64})
	if err != nil {
		t.Fatal(err)
	}
	return e
}
