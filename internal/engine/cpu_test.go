package engine

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// cpuEngine is escEngine with a CPU quota of half a CPU, when this machine
// can enforce one.
func cpuEngine(t *testing.T) *Engine {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("no cgroup CPU controller for an unprivileged test run")
	}
	return escEngine(t, func(c *Config) { c.Limits.CPUMilli = 500 })
}

// burn is code that keeps three processes busy for about a second and a
// half of wall time, then reports nothing; the cgroup accounting says how
// much CPU they got.
const burn = `
import multiprocessing as mp, time
def spin(until):
    while time.time() < until:
        pass
until = time.time() + 1.5
ps = [mp.Process(target=spin, args=(until,)) for _ in range(3)]
for p in ps: p.start()
spin(until)
for p in ps: p.join()
`

// TestEscapeCPUQuota: however many processes a run starts, the cgroup
// accounting shows no more CPU time than its quota allows for its wall
// time (a ratio of two measurements of the same run, so load cannot make
// it fail: load only lowers the CPU a run gets).
func TestEscapeCPUQuota(t *testing.T) {
	e := cpuEngine(t)
	r := escRun(t, e, burn, nil)
	escWant(t, r, StatusSuccess)
	if r.CPUTimeMS == 0 {
		t.Fatalf("no CPU time measured: %+v", r)
	}
	// 0.5 CPU of the run's wall time, plus one period of slack.
	if allowed := r.DurationMS/2 + 150; r.CPUTimeMS > allowed {
		t.Errorf("4 busy processes used %d ms of CPU in %d ms: above a 0.5-CPU quota (%d ms)", r.CPUTimeMS, r.DurationMS, allowed)
	}
	t.Logf("4 busy processes, 0.5 CPU quota: %d ms of CPU in %d ms", r.CPUTimeMS, r.DurationMS)
}

// TestSessionIdleBetweenRuns: a session's background thread and process
// burn CPU only during runs; between them the session is held to a
// thousandth of a CPU, and its CPU time (cgroup accounting) barely moves.
// Its state survives.
func TestSessionIdleBetweenRuns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("no CPU cgroup for an unprivileged test run")
	}
	s := newSessions(t, func(c *Config) { c.Limits.CPUMilli = 1000 }, SessionConfig{})
	id := create(t, s)
	r := srun(t, s, id, `
import threading, subprocess, sys
def spin():
    while True:
        pass
threading.Thread(target=spin, daemon=True).start()
child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
x = 41`)
	if r.Status != StatusSuccess {
		t.Fatalf("%+v", r)
	}
	cpu := func() int64 {
		for _, i := range s.List() {
			if i.ID == id {
				return i.CPUTimeMS
			}
		}
		t.Fatal("session gone")
		return 0
	}
	before := cpu()
	time.Sleep(time.Second) // the interval the session must not use
	after := cpu()
	if after-before > 50 {
		t.Errorf("the session used %d ms of CPU between runs", after-before)
	}
	if r := srun(t, s, id, "x + 1"); fmt.Sprint(r.ReturnValue) != "42" {
		t.Fatalf("state after thawing: %+v", r)
	}
	// During a run the background work goes on again. How much CPU it
	// gets in half a second depends on how busy the machine is: runs are
	// repeated until it has had 100 ms (a session held to a thousandth of
	// a CPU would need minutes), at most 40 of them.
	var runCPU int64
	for range 40 {
		r = srun(t, s, id, "import time\ntime.sleep(0.5)")
		if runCPU += r.CPUTimeMS; runCPU >= 100 {
			break
		}
	}
	if runCPU < 100 {
		t.Errorf("the session's runs' CPU time (its background work ran) is %d ms in 40 runs of 0.5 s", runCPU)
	}
	if cpu()-after < 100 {
		t.Errorf("the session's background work did not run during its runs: %d ms", cpu()-after)
	}
}

// TestSessionOutputFlood: a session run that floods its output far beyond
// the cap is interrupted (the session survives); one that ignores the
// interrupt is killed with its session. The server stops copying either
// way, long before the timeout.
func TestSessionOutputFlood(t *testing.T) {
	s := newSessions(t, func(c *Config) { c.MaxOutput = 4096 }, SessionConfig{})
	id := create(t, s)
	r, err := s.Run(context.Background(), id, RunRequest{Code: "import os\nx = 1\nwhile True:\n    os.write(1, b'x' * 65536)", Timeout: time.Minute})
	if err != nil || r.Status != StatusOutputLimit || r.Completed() {
		t.Fatalf("flood: %v %+v", err, r)
	}
	// Stopped, even when the code catches the interrupt and ends well.
	r, err = s.Run(context.Background(), id, RunRequest{Code: "import os\ntry:\n    while True:\n        os.write(1, b'x' * 65536)\nexcept KeyboardInterrupt:\n    pass\n", Timeout: time.Minute})
	if err != nil || r.Status != StatusOutputLimit || r.Completed() {
		t.Fatalf("a flood whose interrupt is caught: %v %+v", err, r)
	}
	// The same after a timeout whose interrupt the code caught first.
	code := "import time, os\ntry:\n    time.sleep(30)\nexcept KeyboardInterrupt:\n    pass\ntry:\n    while True:\n        os.write(1, b'x' * 65536)\nexcept KeyboardInterrupt:\n    pass\n"
	r, err = s.Run(context.Background(), id, RunRequest{Code: code, Timeout: time.Second})
	if err != nil || r.Completed() {
		t.Fatalf("a flood after a caught timeout: %v %+v", err, r)
	}
	if r := srun(t, s, id, "x + 41"); fmt.Sprint(r.ReturnValue) != "42" {
		t.Fatalf("the session after an interrupted flood: %+v", r)
	}
	// SIG_IGN rather than catching KeyboardInterrupt in the loop: the
	// interrupt may land on the loop's own line, outside any try, and then
	// the run is merely interrupted (CI saw exactly that).
	r, err = s.Run(context.Background(), id, RunRequest{Code: "import os, signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    os.write(1, b'x' * 65536)", Timeout: time.Minute})
	if err != nil || r.Status != StatusOutputLimit || !strings.Contains(r.Message, "session has ended") {
		t.Fatalf("a flood that ignores the interrupt: %v %+v", err, r)
	}
}
