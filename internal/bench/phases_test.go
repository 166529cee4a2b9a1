package bench

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/pool"
	"github.com/pysandbox/pysandbox/internal/testutil"
)

const us = int64(time.Microsecond)

// syntheticRun is the i-th of a few runs whose child stamped every phase:
// each phase of the setup takes 100 µs more than the one before, and
// costs the child half of it in CPU and 10 faults; run i is i µs slower
// everywhere.
func syntheticRun(i int) tracedRun {
	base := int64(1_000_000_000) * int64(i+1)
	slow := int64(i) * us
	tr := &pool.Trace{Server: map[string]int64{}, ZygoteCPU: time.Duration(i) * 3 * time.Millisecond}
	at := base
	step := func(k int) int64 { at += int64(k)*100*us + slow; return at }
	tr.Server["spawn"] = at
	tr.Server["sent"] = step(1)
	var cpu, flt int64
	stamp := func(name string, k int) {
		w := step(k)
		cpu += (int64(k)*100*us + slow) / 2
		flt += 10
		tr.Stamps = append(tr.Stamps, pool.Stamp{Name: name, Wall: w, CPU: cpu, Minflt: flt})
	}
	stamp("zygote.request", 2)
	stamp("zygote.fork", 3)
	// The child's own counters start again at the fork.
	cpu, flt = 0, 0
	for k, name := range []string{"b.start", "b.fds", "b.unshare_mnt", "b.unshare_net", "b.unshare_ipc", "b.unshare_uts", "b.joined",
		"b.unshare_cgroup", "b.mounts", "b.proc_masks", "b.net", "b.limits", "b.user", "b.caps", "b.landlock", "b.seccomp", "b.user_paths", "b.pretouch"} {
		stamp(name, 4+k)
	}
	tr.Server["ready"] = step(1)
	r := tracedRun{t: tr, start: step(5)}
	tr.Server["taken"] = step(1)
	r.end = step(40)
	tr.Server["exited"] = step(2)
	tr.Server["ended"] = step(1)
	tr.Server["closing"] = step(1)
	tr.Server["closed"] = step(3)
	tr.B = pool.Usage{CPU: time.Duration(cpu) + 2*time.Millisecond, Minflt: flt + 500}
	return r
}

func TestTracedRunAt(t *testing.T) {
	r := syntheticRun(0)
	fork, _ := r.at("c:zygote.fork")
	for _, tc := range []struct {
		ref  string
		want int64
		ok   bool
	}{
		{"r:start", r.start, true},
		{"r:end", r.end, true},
		{"s:taken", r.t.Server["taken"], true},
		{"s:nope", 0, false},
		{"c:b.origin", fork.Wall, true},
		{"c:b.start", r.t.Stamps[2].Wall, true},
		{"c:b.nope", 0, false},
	} {
		s, ok := r.at(tc.ref)
		if s.Wall != tc.want || ok != tc.ok {
			t.Errorf("%s: %d %v, want %d %v", tc.ref, s.Wall, ok, tc.want, tc.ok)
		}
	}
	// The origin has no CPU or faults of its own: the child's start.
	if o, _ := r.at("c:b.origin"); o.CPU != 0 || o.Minflt != 0 {
		t.Errorf("origin %+v", o)
	}
}

// TestMatch: each run gets the child taken within its span; a run no
// child was taken for is left out, and a trace without "taken" matches
// nothing.
func TestMatch(t *testing.T) {
	a, b, c := syntheticRun(0), syntheticRun(1), syntheticRun(2)
	lost := &pool.Trace{Server: map[string]int64{"spawn": 1}}
	tr := &tracedRuns{traces: []*pool.Trace{lost, c.t, a.t}}
	for _, r := range []tracedRun{a, b, c} {
		tr.runs = append(tr.runs, tracedRun{start: r.start, end: r.end})
	}
	m := tr.match()
	if len(m) != 2 || m[0].t != a.t || m[1].t != c.t || m[1].start != c.start {
		t.Errorf("matched %+v", m)
	}
}

// TestPhasesReport: the breakdown `bench --phases` prints, which the
// docs/performance.md quotes.
func TestPhasesReport(t *testing.T) {
	runs := []tracedRun{syntheticRun(0), syntheticRun(1), syntheticRun(2)}
	// At rest, 1 ms of kernel threads and 0.5 ms of this process per
	// second: over the 300 ms window, 0.3 and 0.15 ms are not the runs'.
	tr := &tracedRuns{runs: runs, busy: 15 * time.Millisecond, cpuWindow: cpuWindow{k0: time.Second, k1: time.Second + 6900*time.Microsecond,
		w0: int64(time.Second), w1: int64(time.Second + 300*time.Millisecond), rest: atRest{server: 0.0005, kernel: 0.001}}}
	for _, r := range runs {
		tr.traces = append(tr.traces, r.t)
	}
	tr.ru1.Utime.Usec = 7300 * 3 / 2
	tr.ru1.Stime.Usec = 7300 * 3 / 2
	var b bytes.Buffer
	writePhases(&b, tr.match())
	writeCPU(&b, tr.cpu(tr.match(), 3), untraced{perRun: 21 * time.Millisecond, n: 3}, floorResult{process: 2100 * time.Microsecond, kernel: 1200 * time.Microsecond}, true)
	testutil.Golden(t, filepath.Join("testdata", "phases.golden"), b.Bytes(), *update)
}

// TestPhasesOnAPool: `bench --phases` on a real warm pool finds the
// child of every run and a stamp for every phase it prints (a stamp the
// pool renamed or dropped would leave its line out of the report).
func TestPhasesOnAPool(t *testing.T) {
	if testing.Short() {
		t.Skip("runs sandboxes")
	}
	var b bytes.Buffer
	err := Run(context.Background(), Config{N: 3, Phases: true, Baseline: "/usr/bin/python3", Defaults: Variant{PoolSize: 1}, Engine: testEngines(t), Out: &b})
	if err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if !strings.Contains(out, "One pooled print('hi') by phase (median of 3 runs") || !strings.Contains(out, "CPU per pooled run: ") ||
		!strings.Contains(out, "  the floor, measured now: ") {
		t.Fatalf("no breakdown:\n%s", out)
	}
	// The total without the stamps: measured here when the pool's
	// sandboxes have cgroups under a CPU counter, else the reason.
	if !strings.Contains(out, "  (3 runs of a pool that traces nothing: ") && !strings.Contains(out, "without their stamps it could not be measured: ") {
		t.Errorf("no line for the untraced total")
	}
	for _, phases := range [][]phase{setupPhases, runPhases, teardownPhases} {
		for _, ph := range phases {
			if !strings.Contains(out, "  "+ph.name+" ") {
				t.Errorf("no line for %q", ph.name)
			}
		}
	}
	if t.Failed() {
		t.Logf("the report:\n%s", out)
	}

	// Without a pool there is nothing to break down.
	b.Reset()
	if err := Run(context.Background(), Config{N: 3, Phases: true, Baseline: "/usr/bin/python3", Engine: testEngines(t), Out: &b}); err != nil ||
		b.String() != "\n(no warm pool: --pool-size 0 or a backend other than native; phase breakdown skipped)\n" {
		t.Errorf("without a pool: %v %q", err, b.String())
	}
}
