package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"

	"github.com/pysandbox/pysandbox/internal/engine"
)

// suite is the full bench on the command line's engine: each step
// measures, then writes its part of the report at once. What a step
// leaves open (the engine, a session, files) stays until the end, the
// network, tools and phase measurements included.
type suite struct {
	ctx       context.Context
	cfg       Config
	hasPandas bool
	eng       *Engine
	r         latencyReport
	// pause is how long an agent thinks between two calls: the pool
	// refills meanwhile.
	pause   time.Duration
	cleanup []func()
}

var hello = engine.RunRequest{Code: "print('hi')"}

// everything is the full bench: latency, throughput, then the network,
// tools, replicas (with a redis-server) and phase measurements.
func everything(ctx context.Context, cfg Config, hasPandas bool) error {
	eng, err := cfg.Engine(ctx, cfg.Defaults)
	if err != nil {
		return err
	}
	s := &suite{ctx: ctx, cfg: cfg, hasPandas: hasPandas, eng: eng}
	defer s.close()
	for _, step := range []func() error{
		s.baseline, s.engineCalls, s.mcpCalls, s.flood, s.pandas, s.session, s.throughput,
		func() error { return network(ctx, cfg) },
		func() error { return upstreamTools(ctx, cfg) },
		func() error { return replicasIfRedis(ctx, cfg) },
		func() error { return phases(ctx, cfg) },
	} {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// close releases what the steps left open, last first, then the engine.
func (s *suite) close() {
	for i := len(s.cleanup) - 1; i >= 0; i-- {
		s.cleanup[i]()
	}
	s.eng.Release()
}

// paced is what happens between two calls of an agent: it reads the
// answer and thinks, and the pool refills meanwhile. The pause is long
// enough for that on this machine (a few process starts), and is not
// timed.
func (s *suite) paced() error {
	waitPoolFull(s.eng.Pool, 10*time.Second)
	time.Sleep(s.pause / 5)
	return nil
}

func (s *suite) baseline() error {
	s.r.sandbox, s.r.poolSize, s.r.preload = s.cfg.Sandbox, s.cfg.Defaults.PoolSize, s.cfg.Defaults.Preload
	s.r.python, s.r.n, s.r.cpus, s.r.baseline = s.eng.Config().Python.Path, s.cfg.N, runtime.NumCPU(), s.cfg.Baseline
	s.r.writeHeader(s.cfg.Out)
	base, err := measure(s.cfg.N, func() error { return exec.Command(s.cfg.Baseline, "-c", "pass").Run() })
	if err != nil {
		return fmt.Errorf("baseline %s -c pass: %w", s.cfg.Baseline, err)
	}
	s.r.base = base
	s.pause = max(50*time.Millisecond, 3*pct(base, 50))
	s.r.writeBaseline(s.cfg.Out)
	return nil
}

func (s *suite) engineCalls() (err error) {
	run := func() error { return runOK(s.ctx, s.eng.Engine, hello) }
	if s.r.eng1, err = measureBetween(s.cfg.N, s.paced, run); err != nil {
		return err
	}
	s.r.engB2B, err = measure(s.cfg.N, run)
	return err
}

// rulesPolicy has five argument conditions on run_python and a rule on
// its code's facts, none of which refuses the benchmark's call.
const rulesPolicy = `{"version": "1", "default": "deny", "tools": {"run_python": {
  "limits": [{"counter": "runs", "window": "second", "max": 1000000}],
  "require": [{"conditions": [{"path": "args.code", "op": "exists", "value": true}]}],
  "deny_if": [
    {"conditions": [{"path": "args.code", "op": "regex", "value": "(?i)rm\\s+-rf"}]},
    {"conditions": [{"path": "args.python_version", "op": "in", "value": ["3.6", "3.7"]}]},
    {"conditions": [{"path": "args.timeout_seconds", "op": "gt", "value": 600}]},
    {"conditions": [{"path": "args.session_id", "op": "contains", "value": ".."}]},
    {"conditions": [{"path": "code.imports", "op": "contains", "value": "socket"}]}
  ]}}}`

// mcpCalls times this binary's `serve` over stdio as the command line
// gives it, then, in turn with another such server, one governed by a
// policy with a rate limit and an audit log, and one whose policy has
// argument conditions and a rule on the code's facts.
func (s *suite) mcpCalls() (err error) {
	args := s.cfg.ServeArgs
	if s.hasPandas && s.cfg.Defaults.PoolSize > 0 {
		args = append(args[:len(args):len(args)], "--preload", s.cfg.Defaults.Preload)
	}
	pause := func() error { time.Sleep(s.pause); return nil }
	if s.r.mcpStdio, s.r.mcpB2B, s.r.mcpProgress, err = mcpLatency(s.ctx, s.cfg, args, pause); err != nil {
		return err
	}
	govDir, err := os.MkdirTemp("", "pysandbox-bench-")
	if err != nil {
		return err
	}
	s.cleanup = append(s.cleanup, func() { os.RemoveAll(govDir) })
	polFile := filepath.Join(govDir, "policy.json")
	if err := os.WriteFile(polFile, []byte(`{"version": "1", "default": "deny", "tools": {"run_python": {"limits": [{"counter": "runs", "window": "second", "max": 1000000}]}}}`), 0o600); err != nil {
		return err
	}
	governed := append(args[:len(args):len(args)], "--policy", polFile, "--audit-log", filepath.Join(govDir, "audit.log"))
	// The policy language at work: five conditions on the arguments, and
	// a rule on the code's facts: derived by Python's parser in the first
	// run's own sandbox before its code runs, then kept for this caller
	// and this code (govern's facts cache), so that the calls timed here,
	// all of the same code, are decided before their run.
	rulesFile := filepath.Join(govDir, "rules.json")
	if err := os.WriteFile(rulesFile, []byte(rulesPolicy), 0o600); err != nil {
		return err
	}
	ruled := append(args[:len(args):len(args)], "--policy", rulesFile, "--audit-log", filepath.Join(govDir, "rules-audit.log"))
	// Against an ungoverned server timed in the same turns.
	alt, err := mcpAlternating(s.ctx, s.cfg, [][]string{args, governed, ruled}, pause)
	if err != nil {
		return err
	}
	s.r.mcpUngoverned, s.r.mcpGoverned, s.r.mcpRules = alt[0], alt[1], alt[2]
	s.r.writeCalls(s.cfg.Out)
	return nil
}

func (s *suite) flood() (err error) {
	if s.r.flooded, err = underFlood(s.ctx, s.eng.Engine, s.cfg.N, 8, hello, s.paced); err != nil {
		return err
	}
	s.r.writeFlood(s.cfg.Out)
	return nil
}

// pandasSnippet is what an agent analysing data runs.
var pandasSnippet = engine.RunRequest{Code: "import pandas as pd\ndf = pd.DataFrame({'x': range(100)})\nint(df.x.sum())"}

// pandas measures a pandas snippet against a cold `import pandas`, and
// on a pool that learned to preload it.
func (s *suite) pandas() (err error) {
	s.r.hasPandas = s.hasPandas
	if !s.hasPandas {
		s.r.writePandas(s.cfg.Out)
		return nil
	}
	if s.r.coldPandas, err = measure(max(s.cfg.N/5, 3), func() error { return exec.Command(s.cfg.Baseline, "-c", "import pandas").Run() }); err != nil {
		return err
	}
	if s.r.pandasRuns, err = measureBetween(s.cfg.N, s.paced, func() error { return runOK(s.ctx, s.eng.Engine, pandasSnippet) }); err != nil {
		return err
	}
	s.r.writePandas(s.cfg.Out)
	if s.cfg.Defaults.PoolSize == 0 || s.cfg.Defaults.Learn == 0 {
		return nil
	}
	if s.r.learned, err = learned(s.ctx, s.cfg, pandasSnippet); err != nil {
		return err
	}
	s.r.writeLearned(s.cfg.Out)
	return nil
}

// learned measures a snippet on a pool started without --preload, after
// enough runs for the pool to preload what the snippet imports.
func learned(ctx context.Context, cfg Config, snippet engine.RunRequest) ([]time.Duration, error) {
	v := cfg.Defaults
	v.Preload = ""
	eng, err := cfg.Engine(ctx, v)
	if err != nil {
		return nil, err
	}
	defer eng.Release()
	deadline := time.Now().Add(time.Minute)
	for {
		if err := runOK(ctx, eng.Engine, snippet); err != nil {
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
	paced := func() error { waitPoolFull(eng.Pool, 10*time.Second); return nil }
	return measureBetween(cfg.N, paced, func() error { return runOK(ctx, eng.Engine, snippet) })
}

// session measures a session's round trip: `x += 1` is ~50 ns of
// Python, so this is the cost of a call on a live session.
func (s *suite) session() error {
	sessions := s.eng.NewSessions(engine.SessionConfig{MaxSessions: 1})
	s.cleanup = append(s.cleanup, sessions.Shutdown)
	info, err := sessions.Create(s.ctx, 0)
	if err != nil {
		return err
	}
	if _, err := sessions.Run(s.ctx, info.ID, engine.RunRequest{Code: "x = 0"}); err != nil {
		return err
	}
	s.r.session, err = measure(s.cfg.N, func() error {
		r, err := sessions.Run(s.ctx, info.ID, engine.RunRequest{Code: "x += 1"})
		if err == nil && r.Status != engine.StatusSuccess {
			err = fmt.Errorf("session run ended %s", r.Status)
		}
		return err
	})
	if err != nil {
		return err
	}
	s.r.writeSession(s.cfg.Out)
	return nil
}

// throughput compares isolated runs, Concurrency in flight, with
// spawning the baseline as many at a time.
func (s *suite) throughput() (err error) {
	s.r.throughputCalls, s.r.concurrency = max(s.cfg.N*4, 200), s.cfg.Concurrency
	if s.r.spawnedPerSecond, err = throughput(s.r.throughputCalls, s.cfg.Concurrency, func() error { return exec.Command(s.cfg.Baseline, "-c", "pass").Run() }); err != nil {
		return err
	}
	waitPoolFull(s.eng.Pool, 10*time.Second)
	if s.r.pooledPerSecond, err = throughput(s.r.throughputCalls, s.cfg.Concurrency, func() error { return runOK(s.ctx, s.eng.Engine, hello) }); err != nil {
		return err
	}
	s.r.writeThroughput(s.cfg.Out)
	return nil
}
