package engine

import (
	"context"
	"os"
	"testing"

	"github.com/pysandbox/pysandbox/internal/deps"
	"github.com/pysandbox/pysandbox/internal/egress"
	"github.com/pysandbox/pysandbox/internal/interp"
	"github.com/pysandbox/pysandbox/internal/sandbox"
	"github.com/pysandbox/pysandbox/internal/testutil/pypi"
)

func TestMain(m *testing.M) {
	// The native backend re-executes this test binary as the sandbox init.
	sandbox.InitMain()
	os.Exit(m.Run())
}

// newEngine builds an engine on the native backend with the system python3,
// the same default a user gets. (Other packages' tests build theirs with
// testutil/enginetest, which imports this package and so cannot be
// imported here.)
func newEngine(t testing.TB, mod func(*Config)) *Engine {
	t.Helper()
	py, err := interp.Find(context.Background(), "")
	if err != nil {
		t.Fatalf("no python3: %v", err)
	}
	cfg := Config{
		Backend:        sandbox.NewNative(),
		Python:         py,
		Limits:         sandbox.Limits{MemoryBytes: 256 << 20, MaxProcs: 64, TmpBytes: 64 << 20},
		DefaultTimeout: 20e9,
		MaxOutput:      1 << 20,
		MaxConcurrent:  16,
		MaxQueue:       64,
	}
	if mod != nil {
		mod(&cfg)
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// testDeps is a dependency cache over the test index idx, its installs in
// native sandboxes with limits (as enginetest.Deps).
func testDeps(t testing.TB, idx *pypi.Index, limits sandbox.Limits) *deps.Cache {
	t.Helper()
	cache, err := deps.New(deps.Config{Dir: t.TempDir(), Index: deps.IndexConfig{IndexURL: idx.URL}, Backend: sandbox.NewNative(), Limits: limits, Network: egress.New(egress.Config{}).Installer})
	if err != nil {
		t.Fatal(err)
	}
	return cache
}
