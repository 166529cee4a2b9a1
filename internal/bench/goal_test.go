package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestGoalMissed(t *testing.T) {
	for _, tc := range []struct {
		goal          string
		ratio, millis float64
		missed        bool
	}{
		{"<= 0.30x", 0.16, 0, false},
		{"<= 1.10x", 2.38, 0, true},
		{"<= 1.10x", 1.104, 0, false}, // shown as 1.10x
		{">= 2x", 1.01, 0, true},
		{">= 0.8x", 0.83, 0, false},
		{"p50 < 1ms", 0, 0.5, false},
		{"p50 < 1ms", 0, 1.2, true},
		{"<= 1ms added", 1.94, 0.34, false},
		{"< 2ms", 0, 2.5, true},
	} {
		note := goalNote(tc.goal, tc.ratio, tc.millis)
		if strings.HasSuffix(note, " MISSED") != tc.missed || !strings.Contains(note, "(goal "+tc.goal+")") {
			t.Errorf("%s at %vx, %vms: %q", tc.goal, tc.ratio, tc.millis, note)
		}
	}
}

// TestPhasesNeverNegative: a phase whose end was stamped before its
// start (the child exited before the bench saw the answer) counts 0, with
// a note, and kernel threads that ended meanwhile are not counted as
// negative CPU.
func TestPhasesNeverNegative(t *testing.T) {
	runs := []tracedRun{syntheticRun(0), syntheticRun(1), syntheticRun(2)}
	for i := range runs[:2] {
		runs[i].t.Server["exited"] = runs[i].end - 300*us
	}
	var b bytes.Buffer
	printPhases(&b, runs, teardownPhases)
	out := b.String()
	if strings.Contains(out, "-0.") || strings.Contains(out, " -") {
		t.Errorf("a negative time:\n%s", out)
	}
	if !strings.Contains(out, "0.00ms") || !strings.Contains(out, "in 2 of 3 runs it was over before it began") {
		t.Errorf("no 0 and note for the exit:\n%s", out)
	}
	tr := &tracedRuns{runs: runs, cpuWindow: cpuWindow{k0: 2 * time.Second, k1: time.Second}, busy: 3 * time.Millisecond}
	for _, r := range runs {
		tr.traces = append(tr.traces, r.t)
	}
	b.Reset()
	writeCPU(&b, tr.cpu(tr.match(), 3), untraced{why: "kernel threads ended meanwhile, taking their CPU time with them"}, floorResult{}, false)
	if out := b.String(); strings.Contains(out, "-") || !strings.Contains(out, "kernel threads ended meanwhile") ||
		!strings.Contains(out, "without their stamps it could not be measured: kernel threads ended") {
		t.Errorf("kernel threads:\n%s", out)
	}
}

// TestEstimate: the estimate grows with -n and is smaller for one
// section, and Run says it before it starts.
func TestEstimate(t *testing.T) {
	all := Estimate(Config{N: 50, Concurrency: 16}, true)
	if all < time.Minute || all > 10*time.Minute {
		t.Errorf("every section, -n 50: %s", all)
	}
	if more := Estimate(Config{N: 200, Concurrency: 16}, true); more <= all {
		t.Errorf("-n 200 (%s) not longer than -n 50 (%s)", more, all)
	}
	if ph := Estimate(Config{N: 50, Phases: true}, true); ph >= all || ph <= 0 {
		t.Errorf("--phases: %s", ph)
	}
	var log bytes.Buffer
	err := Run(t.Context(), Config{N: 3, Phases: true, Baseline: "/usr/bin/python3", Engine: testEngines(t), Out: &bytes.Buffer{}, Log: &log})
	if err != nil || !strings.HasPrefix(log.String(), "pysandbox bench: --phases, 3 iterations each: this takes about ") {
		t.Errorf("%v %q", err, log.String())
	}
}

// TestMissCounter: rows that missed are counted however the report's
// writes split them, and the report ends by saying where to read more.
func TestMissCounter(t *testing.T) {
	var b strings.Builder
	m := &missCounter{w: &b}
	for _, w := range []string{"a (goal <= 1x) MISSED\nb (goal <= 1x)\n", "c (goal <= 1x) MIS", "SED\nd MISSED\n", " MISSED"} {
		m.Write([]byte(w))
	}
	if m.missed != 4 {
		t.Errorf("counted %d, want 4", m.missed)
	}
	if f := m.footer(); !strings.Contains(f, "4 rows MISSED") || !strings.Contains(f, "docs/performance.md") {
		t.Errorf("footer %q", f)
	}
	if f := (&missCounter{}).footer(); f != "" {
		t.Errorf("footer without a miss: %q", f)
	}
}
