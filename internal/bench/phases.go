package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pysandbox/pysandbox/internal/pool"
)

// phase is one line of the breakdown: where a span starts and ends, each
// either a server stamp ("s:name") or a child's ("c:name"), and whose CPU
// and faults the span is (the child's stamps carry them).
type phase struct {
	name, from, to string
}

// setupPhases are a pooled child's setup, in order: all of it ahead of
// demand, while the child waits in the pool.
var setupPhases = []phase{
	{"server: cgroup, socket and pipes", "s:spawn", "s:sent"},
	{"zygote: read the request", "s:sent", "c:zygote.request"},
	{"zygote: unshare a pid namespace", "c:zygote.request", "c:zygote.fork"},
	{"fork the run's pid 1 (both sides)", "c:b.origin", "c:b.start"},
	{"child: descriptors", "c:b.start", "c:b.fds"},
	{"child: unshare mount namespace", "c:b.fds", "c:b.unshare_mnt"},
	{"child: unshare network namespace", "c:b.unshare_mnt", "c:b.unshare_net"},
	{"child: unshare IPC namespace", "c:b.unshare_net", "c:b.unshare_ipc"},
	{"child: unshare UTS namespace", "c:b.unshare_ipc", "c:b.unshare_uts"},
	{"child: hello; server: pidfd, join cgroup", "c:b.unshare_uts", "c:b.joined"},
	{"child: unshare cgroup namespace", "c:b.joined", "c:b.unshare_cgroup"},
	{"child: mounts (tmpfs, /tmp, /work, /proc)", "c:b.unshare_cgroup", "c:b.mounts"},
	{"child: /proc masks", "c:b.mounts", "c:b.proc_masks"},
	{"child: hostname, loopback", "c:b.proc_masks", "c:b.net"},
	{"child: rlimits, cwd, environment", "c:b.net", "c:b.limits"},
	{"child: own uid, user namespace, id maps", "c:b.limits", "c:b.user"},
	{"child: drop capabilities, no_new_privs", "c:b.user", "c:b.caps"},
	{"child: Landlock", "c:b.caps", "c:b.landlock"},
	{"child: seccomp", "c:b.landlock", "c:b.seccomp"},
	{"child: user paths, reseed", "c:b.seccomp", "c:b.user_paths"},
	{"child: pre-touch preloaded libraries", "c:b.user_paths", "c:b.pretouch"},
	{"child: worker ready; server sees it", "c:b.pretouch", "s:ready"},
}

// runPhases are what a run waits for, from the engine's call on.
var runPhases = []phase{
	{"engine: queue, resolve, take a ready child", "r:start", "s:taken"},
	{"worker: handshake, run, reply; output in", "s:taken", "r:end"},
}

// teardownPhases come after the caller has its answer.
var teardownPhases = []phase{
	{"child: exit (its namespaces with it)", "r:end", "s:exited"},
	{"server: cgroup figures", "s:exited", "s:ended"},
	{"pool: reset the cgroup for reuse", "s:closing", "s:closed"},
}

// tracedRun is one run as the bench timed it (start and end on the
// pool's clock) and the trace of the child that served it.
type tracedRun struct {
	t          *pool.Trace
	start, end int64
}

// at is the stamp a phase's end names: "r:" the run's own start or end,
// "s:" a server stamp, "c:" a child's.
func (r tracedRun) at(ref string) (stamp pool.Stamp, ok bool) {
	kind, name, _ := strings.Cut(ref, ":")
	switch kind {
	case "r":
		if name == "start" {
			return pool.Stamp{Wall: r.start}, true
		}
		return pool.Stamp{Wall: r.end}, true
	case "s":
		v, ok := r.t.Server[name]
		return pool.Stamp{Wall: v}, ok
	}
	if name == "b.origin" {
		// The child's own clock starts at the fork: no CPU, no faults.
		f, ok := r.at("c:zygote.fork")
		return pool.Stamp{Name: name, Wall: f.Wall}, ok
	}
	for _, s := range r.t.Stamps {
		if s.Name == name {
			return s, true
		}
	}
	return pool.Stamp{}, false
}

// tracedRuns is what phases measured: the runs, every trace the pool
// sent meanwhile, and the CPU this process and the kernel's threads used.
type tracedRuns struct {
	runs   []tracedRun
	traces []*pool.Trace
	busy   time.Duration
	cpuWindow
}

// cpuWindow is the CPU this process and the kernel's threads used between
// begin and end, and what they use at rest.
type cpuWindow struct {
	ru0, ru1 syscall.Rusage
	k0, k1   time.Duration
	// w0 and w1 bound the measurement (CLOCK_MONOTONIC, ns); rest is
	// what this process and the kernel threads use while nothing runs,
	// which is not the runs' to pay.
	w0, w1 int64
	rest   atRest
}

