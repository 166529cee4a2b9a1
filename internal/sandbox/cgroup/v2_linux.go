package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containerd/cgroups/v3/cgroup2"
	"golang.org/x/sys/unix"
)

// v2Host is a cgroup2 mount and the state of our setup below our own group
// in it. defaultV2 is /sys/fs/cgroup; tests use other mounts.
type v2Host struct {
	mount string

	mu  sync.Mutex
	own string // our own group, relative to mount; "" until first known
	// selfGroup, when set, replaces /proc/self/cgroup (tests).
	selfGroup func() (string, error)
}

var defaultV2 = &v2Host{mount: "/sys/fs/cgroup"}

type v2Group struct {
	m   *cgroup2.Manager
	dir string
}

// ownGroup is our own group relative to the mount. Once known it is kept:
// after a move into the server leaf, /proc/self/cgroup names the leaf. A
// process started inside a leaf left by an earlier server recognises it by
// name. Called with h.mu held.
func (h *v2Host) ownGroup() (string, error) {
	if h.own != "" {
		return h.own, nil
	}
	self := h.selfGroup
	if self == nil {
		self = func() (string, error) { return cgroup2.NestedGroupPath("") }
	}
	g, err := self()
	if err != nil {
		return "", fmt.Errorf("cgroup: find own v2 group: %w", err)
	}
	g = path.Clean("/" + g)
	if path.Base(g) == serverLeaf {
		g = path.Dir(g)
	}
	h.own = g
	return g, nil
}

// v2Resources is a Resources that makes NewChild enable the given
// controllers (and write nothing), or nil when there are none.
func v2Resources(controllers []string) *cgroup2.Resources {
	if len(controllers) == 0 {
		return nil
	}
	r := &cgroup2.Resources{}
	for _, c := range controllers {
		switch c {
		case "memory":
			r.Memory = &cgroup2.Memory{}
		case "pids":
			r.Pids = &cgroup2.Pids{}
		case "cpu":
			r.CPU = &cgroup2.CPU{}
		}
	}
	return r
}

// errNotDelegated marks setups that fail because the controllers or the
// directory are not ours to use.
var errNotDelegated = errors.New("not delegated")

// prepare makes <own>/pysandbox exist with the controllers enabled for its
// children, moving our own group's processes into <own>/pysandbox-server
// first when the "no internal processes" rule requires it. It returns the
// manager of <own>/pysandbox and its directory.
func (h *v2Host) prepare(controllers []string) (*cgroup2.Manager, string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	own, err := h.ownGroup()
	if err != nil {
		return nil, "", err
	}
	ownDir := filepath.Join(h.mount, own)
	ownMgr, err := cgroup2.Load(own, cgroup2.WithMountpoint(h.mount))
	if err != nil {
		return nil, "", fmt.Errorf("cgroup: load %s: %w", ownDir, err)
	}
	if len(controllers) > 0 {
		avail, err := ownMgr.Controllers()
		if err != nil {
			return nil, "", fmt.Errorf("cgroup: read %s: %w", filepath.Join(ownDir, "cgroup.controllers"), err)
		}
		var missing []string
		for _, c := range controllers {
			if !slices.Contains(avail, c) {
				missing = append(missing, c)
			}
		}
		if len(missing) > 0 {
			return nil, "", fmt.Errorf("cgroup: controllers %s are not available in %s: %w", strings.Join(missing, ","), ownDir, errNotDelegated)
		}
	}
	res := v2Resources(controllers)
	baseDir := filepath.Join(ownDir, baseName)
	// NewChild creates <own>/pysandbox and writes +memory +pids into the
	// subtree_control of each ancestor from the mount down to <own>; the
	// writes above <own> may fail unprivileged (not ours) or be no-ops, only
	// the one in <own> must succeed.
	base, err := ownMgr.NewChild(baseName, res)
	if err != nil && errors.Is(err, unix.EBUSY) {
		// <own> holds processes (us, at least) and so cannot pass
		// controllers on: move them into a leaf, as crun and systemd do.
		if merr := h.moveToLeaf(ownDir); merr != nil {
			return nil, "", fmt.Errorf("cgroup: enable controllers in %s: %w (moving its processes into %s: %v)", ownDir, err, serverLeaf, merr)
		}
		base, err = ownMgr.NewChild(baseName, res)
	}
	if err != nil {
		if errors.Is(err, os.ErrPermission) || errors.Is(err, unix.EROFS) {
			err = fmt.Errorf("%w: %w", err, errNotDelegated)
		}
		return nil, "", fmt.Errorf("cgroup: create %s: %w", baseDir, err)
	}
	return base, baseDir, nil
}

