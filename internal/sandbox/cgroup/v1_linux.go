package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/cgroups/v3/cgroup1"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// v1Group is a group in the v1 hierarchies: memory and pids carry the
// limits, cpuacct (when mounted) gives CPU usage, freezer (when mounted)
// makes Kill race-free against fork.
type v1Group struct {
	cg    cgroup1.Cgroup
	dirs  map[cgroup1.Name]string // absolute directory per hierarchy
	memsw bool                    // memory.memsw.* exists (swap accounting)
	f     files                   // the control files every run uses, kept open
}

// addProc writes pid to cgroup.procs of each hierarchy (once where
// several are mounted together).
func (g *v1Group) addProc(pid int) error {
	seen := map[string]bool{}
	for _, n := range v1Wanted {
		d, ok := g.dirs[n]
		if !ok || seen[d] {
			continue
		}
		seen[d] = true
		if err := g.f.write(filepath.Join(d, "cgroup.procs"), strconv.Itoa(pid)); err != nil {
			return err
		}
	}
	return nil
}

// v1Wanted are the hierarchies a group is created in, when mounted.
var v1Wanted = []cgroup1.Name{cgroup1.Memory, cgroup1.Pids, cgroup1.Cpuacct, cgroup1.Freezer, cgroup1.Cpu}

type pather interface{ Path(string) string }

// v1Subsystems returns the mounted hierarchies among v1Wanted. The memory
// controller is rebuilt with options so that its Stat does not fail when
// swap accounting is off (OptionalSwap) or on kernels that dropped the kmem
// files (IgnoreModules).
func v1Subsystems() ([]cgroup1.Subsystem, error) {
	all, err := cgroup1.Default()
	if err != nil {
		return nil, err
	}
	var out []cgroup1.Subsystem
	for _, s := range all {
		if !slices.Contains(v1Wanted, s.Name()) {
			continue
		}
		if s.Name() == cgroup1.Memory {
			p, ok := s.(pather)
			if !ok {
				continue
			}
			root := filepath.Dir(p.Path("/")) // /sys/fs/cgroup/memory -> /sys/fs/cgroup
			s = cgroup1.NewMemory(root, cgroup1.OptionalSwap(), cgroup1.IgnoreModules("kmem", "kmem.tcp"))
		}
		out = append(out, s)
	}
	return out, nil
}