func (w *cpuWindow) begin() {
	w.w0 = pool.Monotonic()
	w.k0 = kernelThreadsCPU()
	syscall.Getrusage(syscall.RUSAGE_SELF, &w.ru0)
}

func (w *cpuWindow) end() {
	syscall.Getrusage(syscall.RUSAGE_SELF, &w.ru1)
	w.k1 = kernelThreadsCPU()
	w.w1 = pool.Monotonic()
}

// server is what this process used in the window beyond its rest.
func (w *cpuWindow) server() time.Duration {
	return beyond(rusageCPU(w.ru1)-rusageCPU(w.ru0), w.rest.server, w.w1-w.w0)
}

// kernel is what the kernel threads used in the window beyond their rest.
// Their CPU is summed over the live ones: one that ended meanwhile takes
// its time with it, which can make the difference negative (kernelGone);
// none is counted then.
func (w *cpuWindow) kernel() time.Duration { return beyond(w.k1-w.k0, w.rest.kernel, w.w1-w.w0) }

func (w *cpuWindow) kernelGone() bool { return w.k1 < w.k0 }

// atRest is the CPU this process and the kernel's threads use per
// second of wall time while the pool is full and nothing runs: the Go
// runtime's timers, and kernel threads that have nothing to do with the
// runs (DAMON's kdamond, RCU's grace periods, the writeback of other
// processes). On a quiet machine it is a few ms per second; on a busy one
// much more, all of it counted against the runs unless taken out.
type atRest struct{ server, kernel float64 } // CPU ns per wall ns

// restWindow is how long measureRest watches.
const restWindow = 500 * time.Millisecond

// measureRest watches this process and the kernel threads for d.
func measureRest(d time.Duration) atRest {
	var r0, r1 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &r0)
	k0, w0 := kernelThreadsCPU(), pool.Monotonic()
	time.Sleep(d)
	syscall.Getrusage(syscall.RUSAGE_SELF, &r1)
	k1, w1 := kernelThreadsCPU(), pool.Monotonic()
	wall := float64(w1 - w0)
	if wall <= 0 {
		return atRest{}
	}
	return atRest{
		server: max(float64(rusageCPU(r1)-rusageCPU(r0)), 0) / wall,
		kernel: max(float64(k1-k0), 0) / wall,
	}
}

// beyond is what of used, measured over wall ns, was not spent at rate
// (CPU ns per wall ns) as at rest; never less than 0.
func beyond(used time.Duration, rate float64, wall int64) time.Duration {
	return max(used-time.Duration(rate*float64(wall)), 0)
}

// rusageCPU is user plus system time.
func rusageCPU(r syscall.Rusage) time.Duration {
	return time.Duration(r.Utime.Nano() + r.Stime.Nano())
}

// phases runs n traced print('hi') runs one at a time, each on a child
// prepared while nothing else ran, and prints where the time and the CPU
// of one pooled run go.
func phases(ctx context.Context, cfg Config) error {
	traces := make(chan *pool.Trace, cfg.N+64)
	v := cfg.Defaults
	v.Preload, v.Learn = "", 0
	v.Trace = func(t *pool.Trace) {
		select {
		case traces <- t:
		default:
		}
	}
	eng, err := cfg.Engine(ctx, v)
	if err != nil {
		return err
	}
	if eng.Pool == nil {
		eng.Release()
		fmt.Fprintln(cfg.Out, "\n(no warm pool: --pool-size 0 or a backend other than native; phase breakdown skipped)")
		return nil
	}
	tr, err := runTraced(ctx, eng, cfg.N, traces)
	// Its pool is gone before the untraced one starts: only one pool's
	// sandboxes below the cgroups' parent.
	eng.Release()
	if err != nil {
		return err
	}
	matched := tr.match()
	if len(matched) == 0 {
		return fmt.Errorf("bench: no traced run was served from the pool")
	}
	writePhases(cfg.Out, matched)
	c := tr.cpu(matched, cfg.N)
	un := measureUntraced(ctx, cfg, v, cfg.N)
	fl, err := measureFloor(ctx, cfg.Baseline, cfg.N)
	if err != nil {
		// Only the comparison is lost: say why, keep the breakdown.
		fmt.Fprintf(cfg.Out, "\n(the floor could not be measured: %v)\n", err)
	}
	writeCPU(cfg.Out, c, un, fl, err == nil)
	return nil
}