// moveToLeaf moves every process of ownDir (not of its children) into
// ownDir/pysandbox-server. Processes that exit meanwhile are skipped.
func (h *v2Host) moveToLeaf(ownDir string) error {
	leaf := filepath.Join(ownDir, serverLeaf)
	if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	leafMgr, err := cgroup2.Load(strings.TrimPrefix(leaf, h.mount), cgroup2.WithMountpoint(h.mount))
	if err != nil {
		return err
	}
	// A process may fork while we move; go round until <own> is empty.
	for i := 0; i < 50; i++ {
		pids, err := readPids(filepath.Join(ownDir, "cgroup.procs"))
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		for _, p := range pids {
			if err := leafMgr.AddProc(uint64(p)); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("move pid %d: %w", p, err)
			}
		}
	}
	return fmt.Errorf("%s keeps gaining processes", ownDir)
}

func (h *v2Host) newGroup(name string, lim Limits) (*v2Group, error) {
	var controllers []string
	if lim.MemoryBytes > 0 {
		controllers = append(controllers, "memory")
	}
	if lim.Pids > 0 {
		controllers = append(controllers, "pids")
	}
	if lim.CPUMilli > 0 || lim.CPUWeight > 0 {
		// Callers ask for CPU limits only where Detect found the
		// controller (Info.CPU), as for memory and pids.
		controllers = append(controllers, "cpu")
	}
	base, baseDir, err := h.prepare(controllers)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(baseDir, name)
	if exists(dir) {
		// NewChild would silently reuse a stale group and its processes.
		return nil, fmt.Errorf("cgroup: create %s: %w", dir, os.ErrExist)
	}
	var res *cgroup2.Resources
	if len(controllers) > 0 {
		res = &cgroup2.Resources{}
		if lim.MemoryBytes > 0 {
			mem := lim.MemoryBytes
			res.Memory = &cgroup2.Memory{Max: &mem}
		}
		if lim.Pids > 0 {
			res.Pids = &cgroup2.Pids{Max: lim.Pids}
		}
		if slices.Contains(controllers, "cpu") {
			res.CPU = &cgroup2.CPU{}
			if lim.CPUMilli > 0 {
				q, p := lim.quota(), uint64(cpuPeriod)
				res.CPU.Max = cgroup2.NewCPUMax(&q, &p)
			}
			if lim.CPUWeight > 0 {
				w := lim.CPUWeight
				res.CPU.Weight = &w
			}
		}
	}
	// NewChild also (re-)enables the controllers in <own>/pysandbox's
	// subtree_control, so the new group gets memory.* and pids.* files.
	m, err := base.NewChild(name, res)
	if err != nil {
		return nil, fmt.Errorf("cgroup: create %s: %w", dir, err)
	}
	g := &v2Group{m: m, dir: dir}
	// memory.swap.max exists only with swap accounting and only once the
	// memory controller is enabled, hence a second step. 0 means the group
	// may not swap at all, so memory.max alone bounds its memory.
	if lim.MemoryBytes > 0 && exists(filepath.Join(dir, "memory.swap.max")) {
		zero := int64(0)
		if err := m.Update(&cgroup2.Resources{Memory: &cgroup2.Memory{Swap: &zero}}); err != nil {
			_ = os.Remove(dir)
			return nil, fmt.Errorf("cgroup: create %s: set memory.swap.max: %w", dir, err)
		}
	}
	return g, nil
}

func (g *v2Group) stats() (Stats, error) {
	m, err := g.m.StatFiltered(cgroup2.StatPids | cgroup2.StatCPU | cgroup2.StatMemory | cgroup2.StatMemoryEvents)
	if err != nil {
		return Stats{}, err
	}
	if !exists(g.dir) {
		// The library reads missing files as 0 rather than failing.
		return Stats{}, os.ErrNotExist
	}
	st := Stats{
		MemoryCurrentBytes: int64(m.GetMemory().GetUsage()),
		MemoryPeakBytes:    int64(m.GetMemory().GetMaxUsage()),
		OOMKills:           int64(m.GetMemoryEvents().GetOomKill()),
		PidsCurrent:        int64(m.GetPids().GetCurrent()),
		CPUUsage:           time.Duration(m.GetCPU().GetUsageUsec()) * time.Microsecond,
	}
	if l := m.GetPids().GetLimit(); l < 1<<62 { // "max" reads as MaxUint64
		st.PidsMax = int64(l)
	}
	if st.MemoryPeakBytes < st.MemoryCurrentBytes { // no memory.peak before 5.19
		st.MemoryPeakBytes = st.MemoryCurrentBytes
	}
	return st, nil
}