// v1Dirs maps each subsystem to its absolute directory for the nested path
// rel (below our own group in that hierarchy). Subsystems our process is not
// attached to are left out. It also returns the path within each hierarchy,
// as a cgroup1.Path: the library's NestedPath would read /proc/self/cgroup
// again on every call (every AddProc), and a pooled run makes many.
func v1Dirs(subs []cgroup1.Subsystem, rel string) (map[cgroup1.Name]string, cgroup1.Path, error) {
	path := cgroup1.NestedPath(rel)
	dirs := make(map[cgroup1.Name]string)
	rels := make(map[cgroup1.Name]string)
	for _, s := range subs {
		p, err := path(s.Name())
		if errors.Is(err, cgroup1.ErrControllerNotActive) {
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		if ps, ok := s.(pather); ok {
			dirs[s.Name()] = ps.Path(p)
			rels[s.Name()] = p
		}
	}
	fixed := func(n cgroup1.Name) (string, error) {
		if p, ok := rels[n]; ok {
			return p, nil
		}
		return "", cgroup1.ErrControllerNotActive
	}
	return dirs, fixed, nil
}

// newV1 creates <own>/pysandbox/<name> in the mounted hierarchies among
// only (all of v1Wanted when nil) and applies lim.
func newV1(name string, lim Limits, only []cgroup1.Name) (*v1Group, error) {
	subs, err := v1Subsystems()
	if err != nil {
		return nil, fmt.Errorf("cgroup: find v1 hierarchies: %w", err)
	}
	if only != nil {
		subs = slices.DeleteFunc(subs, func(s cgroup1.Subsystem) bool { return !slices.Contains(only, s.Name()) })
	}
	dirs, paths, err := v1Dirs(subs, baseName+"/"+name)
	if err != nil {
		return nil, fmt.Errorf("cgroup: find v1 group paths: %w", err)
	}
	subs = slices.DeleteFunc(subs, func(s cgroup1.Subsystem) bool { _, ok := dirs[s.Name()]; return !ok })
	g := &v1Group{dirs: dirs}
	if lim.MemoryBytes > 0 && dirs[cgroup1.Memory] == "" {
		return nil, errors.New("cgroup: v1 memory controller is not mounted; cannot limit memory")
	}
	if lim.Pids > 0 && dirs[cgroup1.Pids] == "" {
		return nil, errors.New("cgroup: v1 pids controller is not mounted; cannot limit pids")
	}
	if len(dirs) == 0 {
		return nil, errors.New("cgroup: none of the v1 memory, pids, cpuacct, freezer controllers is mounted")
	}
	for _, d := range dirs {
		// The library would silently reuse an existing directory, and with
		// it whatever processes and limits a stale group still has.
		if exists(d) {
			return nil, fmt.Errorf("cgroup: create %s: %w", d, os.ErrExist)
		}
	}
	if md := dirs[cgroup1.Memory]; md != "" {
		g.memsw = exists(filepath.Join(filepath.Dir(filepath.Dir(md)), "memory.memsw.limit_in_bytes"))
	}

	res := &specs.LinuxResources{}
	if lim.MemoryBytes > 0 {
		mem := lim.MemoryBytes
		res.Memory = &specs.LinuxMemory{Limit: &mem}
		if g.memsw {
			// memsw is RAM+swap; equal to the RAM limit it leaves no room
			// for swap, so MemoryBytes bounds the total.
			sw := mem
			res.Memory.Swap = &sw
		}
	}
	if lim.Pids > 0 {
		n := lim.Pids
		res.Pids = &specs.LinuxPids{Limit: &n}
	}
	if (lim.CPUMilli > 0 || lim.CPUWeight > 0) && dirs[cgroup1.Cpu] != "" {
		res.CPU = &specs.LinuxCPU{}
		if lim.CPUMilli > 0 {
			q, p := lim.quota(), uint64(cpuPeriod)
			res.CPU.Quota, res.CPU.Period = &q, &p
		}
		if lim.CPUWeight > 0 {
			sh := max(lim.CPUWeight*1024/100, 2)
			res.CPU.Shares = &sh
		}
	}
	cg, err := cgroup1.New(paths, res,
		cgroup1.WithHierarchy(func() ([]cgroup1.Subsystem, error) { return subs, nil }))
	if err != nil {
		// cgroup1.New leaves behind whatever it created before failing.
		for _, d := range dirs {
			_ = os.Remove(d)
		}
		return nil, fmt.Errorf("cgroup: create %s: %w", g.path(), err)
	}
	g.cg = cg
	if d := dirs[cgroup1.Cpu]; d != "" {
		parentShares.Do(func() {
			// Every sandbox of this server is below <own>/pysandbox, which
			// the kernel schedules as one entity against the processes
			// beside it: at the default weight all runs together would get
			// one process's share of a busy machine. Weigh them as one
			// process per CPU instead (each run is held to its own quota).
			_ = os.WriteFile(filepath.Join(filepath.Dir(d), "cpu.shares"), []byte(strconv.Itoa(1024*runtime.NumCPU())), 0)
		})
	}
	return g, nil
}

// parentShares sets the weight of <own>/pysandbox once per process.
var parentShares sync.Once

func (g *v1Group) path() string {
	if d, ok := g.dirs[cgroup1.Memory]; ok {
		return d
	}
	for _, n := range v1Wanted {
		if d, ok := g.dirs[n]; ok {
			return d
		}
	}
	return ""
}

// stats reads the counters a run reports, each from its own file. The
// library's Stat reads every file of every hierarchy (memory.stat, kmem,
// per-CPU usage...): at full pool throughput that was a fifth of the
// server's CPU time, for five numbers.
func (g *v1Group) stats() (Stats, error) {
	f, err := g.figures()
	if err != nil {
		return Stats{}, err
	}
	st := Stats{MemoryPeakBytes: f.MemoryPeakBytes, OOMKills: f.OOMKills, CPUUsage: f.CPUUsage}
	if st.MemoryCurrentBytes, err = g.memoryCurrent(); err != nil {
		return Stats{}, err
	}
	if d, ok := g.dirs[cgroup1.Pids]; ok {
		if st.PidsCurrent, err = g.f.readInt(filepath.Join(d, "pids.current")); err != nil {
			return Stats{}, err
		}
		if st.PidsMax, err = g.f.readInt(filepath.Join(d, "pids.max")); err != nil {
			return Stats{}, err
		}
	}
	return st, nil
}

// figures reads what Figures reports.
func (g *v1Group) figures() (Figures, error) {
	var f Figures
	var err error
	if d, ok := g.dirs[cgroup1.Memory]; ok {
		if f.MemoryPeakBytes, err = g.f.readInt(filepath.Join(d, g.memoryPrefix()+"max_usage_in_bytes")); err != nil {
			return Figures{}, err
		}
		if f.OOMKills, err = g.readOOMKills(d); err != nil {
			return Figures{}, err
		}
	}
	if f.CPUUsage, err = g.cpuUsage(); err != nil {
		return Figures{}, err
	}
	return f, nil
}

// memoryPrefix is the prefix of the memory files the limit bounds: memsw
// counts RAM+swap.
func (g *v1Group) memoryPrefix() string {
	if g.memsw {
		return "memory.memsw."
	}
	return "memory."
}

// memoryCurrent reads the memory the limit bounds, 0 without a memory
// hierarchy.
func (g *v1Group) memoryCurrent() (int64, error) {
	d, ok := g.dirs[cgroup1.Memory]
	if !ok {
		return 0, nil
	}
	return g.f.readInt(filepath.Join(d, g.memoryPrefix()+"usage_in_bytes"))
}

// cpuUsage reads cpuacct.usage, 0 without that hierarchy.
func (g *v1Group) cpuUsage() (time.Duration, error) {
	d, ok := g.dirs[cgroup1.Cpuacct]
	if !ok {
		return 0, nil
	}
	ns, err := g.f.readInt(filepath.Join(d, "cpuacct.usage"))
	return time.Duration(ns), err
}

// oomKills is the oom_kill counter of memory.oom_control, 0 when it cannot
// be read (or there is no memory hierarchy).
func (g *v1Group) oomKills() int64 {
	d, ok := g.dirs[cgroup1.Memory]
	if !ok {
		return 0
	}
	n, err := g.readOOMKills(d)
	if err != nil {
		return 0
	}
	return n
}

func (g *v1Group) readOOMKills(memoryDir string) (int64, error) {
	n, err := g.f.readKey(filepath.Join(memoryDir, "memory.oom_control"), "oom_kill")
	return max(n, 0), err
}

// empty reports whether no process is left in the group or below it. One
// hierarchy is enough, since every process of a sandbox is in all of them
// (AddProc writes to each, children inherit). Not pids.current, which still
// counts a process that exited until its parent reaps it.
func (g *v1Group) empty() bool {
	for _, n := range v1Wanted {
		if d, ok := g.dirs[n]; ok {
			// The pool asks after every run, and a run has made no group
			// below its own: a directory's link count is 2 plus its
			// subdirectories on cgroupfs (kernfs), so one stat tells, and
			// only the group's own cgroup.procs is left to read. Any other
			// count, or a stat that fails, takes the full walk.
			var st unix.Stat_t
			if unix.Stat(d, &st) == nil && st.Nlink == 2 {
				return noProcs(filepath.Join(d, "cgroup.procs"))
			}
			return len(procsBelow(d, nil)) == 0
		}
	}
	return true
}

// noProcs reports whether a cgroup.procs file lists no process: whether
// its first read returns nothing. One that cannot be read counts as
// empty, as procsBelow does. It opens the file each time rather than
// through the group's kept files (files.read): v1 keeps the pid list it
// built for an open file for a while and serves a later read from it, so
// a kept descriptor could see processes that have left, or miss new ones.
func noProcs(path string) bool {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return true
	}
	defer unix.Close(fd)
	var b [16]byte
	for {
		n, err := unix.Read(fd, b[:])
		if err == unix.EINTR {
			continue
		}
		return err != nil || n == 0
	}
}

