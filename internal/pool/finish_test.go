package pool

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/sandbox"
	"github.com/pysandbox/pysandbox/internal/testutil/afterlife"
	"github.com/pysandbox/pysandbox/internal/testutil/enginetest"
)

// TestOneshotAnswersBeforeTeardown covers the engine's early answer for
// pooled one-shot runs: the answer waits for the reply and for all of the
// output (however much, atexit handlers' included), and a process the run
// left holding the output delays it only until the sandbox is gone.
func TestOneshotAnswersBeforeTeardown(t *testing.T) {
	e, _ := newPooledEngine(t, 2, nil)
	ctx := context.Background()
	r, err := e.Run(ctx, engine.RunRequest{Code: `
import atexit, sys
atexit.register(print, "bye from atexit")
for i in range(20000):
    print("line %05d" % i)
print("to stderr", file=sys.stderr)
`})
	if err != nil || r.Status != engine.StatusSuccess {
		t.Fatalf("%v %+v", err, r)
	}
	lines := strings.Split(strings.TrimSuffix(r.Stdout, "\n"), "\n")
	if len(lines) != 20001 || lines[0] != "line 00000" || lines[19999] != "line 19999" || lines[20000] != "bye from atexit" {
		t.Errorf("stdout incomplete: %d lines, ends %q", len(lines), lines[len(lines)-1])
	}
	if r.Stderr != "to stderr\n" {
		t.Errorf("stderr %q", r.Stderr)
	}

	// A child process keeps stdout open past the run: the answer comes when
	// the sandbox (and with it that process) is gone, not at its timeout.
	r, err = e.Run(ctx, engine.RunRequest{Code: `
import subprocess
subprocess.Popen(["sh", "-c", "echo late; exec sleep 120"])
print("main")
`})
	if err != nil || r.Status != engine.StatusSuccess || !strings.Contains(r.Stdout, "main") {
		t.Fatalf("%v %+v", err, r)
	}

	// A run's figures are its own: the next run on a recycled cgroup starts
	// from zero.
	big, err := e.Run(ctx, engine.RunRequest{Code: "x = bytearray(64 << 20)\nsum(x[::4096])"})
	if err != nil || big.Status != engine.StatusSuccess {
		t.Fatalf("%v %+v", err, big)
	}
	small, err := e.Run(ctx, engine.RunRequest{Code: "print('small')"})
	if err != nil || small.Status != engine.StatusSuccess {
		t.Fatalf("%v %+v", err, small)
	}
	if big.PeakMemoryBytes < 64<<20 {
		t.Errorf("the 64 MiB run peaked at %d bytes", big.PeakMemoryBytes)
	}
	if small.PeakMemoryBytes >= 64<<20 {
		t.Errorf("the next run reports a peak of %d bytes: the last run's figure carried over", small.PeakMemoryBytes)
	}
}

// TestNothingRunsAfterTheAnswer: a pooled run that tries to go on after
// its reply (a thread that never ends, an atexit handler registered during
// atexit) is stopped by the time the caller has its answer.
func TestNothingRunsAfterTheAnswer(t *testing.T) {
	e, _ := newPooledEngine(t, 1, nil)
	r, err := e.Run(context.Background(), engine.RunRequest{Code: afterlife.Code("pooledafter")})
	if err != nil || r.Status != engine.StatusSuccess || r.Stdout != "renamed\n" {
		t.Fatalf("%v %+v", err, r)
	}
	afterlife.Check(t, "pooledafter")
}

// TestOneshotWaitsForThreads: as a script's interpreter does, a one-shot
// run waits for its non-daemon threads before its atexit handlers and its
// answer, so what they print is part of the output.
func TestOneshotWaitsForThreads(t *testing.T) {
	e, _ := newPooledEngine(t, 1, nil)
	r, err := e.Run(context.Background(), engine.RunRequest{Code: afterlife.Threads})
	if err != nil || r.Status != engine.StatusSuccess || r.Stdout != afterlife.ThreadsOut {
		t.Fatalf("%v %+v", err, r)
	}
}