// figures reads what Figures reports: from the same counters as stats.
func (g *v2Group) figures() (Figures, error) {
	st, err := g.stats()
	if err != nil {
		return Figures{}, err
	}
	return Figures{MemoryPeakBytes: st.MemoryPeakBytes, CPUUsage: st.CPUUsage, OOMKills: st.OOMKills}, nil
}

// memoryCurrent reads memory.current.
func (g *v2Group) memoryCurrent() (int64, error) {
	return readInt(filepath.Join(g.dir, "memory.current"))
}

// cpuUsage reads cpu.stat's usage_usec.
func (g *v2Group) cpuUsage() (time.Duration, error) {
	us, _, err := readKey(filepath.Join(g.dir, "cpu.stat"), "usage_usec")
	return time.Duration(us) * time.Microsecond, err
}

func (g *v2Group) oomKills() int64 {
	m, err := g.m.StatFiltered(cgroup2.StatMemoryEvents)
	if err != nil {
		return 0
	}
	return int64(m.GetMemoryEvents().GetOomKill())
}

// empty reports whether no process is left in the group or below it.
func (g *v2Group) empty() bool {
	if n, ok, err := readKey(filepath.Join(g.dir, "cgroup.events"), "populated"); err == nil && ok {
		return n == 0
	}
	pids, err := g.m.Procs(true)
	return err == nil && len(pids) == 0
}

func (g *v2Group) kill(deadline time.Time) error {
	if exists(filepath.Join(g.dir, "cgroup.kill")) {
		// Only when the file exists: without it the library falls back to
		// a freeze loop with no time limit.
		if err := g.m.Kill(); err != nil {
			return err
		}
		for i := 0; !g.empty(); i++ {
			if time.Now().After(deadline) {
				return fmt.Errorf("group still populated after %v: %w", killTimeout, unix.EBUSY)
			}
			sleepStep(i)
		}
		return nil
	}
	return g.killLoop(deadline)
}

// killLoop is Kill for kernels before 5.14: freeze (5.2+) so nothing forks,
// SIGKILL every pid, thaw, repeat until empty. Frozen v2 tasks do act on
// SIGKILL; thawing only lets the loop see a settled state. Plain writes to
// cgroup.freeze because the library's Freeze waits with no time limit.
func (g *v2Group) killLoop(deadline time.Time) error {
	freeze := filepath.Join(g.dir, "cgroup.freeze")
	canFreeze := exists(freeze)
	for i := 0; ; i++ {
		pids, err := g.m.Procs(true)
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		if canFreeze {
			_ = os.WriteFile(freeze, []byte("1"), 0)
			waitFrozen(g.dir, time.Now().Add(100*time.Millisecond))
			if p, err := g.m.Procs(true); err == nil {
				pids = p
			}
		}
		for _, p := range pids {
			_ = unix.Kill(int(p), unix.SIGKILL)
		}
		if canFreeze {
			_ = os.WriteFile(freeze, []byte("0"), 0)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d processes still present after %v: %w", len(pids), killTimeout, unix.EBUSY)
		}
		sleepStep(i)
	}
}

// waitFrozen waits until cgroup.events says "frozen 1", until deadline.
func waitFrozen(dir string, deadline time.Time) {
	for i := 0; time.Now().Before(deadline); i++ {
		if n, ok, _ := readKey(filepath.Join(dir, "cgroup.events"), "frozen"); ok && n == 1 {
			return
		}
		sleepStep(i)
	}
}

