package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/pysandbox/pysandbox/internal/bench"
	"github.com/pysandbox/pysandbox/internal/pool"
)

// benchCmd is `pysandbox bench`: its flags, then internal/bench measures.
func benchCmd(args []string, stdout, stderr io.Writer) error {
	fs, o := newFlagSet("bench", "bench [-n N] [--concurrency C] [--phases] [--network] [--tools] [--cache] [flags]", stderr)
	cfg := bench.Config{Out: stdout, Log: stderr, Version: version}
	fs.IntVar(&cfg.N, "n", 50, "iterations per measurement")
	fs.IntVar(&cfg.Concurrency, "concurrency", 16, "calls in flight for the throughput measurement")
	fs.StringVar(&cfg.Baseline, "baseline", "/usr/bin/python3", "interpreter spawned directly for the baselines")
	fs.BoolVar(&cfg.Phases, "phases", false, "print only where one pooled run's time and CPU go, phase by phase")
	fs.BoolVar(&cfg.Network, "network", false, "print only the network proxy's throughput and added latency against a direct download")
	fs.BoolVar(&cfg.Tools, "tools", false, "print only the round trip of an upstream MCP tool call made from Python, next to the same call made directly by a Go MCP client")
	fs.BoolVar(&cfg.Cache, "cache", false, "print only the time to copy a 200 MB environment into the cache (--cache-dir), next to cp -a of the same tree")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if cfg.N < 1 || cfg.Concurrency < 1 {
		return usageError{fmt.Errorf("-n and --concurrency must be at least 1")}
	}
	log, err := o.logger(io.Discard)
	if err != nil {
		return err
	}
	cfg.Sandbox, cfg.CacheDir = o.sandbox, o.cacheDir
	cfg.Defaults = bench.Variant{PoolSize: o.poolSize, Preload: o.preload, Learn: o.learnPreload}
	cfg.ServeArgs = filterBenchFlags(args)
	cfg.Engine = o.benchEngine(log)
	return bench.Run(context.Background(), cfg)
}

// benchEngine builds the engines bench measures: the one the flags
// describe, with v's pool and network.
func (o *options) benchEngine(log *slog.Logger) bench.EngineFunc {
	return func(ctx context.Context, v bench.Variant) (*bench.Engine, error) {
		lo := *o
		lo.poolSize, lo.preload, lo.learnPreload, lo.trace = v.PoolSize, v.Preload, v.Learn, v.Trace
		if v.AllowNet != nil {
			lo.allowNet, lo.netRules = v.AllowNet, nil
		}
		var p *pool.Pool
		lo.onPool = func(pp *pool.Pool) { p = pp }
		eng, release, err := lo.engine(ctx, log)
		if err != nil {
			return nil, err
		}
		return &bench.Engine{Engine: eng, Pool: p, Proxy: lo.proxy, Release: release}, nil
	}
}

// filterBenchFlags keeps the shared flags, for the servers bench starts,
// and drops bench's own.
func filterBenchFlags(args []string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch a {
		case "-n", "--n", "-concurrency", "--concurrency", "-baseline", "--baseline":
			i++
			continue
		case "-phases", "--phases", "-network", "--network", "-tools", "--tools", "-cache", "--cache":
			continue
		}
		if hasPrefixAny(a, "-n=", "--n=", "-concurrency=", "--concurrency=", "-baseline=", "--baseline=") {
			continue
		}
		out = append(out, a)
	}
	return out
}

func hasPrefixAny(s string, ps ...string) bool {
	for _, p := range ps {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}
