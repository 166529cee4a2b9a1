// Package enginetest builds the engines tests run code on: the native
// sandbox and the system python3, with limits that leave a loaded CI host
// room, as `pysandbox serve` builds one but smaller. A test binary that
// uses it runs sandboxes, so its TestMain must call sandbox.InitMain.
//
// The engine's own tests cannot import it (it imports the engine); they
// build theirs alike in internal/engine/main_test.go.
package enginetest

import (
	"context"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/deps"
	"github.com/pysandbox/pysandbox/internal/egress"
	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/interp"
	"github.com/pysandbox/pysandbox/internal/sandbox"
)

// Limits are a test run's limits: 256 MiB of memory, 64 processes and
// 64 MiB of scratch space.
var Limits = sandbox.Limits{MemoryBytes: 256 << 20, MaxProcs: 64, TmpBytes: 64 << 20}

// Python is the system python3, the interpreter a user gets by default;
// the test fails without one.
func Python(t testing.TB) *interp.Interpreter {
	t.Helper()
	py, err := interp.Find(context.Background(), "")
	if err != nil {
		t.Fatalf("no python3: %v", err)
	}
	return py
}

// Config is an engine on a native sandbox with the system python3 and
// Limits: 20 s a run unless it asks (60 s at most), 1 MiB of output per
// stream, 16 runs at once and 64 waiting.
func Config(t testing.TB) engine.Config {
	t.Helper()
	return engine.Config{
		Backend:        sandbox.NewNative(),
		Python:         Python(t),
		Limits:         Limits,
		DefaultTimeout: 20 * time.Second,
		MaxTimeout:     60 * time.Second,
		MaxOutput:      1 << 20,
		MaxConcurrent:  16,
		MaxQueue:       64,
	}
}

// New is an engine of Config, as each of mods changes it in turn.
func New(t testing.TB, mods ...func(*engine.Config)) *engine.Engine {
	t.Helper()
	cfg := Config(t)
	for _, m := range mods {
		m(&cfg)
	}
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// Deps is a dependency cache in a directory of the test's over the
// package index at indexURL (a testutil/pypi index), its installs in
// native sandboxes with limits and a network proxy of their own.
func Deps(t testing.TB, indexURL string, limits sandbox.Limits) *deps.Cache {
	t.Helper()
	cache, err := deps.New(deps.Config{Dir: t.TempDir(), Index: deps.IndexConfig{IndexURL: indexURL}, Backend: sandbox.NewNative(), Limits: limits,
		Network: egress.New(egress.Config{}).Installer})
	if err != nil {
		t.Fatal(err)
	}
	return cache
}
