package pool

import (
	"context"
	"strings"
	"testing"

	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/testutil/afterlife"
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
