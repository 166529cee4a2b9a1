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
func newPooledEngine(t testing.TB, size int, preload []string) (*engine.Engine, *Pool) {
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
