// Package bench is `pysandbox bench`: it measures, in one process and one
// run, what an agent's print('hi') costs through the engine and through
// MCP stdio, next to spawning the system python3 directly, and prints the
// ratios: only ratios measured in one run mean anything, since machines
// (and one machine from one moment to the next) differ by several times.
// Then the network proxy, one pooled run phase by phase, an upstream tool
// call from Python, and the copy of an environment into the cache.
package bench

import (
	"context"
	"io"
	"os/exec"
	"strings"

	"github.com/pysandbox/pysandbox/internal/egress"
	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/pool"
)

// Config is what the bench command asks for.
type Config struct {
	// N is the iterations per measurement; Concurrency, the calls in
	// flight for the throughput.
	N, Concurrency int
	// Baseline is the interpreter spawned directly for the baselines.
	Baseline string
	// Phases, Network, Tools and Cache each ask for that measurement
	// only (the first set, in that order); none asks for everything.
	Phases, Network, Tools, Cache bool
	// Sandbox is the --sandbox backend, for the report.
	Sandbox string
	// Defaults are the command line's warm pool.
	Defaults Variant
	// CacheDir is the dependency cache, where --cache copies to.
	CacheDir string
	// ServeArgs are the flags of the `pysandbox serve` this binary starts
	// for the MCP measurements: the command line's shared flags.
	ServeArgs []string
	// Version is this binary's, for the MCP clients' names.
	Version string
	// Engine builds the engines measured.
	Engine EngineFunc
	// Out gets the report.
	Out io.Writer
}

// Variant is one measurement's warm pool and network, in place of the
// command line's.
type Variant struct {
	// PoolSize is the children kept ready (0: no pool); Preload, the
	// modules the zygote imports; Learn, --adaptive-preload.
	PoolSize int
	Preload  string
	Learn    int
	// AllowNet, when not nil, are the only hosts runs may reach.
	AllowNet []string
	// Trace, when set, gets the trace of every pooled child.
	Trace func(*pool.Trace)
}

// Engine is an engine built for a measurement.
type Engine struct {
	*engine.Engine
	// Pool is its warm pool; nil without one.
	Pool *pool.Pool
	// Proxy is the network proxy of its runs.
	Proxy *egress.Proxy
	// Release releases what the engine holds; call it when done.
	Release func()
}

// EngineFunc builds the engine the command line describes, as v changes
// it.
type EngineFunc func(ctx context.Context, v Variant) (*Engine, error)

// Run measures what cfg asks for and writes the report to cfg.Out.
func Run(ctx context.Context, cfg Config) error {
	// The pandas comparison is about preloading: make sure the pool has it
	// when this machine has pandas at all.
	hasPandas := exec.Command(cfg.Baseline, "-c", "import pandas").Run() == nil
	if hasPandas && cfg.Defaults.PoolSize > 0 && !strings.Contains(","+cfg.Defaults.Preload+",", ",pandas,") {
		cfg.Defaults.Preload = strings.Trim(cfg.Defaults.Preload+",pandas", ",")
	}
	switch {
	case cfg.Phases:
		return phases(ctx, cfg)
	case cfg.Network:
		return network(ctx, cfg)
	case cfg.Cache:
		return cacheCopy(cfg.CacheDir, cfg.N, cfg.Out)
	case cfg.Tools:
		return upstreamTools(ctx, cfg)
	}
	return everything(ctx, cfg, hasPandas)
}