func (g *v2Group) delete(deadline time.Time) error {
	for i := 0; ; i++ {
		if !exists(g.dir) {
			return nil
		}
		err := g.m.Delete()
		if err == nil || !exists(g.dir) {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		sleepStep(i)
	}
}

func (h *v2Host) detect() Info {
	info := Info{Mode: ModeV2}
	h.mu.Lock()
	own, err := h.ownGroup()
	h.mu.Unlock()
	if err != nil {
		info.Reason = fmt.Sprintf("cgroup v2: %v; limits fall back to rlimits", err)
		return info
	}
	ownDir := filepath.Join(h.mount, own)
	info.Parent = filepath.Join(ownDir, baseName)

	b, err := os.ReadFile(filepath.Join(ownDir, "cgroup.controllers"))
	if err != nil {
		info.Reason = fmt.Sprintf("cgroup v2: cannot read %s: %v; limits fall back to rlimits", ownDir, err)
		return info
	}
	avail := strings.Fields(string(b))
	var want, missing []string
	for _, c := range []string{"memory", "pids"} {
		if slices.Contains(avail, c) {
			want = append(want, c)
		} else {
			missing = append(missing, c)
		}
	}
	var reasons []string
	if len(missing) > 0 {
		reasons = append(reasons, fmt.Sprintf("cgroup v2 without delegation of %s to %s: run under systemd-run --user -p Delegate=yes (or a service with Delegate=yes), or limits fall back to rlimits", strings.Join(missing, ","), ownDir))
	}
	if len(want) > 0 {
		if _, _, err := h.prepare(want); err != nil {
			if errors.Is(err, errNotDelegated) {
				reasons = append(reasons, fmt.Sprintf("cgroup v2 without delegation (%v): run under systemd-run --user -p Delegate=yes (or a service with Delegate=yes), or limits fall back to rlimits", err))
			} else {
				reasons = append(reasons, fmt.Sprintf("cgroup v2: %v; limits fall back to rlimits", err))
			}
			want = nil
		}
	}
	if slices.Contains(want, "memory") {
		info.Memory, reasons = h.probeMemory(reasons)
	}
	if slices.Contains(want, "pids") {
		info.Pids, reasons = h.probePids(reasons)
	}
	info.CPU = slices.Contains(avail, "cpu")
	info.Reason = joinReasons(reasons)
	return info
}

func (h *v2Host) probeMemory(reasons []string) (bool, []string) {
	const probeMem = 256 << 20
	g, err := h.newGroup(probeName(), Limits{MemoryBytes: probeMem})
	if err != nil {
		return false, append(reasons, fmt.Sprintf("cgroup v2: cannot create a memory-limited group: %v; limits fall back to rlimits", err))
	}
	ok, why := true, ""
	swap := filepath.Join(g.dir, "memory.swap.max")
	if n, err := readInt(filepath.Join(g.dir, "memory.max")); err != nil || n != probeMem {
		ok, why = false, fmt.Sprintf("cgroup v2: memory.max did not take effect in %s; limits fall back to rlimits", g.dir)
	} else if !exists(swap) {
		if swapActive() {
			ok, why = false, "cgroup v2: swap is on but the kernel has no swap accounting (memory.swap.max missing), so a memory limit would not cover swap; turn swap off or enable swap accounting, or memory limits fall back to rlimits"
		}
	} else if b, err := os.ReadFile(swap); err != nil || strings.TrimSpace(string(b)) != "0" {
		ok, why = false, fmt.Sprintf("cgroup v2: memory.swap.max did not take effect in %s; limits fall back to rlimits", g.dir)
	}
	return ok, append(reasons, why, h.removeProbe(g))
}

func (h *v2Host) probePids(reasons []string) (bool, []string) {
	const probePids = 64
	g, err := h.newGroup(probeName(), Limits{Pids: probePids})
	if err != nil {
		return false, append(reasons, fmt.Sprintf("cgroup v2: cannot create a pids-limited group: %v; limits fall back to rlimits", err))
	}
	ok, why := true, ""
	if n, err := readInt(filepath.Join(g.dir, "pids.max")); err != nil || n != probePids {
		ok, why = false, fmt.Sprintf("cgroup v2: pids.max did not take effect in %s; limits fall back to rlimits", g.dir)
	}
	return ok, append(reasons, why, h.removeProbe(g))
}

// removeProbe deletes a probe group and says what went wrong, if anything.
func (h *v2Host) removeProbe(g *v2Group) string {
	if err := g.delete(time.Now().Add(deleteTimeout)); err != nil {
		return fmt.Sprintf("cgroup v2: cannot remove probe group %s: %v", g.dir, err)
	}
	return ""
}
