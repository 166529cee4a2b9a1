package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/pool"
)

// bench measures, in one process and one run, what an agent's print('hi')
// costs through the engine and through MCP stdio, next to spawning the
// system python3 directly, and prints the ratios: only ratios measured in
// one run mean anything, since machines (and one machine from one moment
// to the next) differ by several times.
func bench(args []string, stdout, stderr io.Writer) error {
	fs, o := newFlagSet("bench", "bench [-n N] [--concurrency C] [--phases] [--network] [--tools] [--cache] [flags]", stderr)
	n := fs.Int("n", 50, "iterations per measurement")
	conc := fs.Int("concurrency", 16, "calls in flight for the throughput measurement")
	baselinePy := fs.String("baseline", "/usr/bin/python3", "interpreter spawned directly for the baselines")
	phasesOnly := fs.Bool("phases", false, "print only where one pooled run's time and CPU go, phase by phase")
	netOnly := fs.Bool("network", false, "print only the network proxy's throughput and added latency against a direct download")
	toolsOnly := fs.Bool("tools", false, "print only the round trip of an upstream MCP tool call made from Python, next to the same call made directly by a Go MCP client")
	cacheOnly := fs.Bool("cache", false, "print only the time to copy a 200 MB environment into the cache (--cache-dir), next to cp -a of the same tree")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *n < 1 || *conc < 1 {
		return usageError{fmt.Errorf("-n and --concurrency must be at least 1")}
	}
	// The pandas comparison is about preloading: make sure the pool has it
	// when this machine has pandas at all.
	hasPandas := exec.Command(*baselinePy, "-c", "import pandas").Run() == nil
	if hasPandas && o.poolSize > 0 && !strings.Contains(","+o.preload+",", ",pandas,") {
		o.preload = strings.Trim(o.preload+",pandas", ",")
	}
	log, err := o.logger(io.Discard)
	if err != nil {
		return err
	}
	ctx := context.Background()
	if *phasesOnly {
		return benchPhases(ctx, o, log, *n, stdout)
	}
	if *netOnly {
		return benchNetwork(ctx, o, log, *baselinePy, *n, stdout)
	}
	if *cacheOnly {
		return benchCache(o.cacheDir, *n, stdout)
	}
	if *toolsOnly {
		return benchTools(ctx, *n, args, stdout)
	}
	var p *pool.Pool
	o.onPool = func(pp *pool.Pool) { p = pp }
	eng, release, err := o.engine(ctx, log)
	if err != nil {
		return err
	}
	defer release()
	hello := engine.RunRequest{Code: "print('hi')"}

	fmt.Fprintf(stdout, "pysandbox bench: backend %s, pool size %d, preload %q, python %s, %d iterations each, %d CPUs\n",
		o.sandbox, o.poolSize, o.preload, eng.Config().Python.Path, *n, runtime.NumCPU())
	base, err := measure(*n, func() error { return exec.Command(*baselinePy, "-c", "pass").Run() })
	if err != nil {
		return fmt.Errorf("baseline %s -c pass: %w", *baselinePy, err)
	}
	// An agent calls, reads the answer and thinks before its next call:
	// the pool refills in between. The pause is long enough for that on
	// this machine (a few process starts), and is not timed.
	pause := max(50*time.Millisecond, 3*pct(base, 50))
	paced := func() error {
		waitPoolFull(p, 10*time.Second)
		time.Sleep(pause / 5)
		return nil
	}
	fmt.Fprintf(stdout, "this machine now: %s -c pass takes %s (p50), %s (p99); every figure below is a ratio to one measured in this run\n\n",
		*baselinePy, ms(pct(base, 50)), ms(pct(base, 99)))

	eng1, err := measureBetween(*n, paced, func() error { return runOK(ctx, eng, hello) })
	if err != nil {
		return err
	}
	engB2B, err := measure(*n, func() error { return runOK(ctx, eng, hello) })
	if err != nil {
		return err
	}
	mcpArgs := filterBenchFlags(args)
	if hasPandas && o.poolSize > 0 {
		mcpArgs = append(mcpArgs, "--preload", o.preload)
	}
	mcpPause := func() error { time.Sleep(pause); return nil }
	mcpStdio, mcpB2B, mcpProgress, err := benchMCP(ctx, *n, mcpArgs, mcpPause)
	if err != nil {
		return err
	}

	// The same through governance: a policy with a rate limit and an
	// audit log that is fsynced before every result.
	govDir, err := os.MkdirTemp("", "pysandbox-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(govDir)
	polFile := filepath.Join(govDir, "policy.json")
	if err := os.WriteFile(polFile, []byte(`{"version": "1", "default": "deny", "tools": {"run_python": {"limits": [{"counter": "runs", "window": "second", "max": 1000000}]}}}`), 0o600); err != nil {
		return err
	}
	mcpGoverned, _, _, err := benchMCP(ctx, *n, append(mcpArgs, "--policy", polFile, "--audit-log", filepath.Join(govDir, "audit.log")), mcpPause)
	if err != nil {
		return err
	}

	fmt.Fprintf(stdout, "%-56s %9s %9s %10s\n", "", "p50", "p99", "ratio p50")
	row := func(name string, d, ref []time.Duration, refName, goal string) {
		fmt.Fprintf(stdout, "%-56s %9s %9s %9.2fx %s", name, ms(pct(d, 50)), ms(pct(d, 99)), ratio(pct(d, 50), pct(ref, 50)), refName)
		if goal != "" {
			fmt.Fprintf(stdout, " (goal %s)", goal)
		}
		fmt.Fprintln(stdout)
	}
	row(*baselinePy+" -c pass (spawned directly)", base, base, "", "")
	row("engine: print('hi'), one call at a time", eng1, base, "of python3 -c pass", "")
	row("  the same, calls back to back (no pause)", engB2B, base, "of python3 -c pass", "")
	row("MCP stdio tools/call run_python print('hi')", mcpStdio, base, "of python3 -c pass", "<= 0.30x")
	fmt.Fprintf(stdout, "%-56s %9s %9s %9.2fx %s\n", "  its p99", "", "", ratio(pct(mcpStdio, 99), pct(mcpStdio, 50)), "of its p50 (goal <= 3x)")
	row("  the same, calls back to back (no pause)", mcpB2B, base, "of python3 -c pass", "")
	row("  the same with --policy and --audit-log", mcpGoverned, mcpStdio, "of ungoverned MCP", "<= 1.10x")
	row("  the same with a progress token (heartbeat, live output)", mcpProgress, mcpStdio, "of the call without one", "")
	flooded, err := benchUnderFlood(ctx, eng, *n, 8, hello, paced)
	if err != nil {
		return err
	}
	row("engine: print('hi') with 8 CPU-burning runs in flight", flooded, eng1, "of the same without them", "")

	if hasPandas {
		coldPandas, err := measure(max(*n/5, 3), func() error { return exec.Command(*baselinePy, "-c", "import pandas").Run() })
		if err != nil {
			return err
		}
		snippet := engine.RunRequest{Code: "import pandas as pd\ndf = pd.DataFrame({'x': range(100)})\nint(df.x.sum())"}
		pandasRuns, err := measureBetween(*n, paced, func() error { return runOK(ctx, eng, snippet) })
		if err != nil {
			return err
		}
		row(*baselinePy+" -c 'import pandas' (spawned directly)", coldPandas, coldPandas, "", "")
		row("engine: pandas DataFrame snippet, one call at a time", pandasRuns, coldPandas, "of cold import pandas", "<= 0.05x")
		if o.poolSize > 0 && o.learnPreload > 0 {
			learned, err := benchLearned(ctx, o, log, snippet, *n)
			if err != nil {
				return err
			}
			row("  the same without --preload, once the pool learned it", learned, coldPandas, "of cold import pandas", "")
		}
	} else {
		fmt.Fprintln(stdout, "(pandas is not installed for "+*baselinePy+": pandas comparison skipped; apt-get install python3-pandas)")
	}

	// A session's round trip: `x += 1` is ~50 ns of Python, so this is
	// the cost of a call on a live session.
	sessions := eng.NewSessions(engine.SessionConfig{MaxSessions: 1})
	defer sessions.Shutdown()
	info, err := sessions.Create(ctx, 0)
	if err != nil {
		return err
	}
	if _, err := sessions.Run(ctx, info.ID, engine.RunRequest{Code: "x = 0"}); err != nil {
		return err
	}
	sess, err := measure(*n, func() error {
		r, err := sessions.Run(ctx, info.ID, engine.RunRequest{Code: "x += 1"})
		if err == nil && r.Status != engine.StatusSuccess {
			err = fmt.Errorf("session run ended %s", r.Status)
		}
		return err
	})
	if err != nil {
		return err
	}
	row("session: `x += 1` round trip", sess, base, "of python3 -c pass", "p50 < 1ms")

	total := max(*n*4, 200)
	spawned, err := throughput(total, *conc, func() error { return exec.Command(*baselinePy, "-c", "pass").Run() })
	if err != nil {
		return err
	}
	waitPoolFull(p, 10*time.Second)
	pooled, err := throughput(total, *conc, func() error { return runOK(ctx, eng, hello) })
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nthroughput, %d calls %d at a time: %.0f isolated print('hi') runs/s, %.2fx of spawning %s -c pass %d at a time (%.0f/s) (goal >= 2x)\n",
		total, *conc, pooled, pooled/spawned, *baselinePy, *conc, spawned)
	if err := benchNetwork(ctx, o, log, *baselinePy, *n, stdout); err != nil {
		return err
	}
	if err := benchTools(ctx, *n, args, stdout); err != nil {
		return err
	}
	return benchPhases(ctx, o, log, *n, stdout)
}

