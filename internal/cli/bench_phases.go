package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pysandbox/pysandbox/internal/engine"
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

type tracedRun struct {
	t          *pool.Trace
	start, end int64
}

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

// benchPhases runs n traced print('hi') runs one at a time, each on a child
// prepared while nothing else ran, and prints where the time and the CPU
// of one pooled run go.
func benchPhases(ctx context.Context, o *options, log *slog.Logger, n int, out io.Writer) error {
	traces := make(chan *pool.Trace, n+64)
	lo := *o
	lo.preload = ""
	lo.learnPreload = 0
	lo.trace = func(t *pool.Trace) {
		select {
		case traces <- t:
		default:
		}
	}
	var p *pool.Pool
	lo.onPool = func(pp *pool.Pool) { p = pp }
	eng, release, err := lo.engine(ctx, log)
	if err != nil {
		return err
	}
	defer release()
	if p == nil {
		fmt.Fprintln(out, "\n(no warm pool: --pool-size 0 or a backend other than native; phase breakdown skipped)")
		return nil
	}
	size := p.Info().Size
	waitFull := func() {
		waitPoolFull(p, 30*time.Second)
		// Let the kernel finish the last run's deferred cleanup too.
		time.Sleep(20 * time.Millisecond)
	}
	hello := engine.RunRequest{Code: "print('hi')"}
	waitFull()
	if err := runOK(ctx, eng, hello); err != nil {
		return err
	}
	var runs []tracedRun
	var ru0, ru1 syscall.Rusage
	k0 := kernelThreadsCPU()
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	var busy time.Duration
	for range n {
		waitFull()
		start := pool.Monotonic()
		if err := runOK(ctx, eng, hello); err != nil {
			return err
		}
		end := pool.Monotonic()
		busy += time.Duration(end - start)
		runs = append(runs, tracedRun{start: start, end: end})
	}
	waitFull()
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	k1 := kernelThreadsCPU()
	// Match each run to the child that served it: the one taken within
	// the run's span.
	var all []*pool.Trace
	deadline := time.After(10 * time.Second)
collect:
	for len(all) < n+size+1 {
		select {
		case t := <-traces:
			all = append(all, t)
		case <-deadline:
			break collect
		case <-time.After(500 * time.Millisecond):
			break collect
		}
	}
	matched := runs[:0]
	for _, r := range runs {
		for _, t := range all {
			if tk, ok := t.Server["taken"]; ok && tk >= r.start && tk <= r.end {
				r.t = t
				matched = append(matched, r)
				break
			}
		}
	}
	if len(matched) == 0 {
		return fmt.Errorf("bench: no traced run was served from the pool")
	}
	fmt.Fprintf(out, "\nOne pooled print('hi') by phase (median of %d runs, each on a child prepared while nothing else ran):\n", len(matched))
	fmt.Fprintf(out, "%-46s %9s %9s %8s\n", "setup, ahead of demand", "wall", "CPU", "faults")
	printPhases(out, matched, setupPhases)
	fmt.Fprintf(out, "%-46s %9s %9s %8s\n", "the run, on the caller's path", "", "", "")
	printPhases(out, matched, runPhases)
	fmt.Fprintf(out, "%-46s %9s %9s %8s\n", "teardown, after the answer", "", "", "")
	printPhases(out, matched, teardownPhases)

	// CPU per run, wherever it was spent.
	med := func(f func(tracedRun) time.Duration) time.Duration {
		v := make([]time.Duration, 0, len(matched))
		for _, r := range matched {
			v = append(v, f(r))
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	bSetup := func(r tracedRun) time.Duration {
		s, _ := r.at("c:b.user_paths")
		return time.Duration(s.CPU)
	}
	bSetupCPU := med(bSetup)
	bRunCPU := med(func(r tracedRun) time.Duration { return max(r.t.B.CPU-bSetup(r), 0) })
	var zyg []time.Duration
	slices.SortFunc(all, func(a, b *pool.Trace) int { return int(a.Server["spawn"] - b.Server["spawn"]) })
	for i := 1; i < len(all); i++ {
		if d := all[i].ZygoteCPU - all[i-1].ZygoteCPU; d >= 0 {
			zyg = append(zyg, d)
		}
	}
	slices.Sort(zyg)
	var zygCPU time.Duration
	if len(zyg) > 0 {
		zygCPU = zyg[len(zyg)/2]
	}
	server := time.Duration((ru1.Utime.Nano()+ru1.Stime.Nano())-(ru0.Utime.Nano()+ru0.Stime.Nano())) / time.Duration(n)
	kern := (k1 - k0) / time.Duration(n)
	total := bSetupCPU + bRunCPU + zygCPU + server + kern
	fmt.Fprintf(out, "\nCPU per pooled run: %s in all\n", msd(total))
	fmt.Fprintf(out, "  %-44s %9s\n", "server (engine, pool, this bench)", msd(server))
	fmt.Fprintf(out, "  %-44s %9s\n", "zygote (fork, and its pages copied after)", msd(zygCPU))
	fmt.Fprintf(out, "  %-44s %9s\n", "child setup (namespaces, mounts, lockdown)", msd(bSetupCPU))
	fmt.Fprintf(out, "  %-44s %9s\n", "child run and exit (code, reply, teardown)", msd(bRunCPU))
	fmt.Fprintf(out, "  %-44s %9s\n", "kernel threads (deferred namespace cleanup)", msd(kern))
	fmt.Fprintf(out, "  (wall time per run, for comparison: %s; the child's minor page faults: %d)\n", msd(busy/time.Duration(n)),
		medInt(matched, func(r tracedRun) int64 { return r.t.B.Minflt }))
	return nil
}

func printPhases(out io.Writer, runs []tracedRun, phases []phase) {
	for _, ph := range phases {
		var wall, cpu, flt []int64
		child := strings.HasPrefix(ph.from, "c:") && strings.HasPrefix(ph.to, "c:") && ph.from[2] == ph.to[2]
		for _, r := range runs {
			a, ok1 := r.at(ph.from)
			b, ok2 := r.at(ph.to)
			if !ok1 || !ok2 {
				continue
			}
			wall = append(wall, b.Wall-a.Wall)
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
		fmt.Fprintf(out, "  %-44s %9s %9s %8s\n", ph.name, msd(time.Duration(median(wall))), c, f)
	}
}

func median(v []int64) int64 {
	slices.Sort(v)
	return v[len(v)/2]
}

func medInt(runs []tracedRun, f func(tracedRun) int64) int64 {
	v := make([]int64, 0, len(runs))
	for _, r := range runs {
		v = append(v, f(r))
	}
	return median(v)
}

func msd(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d.Microseconds())/1000) }

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