// pids lists the processes in the group and its descendants across all
// its hierarchies. It reads cgroup.procs files rather than asking the
// library, whose walk stats every file of every directory.
func (g *v1Group) pids() []int {
	var out []int
	for _, d := range g.dirs {
		out = procsBelow(d, out)
	}
	return out
}

// procsBelow adds to out the pids in the cgroup.procs of dir and of every
// group below it, once each.
func procsBelow(dir string, out []int) []int {
	procs, err := readPids(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return out
	}
	for _, p := range procs {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.IsDir() {
			out = procsBelow(filepath.Join(dir, e.Name()), out)
		}
	}
	return out
}

// setFreezer writes freezer.state and waits until it reads back, until
// deadline. Plain file writes rather than the library's Freeze/Thaw: those
// loop with no time limit, and a task stuck in uninterruptible sleep can
// keep a v1 group in FREEZING for ever, while Kill must stay bounded.
func setFreezer(dir, state string, deadline time.Time) bool {
	f := filepath.Join(dir, "freezer.state")
	for i := 0; ; i++ {
		if err := os.WriteFile(f, []byte(state), 0); err != nil {
			return false
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return false
		}
		if strings.TrimSpace(string(b)) == state {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		sleepStep(i)
	}
}

func (g *v1Group) kill(deadline time.Time) error {
	return g.killLoop(g.dirs[cgroup1.Freezer], deadline)
}

// killLoop SIGKILLs every process in the group until it is empty, each
// round under the freezer when freezerDir is not "".
func (g *v1Group) killLoop(freezerDir string, deadline time.Time) error {
	fd, hasFreezer := freezerDir, freezerDir != ""
	for i := 0; ; i++ {
		pids := g.pids()
		if len(pids) == 0 {
			return nil
		}
		if hasFreezer {
			// Frozen tasks cannot fork; a v1-frozen task only acts on its
			// SIGKILL once thawed, hence freeze, signal, thaw.
			setFreezer(fd, "FROZEN", time.Now().Add(100*time.Millisecond))
			killPids(g.pids())
			setFreezer(fd, "THAWED", time.Now().Add(100*time.Millisecond))
		} else {
			killPids(pids)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d processes still present after %v: %w", len(g.pids()), killTimeout, unix.EBUSY)
		}
		sleepStep(i)
	}
}

func (g *v1Group) delete(deadline time.Time) error {
	g.f.close()
	var err error
	for i := 0; ; i++ {
		err = g.cg.Delete()
		if errors.Is(err, cgroup1.ErrCgroupDeleted) {
			err = nil
		}
		if err == nil {
			// Belt and braces: make sure every directory really is gone.
			for _, d := range g.dirs {
				if rerr := os.Remove(d); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
					err = rerr
				}
			}
			if err == nil {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return err
		}
		sleepStep(i)
	}
}

// v1Parent describes where v1 groups go, e.g.
// "memory=/sys/fs/cgroup/memory/x/pysandbox pids=/sys/fs/cgroup/pids/pysandbox".
func v1Parent(subs []cgroup1.Subsystem) string {
	dirs, _, err := v1Dirs(subs, baseName)
	if err != nil {
		return ""
	}
	var parts []string
	for _, n := range v1Wanted {
		if d, ok := dirs[n]; ok {
			parts = append(parts, string(n)+"="+d)
		}
	}
	return strings.Join(parts, " ")
}

func detectV1() Info {
	info := Info{Mode: ModeV1}
	subs, err := v1Subsystems()
	if err != nil {
		info.Reason = fmt.Sprintf("cgroup v1: cannot find the mounted hierarchies (%v); limits fall back to rlimits", err)
		return info
	}
	info.Parent = v1Parent(subs)
	var reasons []string

	const probeMem = 256 << 20
	if g, err := newV1(probeName(), Limits{MemoryBytes: probeMem}, []cgroup1.Name{cgroup1.Memory}); err != nil {
		reasons = append(reasons, v1Advice("memory", err))
	} else {
		d := g.dirs[cgroup1.Memory]
		lim, err1 := readInt(filepath.Join(d, "memory.limit_in_bytes"))
		var sw int64 = probeMem
		var err2 error
		if g.memsw {
			sw, err2 = readInt(filepath.Join(d, "memory.memsw.limit_in_bytes"))
		}
		switch {
		case err1 != nil || err2 != nil || lim != probeMem || sw != probeMem:
			reasons = append(reasons, fmt.Sprintf("cgroup v1: memory limit did not take effect in %s (read back %d/%d, %v %v); limits fall back to rlimits", d, lim, sw, err1, err2))
		case !g.memsw && swapActive():
			reasons = append(reasons, "cgroup v1: swap is on but the kernel has no swap accounting (memory.memsw.* missing), so a memory limit would not cover swap; boot with swapaccount=1 or turn swap off, or memory limits fall back to rlimits")
		default:
			info.Memory = true
		}
		if err := g.delete(time.Now().Add(deleteTimeout)); err != nil {
			reasons = append(reasons, fmt.Sprintf("cgroup v1: cannot remove probe group %s: %v", d, err))
		}
	}

	if g, err := newV1(probeName(), Limits{CPUMilli: 500}, []cgroup1.Name{cgroup1.Cpu}); err == nil {
		q, err := readInt(filepath.Join(g.dirs[cgroup1.Cpu], "cpu.cfs_quota_us"))
		info.CPU = g.dirs[cgroup1.Cpu] != "" && err == nil && q == 50_000
		g.delete(time.Now().Add(deleteTimeout))
	}

	const probePids = 64
	if g, err := newV1(probeName(), Limits{Pids: probePids}, []cgroup1.Name{cgroup1.Pids}); err != nil {
		reasons = append(reasons, v1Advice("pids", err))
	} else {
		d := g.dirs[cgroup1.Pids]
		if n, err := readInt(filepath.Join(d, "pids.max")); err != nil || n != probePids {
			reasons = append(reasons, fmt.Sprintf("cgroup v1: pids limit did not take effect in %s; limits fall back to rlimits", d))
		} else {
			info.Pids = true
		}
		if err := g.delete(time.Now().Add(deleteTimeout)); err != nil {
			reasons = append(reasons, fmt.Sprintf("cgroup v1: cannot remove probe group %s: %v", d, err))
		}
	}
	info.Reason = joinReasons(reasons)
	return info
}

func v1Advice(ctrl string, err error) string {
	switch {
	case errors.Is(err, os.ErrPermission), errors.Is(err, unix.EROFS):
		return fmt.Sprintf("cgroup v1: no permission to create a %s group (%v): run as root or give this service a writable cgroup (systemd Delegate=yes), or limits fall back to rlimits", ctrl, err)
	default:
		return fmt.Sprintf("cgroup v1: cannot use the %s controller (%v); limits fall back to rlimits", ctrl, err)
	}
}

// maxResidue is what may stay charged to an emptied group that is
// reused: the kernel objects of the last run that reclaim cannot free
// at once. More, and the group is deleted rather than reused.
const maxResidue = 1 << 20

// reset zeroes the counters a new run must not inherit. Writing 0 to a
// max_usage file sets it to the current usage; to failcnt and
// cpuacct.usage, to zero.
//
// So the current usage must be near zero first. On v1 the page cache a
// run read or wrote stays charged to its group after its processes are
// gone: left there, the next run's peak would start at it (an attack
// read 500 MB of files and the next run, a print, reported a 517 MB
// peak), and the next run would pay the CPU of reclaiming it. Writing
// memory.force_empty reclaims it now, in the server's time; a group that
// still holds more than maxResidue is not reused.
func (g *v1Group) reset() error {
	var files []string
	if d, ok := g.dirs[cgroup1.Memory]; ok {
		// The kernel objects of the last run's processes (page tables,
		// task structures) are freed a little after them, after an RCU
		// grace period: a few tries, then give up on this group.
		// force_empty is not cheap (it drains every CPU's page lists
		// first): only when more than maxResidue is charged, which a run
		// that read no files does not leave.
		for i := 0; ; i++ {
			used, err := g.memoryCurrent()
			if err != nil {
				return err
			}
			if used <= maxResidue {
				break
			}
			if err := g.f.write(filepath.Join(d, "memory.force_empty"), "0"); err != nil {
				return err
			}
			if used, err = g.memoryCurrent(); err != nil {
				return err
			}
			if used <= maxResidue {
				break
			}
			if i == 4 {
				return fmt.Errorf("%d bytes still charged after memory.force_empty", used)
			}
			time.Sleep(time.Duration(i+1) * 5 * time.Millisecond)
		}
		files = append(files, filepath.Join(d, "memory.max_usage_in_bytes"), filepath.Join(d, "memory.failcnt"))
		if g.memsw {
			files = append(files, filepath.Join(d, "memory.memsw.max_usage_in_bytes"), filepath.Join(d, "memory.memsw.failcnt"))
		}
	}
	if d, ok := g.dirs[cgroup1.Cpuacct]; ok {
		files = append(files, filepath.Join(d, "cpuacct.usage"))
	}
	for _, f := range files {
		if err := g.f.write(f, "0"); err != nil {
			return err
		}
	}
	return nil
}