// runTraced runs print('hi') n times, each on a full pool, and collects
// the traces of the children.
func runTraced(ctx context.Context, eng *Engine, n int, traces <-chan *pool.Trace) (*tracedRuns, error) {
	size := eng.Pool.Info().Size
	settle(eng.Pool)
	if err := runOK(ctx, eng.Engine, hello); err != nil {
		return nil, err
	}
	tr := &tracedRuns{cpuWindow: cpuWindow{rest: measureRest(restWindow)}}
	tr.begin()
	for range n {
		settle(eng.Pool)
		start := pool.Monotonic()
		if err := runOK(ctx, eng.Engine, hello); err != nil {
			return nil, err
		}
		end := pool.Monotonic()
		tr.busy += time.Duration(end - start)
		tr.runs = append(tr.runs, tracedRun{start: start, end: end})
	}
	settle(eng.Pool)
	tr.end()
	deadline := time.After(10 * time.Second)
collect:
	for len(tr.traces) < n+size+1 {
		select {
		case t := <-traces:
			tr.traces = append(tr.traces, t)
		case <-deadline:
			break collect
		case <-time.After(500 * time.Millisecond):
			break collect
		}
	}
	return tr, nil
}

// settle waits for a full pool, then lets the kernel finish the last
// run's deferred cleanup too: each measured run starts as the first would.
func settle(p *pool.Pool) {
	waitPoolFull(p, 30*time.Second)
	time.Sleep(20 * time.Millisecond)
}

// match pairs each run with the child that served it: the one taken
// within the run's span. Runs without one are left out.
func (tr *tracedRuns) match() []tracedRun {
	var matched []tracedRun
	for _, r := range tr.runs {
		for _, t := range tr.traces {
			if tk, ok := t.Server["taken"]; ok && tk >= r.start && tk <= r.end {
				r.t = t
				matched = append(matched, r)
				break
			}
		}
	}
	return matched
}

// writePhases is the breakdown of one pooled run, phase by phase: the
// median wall time of each, and the child's CPU and faults in it.
func writePhases(w io.Writer, matched []tracedRun) {
	fmt.Fprintf(w, "\nOne pooled print('hi') by phase (median of %d runs, each on a child prepared while nothing else ran):\n", len(matched))
	fmt.Fprintf(w, "%-46s %9s %9s %8s\n", "setup, ahead of demand", "wall", "CPU", "faults")
	printPhases(w, matched, setupPhases)
	fmt.Fprintf(w, "%-46s %9s %9s %8s\n", "the run, on the caller's path", "", "", "")
	printPhases(w, matched, runPhases)
	fmt.Fprintf(w, "%-46s %9s %9s %8s\n", "teardown, after the answer", "", "", "")
	printPhases(w, matched, teardownPhases)
}

// printPhases prints each phase's line. A phase whose end came before
// its start in some runs (the child's exit, stamped before the bench saw
// the run's answer: the engine stops the child before it answers) counts
// 0 there, not a negative time, and a note says in how many runs.
func printPhases(out io.Writer, runs []tracedRun, phases []phase) {
	var notes []string
	for _, ph := range phases {
		var wall, cpu, flt []int64
		before := 0
		child := strings.HasPrefix(ph.from, "c:") && strings.HasPrefix(ph.to, "c:") && ph.from[2] == ph.to[2]
		for _, r := range runs {
			a, ok1 := r.at(ph.from)
			b, ok2 := r.at(ph.to)
			if !ok1 || !ok2 {
				continue
			}
			if b.Wall < a.Wall {
				before++
			}
			wall = append(wall, max(b.Wall-a.Wall, 0))
			if child {
				cpu = append(cpu, b.CPU-a.CPU)
				flt = append(flt, b.Minflt-a.Minflt)
			}
		}
		if len(wall) == 0 {
			continue
		}
		c, f := "", ""
		if len(cpu) > 0 {
			c, f = msd(time.Duration(median(cpu))), strconv.FormatInt(median(flt), 10)
		}
		mark := ""
		if before > 0 {
			mark = " *"
			notes = append(notes, fmt.Sprintf("  * %s: in %d of %d runs it was over before it began by these stamps (%s before %s), and counts 0 there",
				ph.name, before, len(wall), ph.to, ph.from))
		}
		fmt.Fprintf(out, "  %-44s %9s %9s %8s%s\n", ph.name, msd(time.Duration(median(wall))), c, f, mark)
	}
	for _, n := range notes {
		fmt.Fprintln(out, n)
	}
}

// cpuPerRun is where one pooled run's CPU goes, medians and means over
// the runs measured.
type cpuPerRun struct {
	server, zygote, childSetup, childRun, kernel time.Duration
	// wall is the time a run took; minflt, its child's minor page
	// faults.
	wall   time.Duration
	minflt int64
	// kernelGone: kernel threads ended during the measurement, so their
	// CPU could not be counted (kernel is 0).
	kernelGone bool
	// rest is what was taken out of server and kernel (see atRest).
	rest atRest
}