// throughput runs f total times with conc calls in flight and returns the
// calls per second.
func throughput(total, conc int, f func() error) (float64, error) {
	var done atomic.Int64
	var firstErr error
	var mu sync.Mutex
	start := time.Now()
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for done.Add(1) <= int64(total) {
				if err := f(); err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return 0, firstErr
	}
	return float64(total) / time.Since(start).Seconds(), nil
}

// waitPoolFull waits until every child the pool keeps is ready (nothing
// to wait for without a pool).
func waitPoolFull(p *pool.Pool, limit time.Duration) {
	if p == nil {
		return
	}
	deadline := time.Now().Add(limit)
	for st := p.Stats(); st.Ready < st.Target && time.Now().Before(deadline); st = p.Stats() {
		time.Sleep(2 * time.Millisecond)
	}
}

func ratio(a, b time.Duration) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func runOK(ctx context.Context, eng *engine.Engine, req engine.RunRequest) error {
	r, err := eng.Run(ctx, req)
	if err != nil {
		return err
	}
	if r.Status != engine.StatusSuccess {
		return fmt.Errorf("bench run ended %s: %s %s", r.Status, r.Message, r.Stderr)
	}
	return nil
}

// benchLearned measures a snippet on a pool started without --preload,
// after enough runs for the pool to preload what the snippet imports.
func benchLearned(ctx context.Context, o *options, log *slog.Logger, snippet engine.RunRequest, n int) ([]time.Duration, error) {
	lo := *o
	lo.preload = ""
	var p *pool.Pool
	lo.onPool = func(pp *pool.Pool) { p = pp }
	eng, release, err := lo.engine(ctx, log)
	if err != nil {
		return nil, err
	}
	defer release()
	deadline := time.Now().Add(time.Minute)
	for {
		if err := runOK(ctx, eng, snippet); err != nil {
			return nil, err
		}
		if info := eng.PoolInfo(); info != nil && len(info.Learned) > 0 {
			break
		}
		if time.Now().After(deadline) {
			return nil, errors.New("bench: the pool did not learn to preload the snippet's imports within a minute")
		}
	}
	// One call at a time, as for the preloaded pool.
	paced := func() error { waitPoolFull(p, 10*time.Second); return nil }
	return measureBetween(n, paced, func() error { return runOK(ctx, eng, snippet) })
}

