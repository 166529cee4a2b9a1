package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/pysandbox/pysandbox/internal/sandbox/cgroup"
)

// untraced is the CPU per pooled run measured without the stamps the
// breakdown needs: n runs on a pool that traces nothing, every process
// counted (this one by its rusage, every sandbox, zygote and child by the
// common parent of their cgroups) and the kernel threads, less what this
// process and the kernel threads use at rest. The stamps cost CPU of their
// own (a getrusage in the child at each step, the trace's JSON and its
// parse, the zygote's wait4), which a real run does not pay.
type untraced struct {
	perRun time.Duration
	n      int
	// others: groups of other servers below the same parent, whose CPU
	// the figure includes too.
	others int
	// why it was not measured ("" when it was).
	why string
}

// measureUntraced runs print('hi') n times as runTraced does, one at a
// time and each on a full pool, on an engine of v without a trace.
func measureUntraced(ctx context.Context, cfg Config, v Variant, n int) untraced {
	v.Trace = nil
	eng, err := cfg.Engine(ctx, v)
	if err != nil {
		return untraced{why: err.Error()}
	}
	defer eng.Release()
	if eng.Pool == nil {
		return untraced{why: "no warm pool"}
	}
	settle(eng.Pool)
	if err := runOK(ctx, eng.Engine, hello); err != nil {
		return untraced{why: err.Error()}
	}
	settle(eng.Pool)
	if u, ok := cgroup.BaseUsage(); !ok || u.Ours == 0 {
		// Without limits the pool makes no groups, and a CPU counter
		// above them would miss its sandboxes.
		return untraced{why: "no cgroup CPU counter covers the pool's sandboxes (no cgroups, cgroup v1 without cpuacct, or no limits that need a group)"}
	}
	w := cpuWindow{rest: measureRest(restWindow)}
	b0, ok0 := cgroup.BaseUsage()
	w.begin()
	// n runs take n ready children and, by the last settle, the pool has
	// prepared n more: each run pays for one child's whole life.
	for range n {
		settle(eng.Pool)
		if err := runOK(ctx, eng.Engine, hello); err != nil {
			return untraced{why: err.Error()}
		}
	}
	settle(eng.Pool)
	w.end()
	b1, ok1 := cgroup.BaseUsage()
	if !ok0 || !ok1 || b1.CPU < b0.CPU {
		return untraced{why: "the sandboxes' cgroup CPU counter could not be read throughout"}
	}
	if w.kernelGone() {
		return untraced{why: "kernel threads ended meanwhile, taking their CPU time with them"}
	}
	total := w.server() + (b1.CPU - b0.CPU) + w.kernel()
	return untraced{perRun: total / time.Duration(n), n: n, others: b1.Others}
}

// line is what writeCPU prints under the total: how it was
// measured, or why it was not.
func (u untraced) line(traced time.Duration) string {
	if u.why != "" {
		return fmt.Sprintf("  (of the traced runs below: without their stamps it could not be measured: %s)\n", u.why)
	}
	s := fmt.Sprintf("  (%d runs of a pool that traces nothing: this process, every sandbox by its cgroup, and the kernel threads; the breakdown below is of traced runs, %s in all, their stamps included)\n",
		u.n, msd(traced))
	if u.others > 0 {
		s += fmt.Sprintf("  (%d cgroups of other pysandbox servers share the parent: their CPU meanwhile is counted too)\n", u.others)
	}
	return s
}