// cpu is the CPU per run of n runs, wherever it was spent.
func (tr *tracedRuns) cpu(matched []tracedRun, n int) cpuPerRun {
	med := func(f func(tracedRun) time.Duration) time.Duration {
		v := make([]time.Duration, 0, len(matched))
		for _, r := range matched {
			v = append(v, f(r))
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	setup := func(r tracedRun) time.Duration {
		s, _ := r.at("c:b.user_paths")
		return time.Duration(s.CPU)
	}
	var c cpuPerRun
	c.childSetup = med(setup)
	c.childRun = med(func(r tracedRun) time.Duration { return max(r.t.B.CPU-setup(r), 0) })
	// The zygote's CPU between one child's spawn and the next.
	all := slices.Clone(tr.traces)
	var zyg []time.Duration
	slices.SortFunc(all, func(a, b *pool.Trace) int { return int(a.Server["spawn"] - b.Server["spawn"]) })
	for i := 1; i < len(all); i++ {
		if d := all[i].ZygoteCPU - all[i-1].ZygoteCPU; d >= 0 {
			zyg = append(zyg, d)
		}
	}
	slices.Sort(zyg)
	if len(zyg) > 0 {
		c.zygote = zyg[len(zyg)/2]
	}
	c.server = tr.server() / time.Duration(n)
	c.kernel = tr.kernel() / time.Duration(n)
	c.kernelGone = tr.kernelGone()
	c.rest = tr.rest
	c.wall = tr.busy / time.Duration(n)
	flt := make([]int64, 0, len(matched))
	for _, r := range matched {
		flt = append(flt, r.t.B.Minflt)
	}
	c.minflt = median(flt)
	return c
}

// writeCPU prints the CPU per run: the untraced total when it was
// measured (what a run costs), else the traced one, then the traced
// breakdown.
func writeCPU(w io.Writer, c cpuPerRun, un untraced, fl floorResult, hasFloor bool) {
	traced := c.childSetup + c.childRun + c.zygote + c.server + c.kernel
	total := traced
	if un.why == "" && un.n > 0 {
		total = un.perRun
	}
	fmt.Fprintf(w, "\nCPU per pooled run: %s in all%s\n", msd(total), goalNote("<= 8ms", 0, millis(total)))
	if un.why != "" || un.n > 0 {
		fmt.Fprint(w, un.line(traced))
	}
	if hasFloor {
		kernel := msd(fl.kernel)
		if fl.kernelGone {
			kernel = "?"
		}
		fmt.Fprintf(w, "  the floor, measured now: %s (a warm python3 forked into a new pid namespace, unsharing the same namespaces, exiting: %s in it, %s in kernel threads); the run is %.2fx of it\n",
			msd(fl.total()), msd(fl.process), kernel, ratio(total, fl.total()))
	}
	fmt.Fprintf(w, "  %-44s %9s\n", "server (engine, pool, this bench)", msd(c.server))
	fmt.Fprintf(w, "  %-44s %9s\n", "zygote (fork, and its pages copied after)", msd(c.zygote))
	fmt.Fprintf(w, "  %-44s %9s\n", "child setup (namespaces, mounts, lockdown)", msd(c.childSetup))
	fmt.Fprintf(w, "  %-44s %9s\n", "child run and exit (code, reply, teardown)", msd(c.childRun))
	if c.kernelGone {
		fmt.Fprintf(w, "  %-44s %9s (kernel threads ended meanwhile, taking their CPU time with them: not counted)\n", "kernel threads (deferred namespace cleanup)", "?")
	} else {
		fmt.Fprintf(w, "  %-44s %9s\n", "kernel threads (deferred namespace cleanup)", msd(c.kernel))
	}
	fmt.Fprintf(w, "  (wall time per run, for comparison: %s; the child's minor page faults: %d)\n", msd(c.wall), c.minflt)
	if c.rest != (atRest{}) {
		fmt.Fprintf(w, "  (not counted: what this process and the kernel threads use at rest, %.1f and %.1f ms per second, measured before the runs)\n",
			c.rest.server*1e3, c.rest.kernel*1e3)
	}
}

// kernelThreadsCPU is the CPU time of every kernel thread so far (from
// schedstat, in ns): where the kernel's deferred work runs, such as
// tearing down a network namespace.
func kernelThreadsCPU() time.Duration {
	const pfKthread = 0x00200000
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	var total time.Duration
	for _, d := range dirs {
		stat, err := os.ReadFile(d + "/stat")
		if err != nil {
			continue
		}
		i := strings.LastIndexByte(string(stat), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) < 7 {
			continue
		}
		flags, _ := strconv.ParseUint(f[6], 10, 64)
		if flags&pfKthread == 0 {
			continue
		}
		ss, err := os.ReadFile(d + "/schedstat")
		if err != nil {
			continue
		}
		ns, _ := strconv.ParseInt(strings.Fields(string(ss))[0], 10, 64)
		total += time.Duration(ns)
	}
	return total
}
