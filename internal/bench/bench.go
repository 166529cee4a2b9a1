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
	"fmt"
	"io"
	"os/exec"
	"strings"
	"time"

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
	// Python asks for the managed interpreter measurement only.
	Python bool
	// Sessions asks for the session snapshot measurement only.
	Sessions bool
	// Replicas asks for the call through another replica only.
	Replicas bool
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
	// Log, when set, is told before anything starts how long the
	// measurements should take (Estimate).
	Log io.Writer
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
	// Python, when set, is where managed interpreters come from; runs
	// that name a version get one (only-managed).
	Python *PythonSource
	// MemoryBytes and TmpBytes, when set, replace the command line's
	// --memory and --tmp-size.
	MemoryBytes, TmpBytes int64
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
	if cfg.Log != nil {
		fmt.Fprintf(cfg.Log, "pysandbox bench: %s, %d iterations each: this takes about %s (a rough estimate; a slower machine takes longer)\n",
			sections(cfg), cfg.N, roundEstimate(Estimate(cfg, hasPandas)))
	}
	mc := &missCounter{w: cfg.Out}
	cfg.Out = mc
	err := run(ctx, cfg, hasPandas)
	if f := mc.footer(); f != "" {
		fmt.Fprint(mc.w, f)
	}
	return err
}

// run measures what cfg asks for.
func run(ctx context.Context, cfg Config, hasPandas bool) error {
	switch {
	case cfg.Phases:
		return phases(ctx, cfg)
	case cfg.Network:
		return network(ctx, cfg)
	case cfg.Cache:
		return cacheCopy(cfg.CacheDir, cfg.N, cfg.Out)
	case cfg.Tools:
		return upstreamTools(ctx, cfg)
	case cfg.Python:
		return managedPython(ctx, cfg)
	case cfg.Sessions:
		return sessionSnapshots(ctx, cfg)
	case cfg.Replicas:
		return replicaCalls(ctx, cfg)
	}
	return everything(ctx, cfg, hasPandas)
}

// sections names what cfg measures.
func sections(cfg Config) string {
	switch {
	case cfg.Phases:
		return "--phases"
	case cfg.Network:
		return "--network"
	case cfg.Cache:
		return "--cache"
	case cfg.Tools:
		return "--tools"
	case cfg.Python:
		return "--python"
	case cfg.Sessions:
		return "--sessions"
	case cfg.Replicas:
		return "--replicas"
	}
	return "every section"
}

// Estimate is roughly how long Run takes on an ordinary machine, from
// the iterations and the sections cfg asks for: what each step costs per
// iteration (its pauses between calls included) and once (servers,
// engines and files to set up).
func Estimate(cfg Config, hasPandas bool) time.Duration {
	n := time.Duration(max(cfg.N, 1))
	phases := 4*time.Second + n*200*time.Millisecond // traced runs, untraced runs, the floor
	network := 15 * time.Second
	tools := 10*time.Second + n*10*time.Millisecond
	cache := 5*time.Second + time.Duration(max(cfg.N/10, 3))*3*time.Second
	replicas := 5*time.Second + 2*n*5*time.Millisecond
	switch {
	case cfg.Phases:
		return phases
	case cfg.Network:
		return network
	case cfg.Cache:
		return cache
	case cfg.Tools:
		return tools
	case cfg.Python:
		return time.Duration(max(cfg.N/10, 3))*8*time.Second + n*200*time.Millisecond
	case cfg.Sessions:
		return 10*time.Second + time.Duration(max(cfg.N/10, 3))*6*time.Second + 2*n*50*time.Millisecond
	case cfg.Replicas:
		return replicas
	}
	calls := max(4*cfg.N, 200)
	d := n*50*time.Millisecond + // python3 -c pass
		n*200*time.Millisecond + // the engine, paced and back to back
		3*(2*time.Second+n*350*time.Millisecond) + // three MCP servers: paced, back to back, with progress
		n*200*time.Millisecond + // under a flood
		n*time.Millisecond + // a session
		time.Duration(calls)*60*time.Millisecond/time.Duration(max(cfg.Concurrency, 1))*2 + // throughput
		network + tools + phases + replicas
	if hasPandas {
		d += 10*time.Second + time.Duration(max(cfg.N/5, 3))*600*time.Millisecond + 2*n*200*time.Millisecond
	}
	return d
}

// roundEstimate is d as an estimate reads: to 10 s under two minutes,
// then to the minute.
func roundEstimate(d time.Duration) time.Duration {
	if d < 2*time.Minute {
		return max(d.Round(10*time.Second), 10*time.Second)
	}
	return d.Round(time.Minute)
}