// TestEndLeavesNoProcess: a pooled run ends by the death of its pid 1
// alone (no walk of its cgroup), so every process it left behind must
// die with it: daemons in sessions of their own that ignore SIGTERM and
// SIGHUP, forking while the run ends. None is left in its pid namespace,
// and its cgroup goes back to the pool, which takes only an empty one.
func TestEndLeavesNoProcess(t *testing.T) {
	e, p := newPooledEngine(t, 1, nil)
	if !p.cgroups.Memory && !p.cgroups.Pids && !p.cgroups.CPU {
		t.Skip("no cgroups here: the pool has none to take back")
	}
	r, err := e.Run(context.Background(), engine.RunRequest{Code: `
import os, signal, time
ns = os.readlink('/proc/self/ns/pid')
for i in range(8):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            while True:
                try:
                    if os.fork() == 0:
                        time.sleep(600)
                except OSError:
                    pass
                time.sleep(0.01)
        os._exit(0)
time.sleep(0.1)
print(ns)
`})
	if err != nil || r.Status != engine.StatusSuccess || !strings.HasPrefix(r.Stdout, "pid:[") {
		t.Fatalf("%v %+v", err, r)
	}
	ns := strings.TrimSpace(r.Stdout)
	// Its group comes back for reuse, or is deleted when the kernel has
	// not freed the run's last objects in time (see cgroup's Reset).
	waitFor(t, func() bool { return len(p.cgFree) > 0 || p.cgDropped.Load() > 0 })
	// By then only the run's pid 1 may be left, as a zombie its parent
	// (the zygote) has yet to reap; nothing of the run runs.
	if live := liveProcessesIn(ns); len(live) > 0 {
		t.Errorf("processes of the run outlived it, in %s: %v", ns, live)
	}
	waitFor(t, func() bool { return !processesIn(ns) })
	select {
	case g := <-p.cgFree:
		if err := g.Reset(); err != nil {
			t.Errorf("the cgroup the pool took back: %v", err)
		}
		p.recycle(g)
	default:
	}
}

// gatedPool hands out the pool's children with a Close that waits for
// gate: a run whose answer waits for its sandbox's teardown hangs.
type gatedPool struct {
	*Pool
	gate chan struct{}
}

type gatedChild struct {
	*child
	gate chan struct{}
}

func (g gatedChild) Close() error { <-g.gate; return g.child.Close() }

func (g gatedPool) Start(ctx context.Context, spec *sandbox.Spec) (sandbox.Sandbox, error) {
	sb, err := g.Pool.Start(ctx, spec)
	if c, ok := sb.(*child); ok && err == nil {
		return gatedChild{c, g.gate}, nil
	}
	return sb, err
}

// TestAnswerBeforeClose: the caller has a pooled run's answer while its
// sandbox's teardown (the end of its processes, the cgroup's reset) has
// not even begun. It once ran on the caller's path after a refactor lost
// the hand-off, which cost every run 6 ms.
func TestAnswerBeforeClose(t *testing.T) {
	_, p := newPooledEngine(t, 1, nil)
	gate := make(chan struct{})
	defer close(gate)
	cfg := enginetest.Config(t)
	cfg.Backend = gatedPool{p, gate}
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	type answer struct {
		r   *engine.Result
		err error
	}
	done := make(chan answer, 1)
	go func() {
		r, err := e.Run(context.Background(), engine.RunRequest{Code: "print('hi')"})
		done <- answer{r, err}
	}()
	select {
	case a := <-done:
		if a.err != nil || a.r.Status != engine.StatusSuccess || a.r.Stdout != "hi\n" {
			t.Fatalf("%v %+v", a.err, a.r)
		}
	case <-time.After(2 * time.Minute): // a guard against a hang only
		t.Fatal("the answer waited for the sandbox's Close")
	}
}

// liveProcessesIn lists the processes in the pid namespace pidNS that
// are not zombies, as "pid state".
func liveProcessesIn(pidNS string) []string {
	var live []string
	for _, pid := range pidsIn(pidNS) {
		stat, err := os.ReadFile("/proc/" + pid + "/stat")
		if err != nil {
			continue
		}
		i := strings.LastIndexByte(string(stat), ')')
		if i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' || stat[i+2] == 'X' {
			continue
		}
		live = append(live, pid+" "+string(stat[i+2]))
	}
	return live
}