// benchMCP starts this binary as `serve` over stdio with the same flags and
// times tools/call round trips from a real SDK client: n calls with
// between() before each (not timed), then n back to back.
func benchMCP(ctx context.Context, n int, args []string, between func() error) (paced, backToBack, withProgress []time.Duration, err error) {
	self, err := os.Executable()
	if err != nil {
		return nil, nil, nil, err
	}
	serveArgs := append([]string{"serve", "--log-level", "error"}, filterBenchFlags(args)...)
	cmd := exec.Command(self, serveArgs...)
	cmd.Stderr = os.Stderr
	client := mcp.NewClient(&mcp.Implementation{Name: "pysandbox-bench", Version: version}, nil)
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("start MCP server: %w", err)
	}
	defer cs.Close()
	calls := 0
	call := func(progress bool) func() error {
		return func() error {
			params := &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "print('hi')"}}
			if progress {
				// With a token, the server watches the call (heartbeat
				// and live output): what that costs.
				calls++
				params.Meta = mcp.Meta{"progressToken": fmt.Sprint("bench-", calls)}
			}
			res, err := cs.CallTool(ctx, params)
			if err != nil {
				return err
			}
			if res.IsError {
				return fmt.Errorf("run_python failed: %v", res.Content)
			}
			return nil
		}
	}
	// Let its pool fill before anything is timed.
	time.Sleep(1500 * time.Millisecond)
	// With and without a token, interleaved, so both see the same machine.
	var plain, tokened []time.Duration
	for range n {
		for _, p := range []bool{false, true} {
			if err := between(); err != nil {
				return nil, nil, nil, err
			}
			start := time.Now()
			if err := call(p)(); err != nil {
				return nil, nil, nil, err
			}
			if p {
				tokened = append(tokened, time.Since(start))
			} else {
				plain = append(plain, time.Since(start))
			}
		}
	}
	if backToBack, err = measure(n, call(false)); err != nil {
		return nil, nil, nil, err
	}
	return plain, backToBack, tokened, nil
}

// filterBenchFlags keeps the shared flags and drops bench's own.
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
		if len(s) >= len(p) && s[:len(p)] == p {
			return true
		}
	}
	return false
}

// measure runs f once to warm up, then n times, and returns the sorted
// durations.
func measure(n int, f func() error) ([]time.Duration, error) {
	return measureBetween(n, nil, f)
}

// measureBetween is measure with between (when not nil) run, untimed,
// before each call.
func measureBetween(n int, between, f func() error) ([]time.Duration, error) {
	if err := f(); err != nil {
		return nil, err
	}
	d := make([]time.Duration, 0, n)
	for range n {
		if between != nil {
			if err := between(); err != nil {
				return nil, err
			}
		}
		t := time.Now()
		if err := f(); err != nil {
			return nil, err
		}
		d = append(d, time.Since(t))
	}
	slices.Sort(d)
	return d, nil
}

func pct(sorted []time.Duration, p int) time.Duration {
	i := (len(sorted)*p + 99) / 100
	return sorted[min(max(i-1, 0), len(sorted)-1)]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000) }
