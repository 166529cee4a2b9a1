package bench

import (
	"fmt"
	"io"
	"time"
)

// latencyReport is what the full bench measured on the command line's
// engine. The suite fills it step by step and writes each part as soon as
// it is measured; the tests fill it by hand.
type latencyReport struct {
	// The header: what is measured, and where.
	sandbox, preload, python string
	poolSize, n, cpus        int
	// baseline is the interpreter spawned directly; base, its `-c pass`
	// times, the reference of most ratios.
	baseline string
	base     []time.Duration

	// One call at a time and back to back, through the engine and over
	// MCP stdio: plain, governed, with a progress token.
	eng1, engB2B                                         []time.Duration
	mcpStdio, mcpB2B, mcpGoverned, mcpRules, mcpProgress []time.Duration
	// mcpUngoverned was timed in turn with mcpGoverned and mcpRules, on
	// servers of their own (mcpAlternating): their ratios are to it.
	mcpUngoverned                            []time.Duration
	flooded                                  []time.Duration
	hasPandas                                bool
	coldPandas, pandasRuns, learned, session []time.Duration
	throughputCalls, concurrency             int
	pooledPerSecond, spawnedPerSecond        float64
}

// writeHeader is the report's first line, written before anything is
// measured.
func (r *latencyReport) writeHeader(w io.Writer) {
	fmt.Fprintf(w, "pysandbox bench: backend %s, pool size %d, preload %q, python %s, %d iterations each, %d CPUs\n",
		r.sandbox, r.poolSize, r.preload, r.python, r.n, r.cpus)
}

func (r *latencyReport) writeBaseline(w io.Writer) {
	fmt.Fprintf(w, "this machine now: %s -c pass takes %s (p50), %s (p99); every figure below is a ratio to one measured in this run\n\n",
		r.baseline, ms(pct(r.base, 50)), ms(pct(r.base, 99)))
}

// table is the report's table of p50, p99 and the ratio of each p50 to a
// reference's.
type table struct{ w io.Writer }

func (t table) header() {
	fmt.Fprintf(t.w, "%-56s %9s %9s %10s\n", "", "p50", "p99", "ratio p50")
}

// row is one measurement d against ref (named refName), with its goal
// when it has one.
func (t table) row(name string, d, ref []time.Duration, refName, goal string) {
	r := ratio(pct(d, 50), pct(ref, 50))
	fmt.Fprintf(t.w, "%-56s %9s %9s %9.2fx %s%s\n", name, ms(pct(d, 50)), ms(pct(d, 99)), r, refName, goalNote(goal, r, millis(pct(d, 50))))
}

// ratioRow is a row with a ratio only, what it is a ratio of, and its
// goal.
func (t table) ratioRow(name string, r float64, what, goal string) {
	fmt.Fprintf(t.w, "%-56s %9s %9s %9.2fx %s%s\n", name, "", "", r, what, goalNote(goal, r, 0))
}

const ofSpawn = "of python3 -c pass"

// writeCalls is the table's header and the rows of print('hi') through
// the engine and over MCP.
func (r *latencyReport) writeCalls(w io.Writer) {
	t := table{w}
	t.header()
	t.row(r.baseline+" -c pass (spawned directly)", r.base, r.base, "", "")
	t.row("engine: print('hi'), one call at a time", r.eng1, r.base, ofSpawn, "")
	t.row("  the same, calls back to back (no pause)", r.engB2B, r.base, ofSpawn, "")
	t.row("MCP stdio tools/call run_python print('hi')", r.mcpStdio, r.base, ofSpawn, "<= 0.25x")
	t.ratioRow("  its p99", ratio(pct(r.mcpStdio, 99), pct(r.mcpStdio, 50)), "of its p50", "<= 3x")
	t.row("  the same, calls back to back (no pause)", r.mcpB2B, r.base, ofSpawn, "")
	t.row("  the same with --policy and --audit-log", r.mcpGoverned, r.mcpUngoverned, "of ungoverned MCP (in turn)", "<= 1.05x")
	if r.mcpRules != nil {
		t.row("  governed, five argument conditions and code facts", r.mcpRules, r.mcpUngoverned, "of ungoverned MCP (in turn)", "<= 1.05x")
	}
	t.row("  the same with a progress token (heartbeat, live output)", r.mcpProgress, r.mcpStdio, "of the call without one", "")
}

func (r *latencyReport) writeFlood(w io.Writer) {
	table{w}.row("engine: print('hi') with 8 CPU-burning runs in flight", r.flooded, r.eng1, "of the same without them", "")
}

// writePandas is the pandas rows, or why there are none.
func (r *latencyReport) writePandas(w io.Writer) {
	if !r.hasPandas {
		fmt.Fprintln(w, "(pandas is not installed for "+r.baseline+": pandas comparison skipped; apt-get install python3-pandas)")
		return
	}
	t := table{w}
	t.row(r.baseline+" -c 'import pandas' (spawned directly)", r.coldPandas, r.coldPandas, "", "")
	t.row("engine: pandas DataFrame snippet, one call at a time", r.pandasRuns, r.coldPandas, "of cold import pandas", "<= 0.05x")
}

// writeLearned is the pandas snippet on a pool that learned to preload
// pandas (measured when the pool learns at all).
func (r *latencyReport) writeLearned(w io.Writer) {
	table{w}.row("  the same without --preload, once the pool learned it", r.learned, r.coldPandas, "of cold import pandas", "")
}

func (r *latencyReport) writeSession(w io.Writer) {
	table{w}.row("session: `x += 1` round trip", r.session, r.base, ofSpawn, "p50 < 1ms")
}

func (r *latencyReport) writeThroughput(w io.Writer) {
	x := r.pooledPerSecond / r.spawnedPerSecond
	fmt.Fprintf(w, "\nthroughput, %d calls %d at a time: %.0f isolated print('hi') runs/s, %.2fx of spawning %s -c pass %d at a time (%.0f/s)%s\n",
		r.throughputCalls, r.concurrency, r.pooledPerSecond, x, r.baseline, r.concurrency, r.spawnedPerSecond, goalNote(">= 3x", x, 0))
}
