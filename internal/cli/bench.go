package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"

	"github.com/pysandbox/pysandbox/internal/bench"
	"github.com/pysandbox/pysandbox/internal/pool"
	"github.com/pysandbox/pysandbox/internal/pydist"
)

// benchCmd is `pysandbox bench`: its flags, then internal/bench measures.
func benchCmd(args []string, stdout, stderr io.Writer) error {
	fs, o := newFlagSet("bench", "bench [-n N] [--concurrency C] [--phases] [--network] [--tools] [--cache] [--python] [--sessions] [--replicas] [--cpuprofile FILE] [flags]", stderr)
	cfg := bench.Config{Out: stdout, Log: stderr, Version: version}
	fs.IntVar(&cfg.N, "n", 50, "iterations per measurement")
	fs.IntVar(&cfg.Concurrency, "concurrency", 16, "calls in flight for the throughput measurement")
	fs.StringVar(&cfg.Baseline, "baseline", "/usr/bin/python3", "interpreter spawned directly for the baselines")
	fs.BoolVar(&cfg.Phases, "phases", false, "print only where one pooled run's time and CPU go, phase by phase (traced runs), its CPU in all on untraced runs, and the floor: a warm python3's fork, namespaces and exit")
	fs.BoolVar(&cfg.Network, "network", false, "print only the network proxy's throughput and added latency against a direct download")
	fs.BoolVar(&cfg.Tools, "tools", false, "print only the round trip of an upstream MCP tool call made from Python, next to the same call made directly by a Go MCP client")
	fs.BoolVar(&cfg.Sessions, "sessions", false, "print only the pause and resume of a session holding a 100 MB pandas DataFrame and 1 000 small objects, next to pickle.dump and pickle.load of them, and the cost of --checkpoint every-run on a trivial session call")
	fs.BoolVar(&cfg.Replicas, "replicas", false, "print only a trivial session call (x += 1) at the replica that owns the session and through another one, which forwards it: two replicas of serve --http --internal-http on a Redis of their own (needs redis-server on PATH: apt-get install redis-server)")
	var cpuprofile string
	fs.StringVar(&cpuprofile, "cpuprofile", "", "write a Go CPU profile of this process (the server's side: engine, pool, bench) to this file, for go tool pprof")
	fs.BoolVar(&cfg.Cache, "cache", false, "print only the time to copy a 200 MB environment into the cache (--cache-dir), next to cp -a of the same tree")
	// --python alone asks for the managed Python measurement; with a
	// value (--python=3.12) it is the interpreter, as everywhere else.
	pf := fs.Lookup("python")
	pf.Value = &benchPython{interp: &o.python, section: &cfg.Python}
	pf.Usage = "alone: print only a managed Python's first run (downloaded from a mirror on loopback: an archive built from this machine's python3), next to curl | tar of the same archive, and its warm runs next to the system Python's; --python=PATH|VERSION: the interpreter, as for serve"
	pf.DefValue = ""
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("bench takes no arguments (got %q); to pick the interpreter write --python=%s", fs.Arg(0), fs.Arg(0))}
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
	if cpuprofile != "" {
		f, err := os.Create(cpuprofile)
		if err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	// Ctrl-C (or SIGTERM) ends the measurement through its context, so
	// that what it made (temporary directories, servers, their sandboxes)
	// is removed on the way out; a second one quits at once.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sig)
	finished := make(chan struct{})
	defer close(finished)
	go func() {
		select {
		case <-sig:
			signal.Stop(sig)
			fmt.Fprintln(stderr, "pysandbox bench: interrupted; cleaning up (interrupt again to quit at once)")
			cancel()
		case <-finished:
		}
	}()
	err = bench.Run(ctx, cfg)
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted")
	}
	return err
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
		if v.MemoryBytes > 0 {
			lo.memory = size(v.MemoryBytes)
		}
		if v.TmpBytes > 0 {
			lo.tmpSize = size(v.TmpBytes)
		}
		if v.Python != nil {
			lo.pyMetadata, lo.pyMirror, lo.cacheDir = v.Python.Metadata, v.Python.Mirror, v.Python.CacheDir
			lo.pyDownloads, lo.pyPreference = string(pydist.Automatic), string(pydist.OnlyManaged)
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
		case "-n", "--n", "-concurrency", "--concurrency", "-baseline", "--baseline", "-cpuprofile", "--cpuprofile":
			i++
			continue
		case "-phases", "--phases", "-network", "--network", "-tools", "--tools", "-cache", "--cache", "-python", "--python", "-sessions", "--sessions", "-replicas", "--replicas":
			continue
		}
		if hasPrefixAny(a, "-n=", "--n=", "-concurrency=", "--concurrency=", "-baseline=", "--baseline=", "-cpuprofile=", "--cpuprofile=") {
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

// benchPython is bench's --python: a section when given alone, the
// interpreter when given a value.
type benchPython struct {
	interp  *string
	section *bool
}

func (b *benchPython) IsBoolFlag() bool { return true }
func (b *benchPython) String() string {
	if b == nil || b.interp == nil {
		return ""
	}
	return *b.interp
}
func (b *benchPython) Set(v string) error {
	if v == "true" {
		*b.section = true
		return nil
	}
	*b.interp = v
	return nil
}
