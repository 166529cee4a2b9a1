package cgroup

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	cgroups "github.com/containerd/cgroups/v3"
	"golang.org/x/sys/unix"
)

// Mode describes what this machine offers.
type Mode string

const (
	ModeV1   Mode = "v1"   // legacy or hybrid layout; limits use the v1 hierarchies
	ModeV2   Mode = "v2"   // unified layout
	ModeNone Mode = "none" // no cgroup filesystem at /sys/fs/cgroup
)

// Info is the result of Detect.
type Info struct {
	Mode Mode
	// Memory reports that a memory limit which includes swap can be applied
	// to a child group (or that it excludes swap only because the host has
	// no active swap).
	Memory bool
	// Pids reports that a limit on the number of tasks can be applied.
	Pids bool
	// CPU reports that a CPU quota and weight can be applied (the v1 cpu
	// hierarchy, or the v2 cpu controller).
	CPU bool
	// Parent is where child groups are created: one directory on v2; on v1
	// one "controller=directory" pair per hierarchy, separated by spaces.
	Parent string
	// Reason says why something is unavailable, in words a user can act on.
	// Empty when Memory and Pids are both true.
	Reason string
}

// Limits for a new group. A zero field means "no limit".
type Limits struct {
	MemoryBytes int64 // RAM + swap, in bytes
	Pids        int64 // tasks (processes and threads)
	// CPUMilli is a CPU quota in thousandths of a CPU (1000: one CPU's
	// worth of time per period, however many CPUs the group runs on).
	CPUMilli int64
	// CPUWeight is the group's share when CPUs are contended, on the v2
	// scale (1 to 10000, default 100; v1 shares are 1024/100 of it).
	CPUWeight uint64
}

// Group is one run's control group. Its methods are safe for concurrent use.
type Group struct {
	name string
	lim  Limits
	v1   *v1Group
	v2   *v2Group

	mu      sync.Mutex
	deleted bool
	// oomBase is the OOM kill count when the group was last Reset: the
	// kernel's counter cannot be zeroed.
	oomBase atomic.Int64
	// idle says SetIdle(true) was the last to succeed, so that Reset only
	// writes the quota back when it changed.
	idle atomic.Bool
}

// ErrNoReuse means a group cannot be reset for another run on this
// cgroup version; delete it and create a new one.
var ErrNoReuse = errors.New("cgroup: reuse needs cgroup v1")

// Reset prepares an empty group for another run, which is much cheaper than
// deleting it and creating a new one (memory cgroups are expensive to set
// up and to tear down): it zeroes the peak memory and fail counters and
// the CPU usage, and takes the OOM kill counter as the new baseline. It
// refuses a group that still has processes. v1 only (ErrNoReuse on v2,
// where memory.peak and cpu.stat cannot be zeroed on every kernel).
func (g *Group) Reset() error {
	if err := g.live(); err != nil {
		return err
	}
	if g.v2 != nil {
		return ErrNoReuse
	}
	if !g.v1.empty() {
		return fmt.Errorf("cgroup: reset %s: processes are still in it", g.Path())
	}
	if err := g.v1.reset(); err != nil {
		return fmt.Errorf("cgroup: reset %s: %w", g.Path(), err)
	}
	g.oomBase.Store(g.v1.oomKills())
	// A session's group may have been left at the idle quota.
	if g.idle.Load() && g.CanIdle() {
		if err := g.SetIdle(false); err != nil {
			return fmt.Errorf("cgroup: reset %s: %w", g.Path(), err)
		}
	}
	return nil
}

const (
	baseName   = "pysandbox"        // parent of all our groups, below our own group
	serverLeaf = "pysandbox-server" // v2 leaf our own processes move into
	probePfx   = "pysandbox-probe-" // Detect's probe groups

	killTimeout   = time.Second
	deleteTimeout = time.Second
)

var (
	errDeleted = errors.New("group was deleted")
	probeSeq   atomic.Uint64
)

// hostMode reports the cgroup layout of this machine.
func hostMode() Mode {
	switch cgroups.Mode() {
	case cgroups.Unified:
		return ModeV2
	case cgroups.Legacy, cgroups.Hybrid:
		// In the hybrid layout the unified hierarchy (/sys/fs/cgroup/unified)
		// carries no controllers, so limits must go through v1.
		return ModeV1
	default:
		return ModeNone
	}
}

// Detect reports what this machine offers, measured by creating (and
// removing) a probe group with each limit. On a v2 host this may move this
// process into the <own>/pysandbox-server leaf (see the package comment).
func Detect() Info {
	switch hostMode() {
	case ModeV1:
		return detectV1()
	case ModeV2:
		return defaultV2.detect()
	default:
		return Info{Mode: ModeNone, Reason: "no cgroup filesystem is mounted at /sys/fs/cgroup; limits fall back to rlimits"}
	}
}

// New creates the group <parent>/pysandbox/<name> with the given limits.
// name must be a single path element (no '/', no "..") chosen by the caller,
// unique among live groups. It fails when a requested limit cannot be
// applied; Detect tells in advance whether it can.
func New(name string, lim Limits) (*Group, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	if lim.MemoryBytes < 0 || lim.Pids < 0 || lim.CPUMilli < 0 || lim.CPUWeight > 10000 {
		return nil, fmt.Errorf("cgroup: invalid limits %+v: negative value", lim)
	}
	g := &Group{name: name, lim: lim}
	var err error
	switch hostMode() {
	case ModeV1:
		g.v1, err = newV1(name, lim, nil)
	case ModeV2:
		g.v2, err = defaultV2.newGroup(name, lim)
	default:
		err = errors.New("cgroup: no cgroup filesystem is mounted at /sys/fs/cgroup")
	}
	if err != nil {
		return nil, err
	}
	return g, nil
}

func validName(name string) error {
	switch {
	case name == "":
		return errors.New("cgroup: invalid group name: empty")
	case len(name) > 200:
		return fmt.Errorf("cgroup: invalid group name %.20q...: longer than 200 bytes", name)
	case strings.Contains(name, "/"):
		return fmt.Errorf("cgroup: invalid group name %q: contains '/'", name)
	case strings.Contains(name, ".."), name == ".":
		return fmt.Errorf("cgroup: invalid group name %q: contains '..' or is '.'", name)
	case name == serverLeaf, strings.HasPrefix(name, probePfx):
		return fmt.Errorf("cgroup: invalid group name %q: reserved", name)
	}
	for _, r := range name {
		// Control characters (a newline above all) would corrupt
		// /proc/<pid>/cgroup for anyone parsing it line by line.
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("cgroup: invalid group name %q: contains a control character", name)
		}
	}
	return nil
}

// Path is the group's directory: on v2 the only one, on v1 the one in the
// memory hierarchy (or the first hierarchy the group lives in).
func (g *Group) Path() string {
	if g.v2 != nil {
		return g.v2.dir
	}
	return g.v1.path()
}

func (g *Group) live() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.deleted {
		return fmt.Errorf("cgroup: %s: %w", g.Path(), errDeleted)
	}
	return nil
}

// AddProc moves the process pid (all its threads) into the group.
func (g *Group) AddProc(pid int) error {
	if pid <= 0 {
		return fmt.Errorf("cgroup: add pid %d to %s: invalid pid", pid, g.Path())
	}
	if err := g.live(); err != nil {
		return err
	}
	var err error
	if g.v2 != nil {
		err = g.v2.m.AddProc(uint64(pid))
	} else {
		err = g.v1.addProc(pid)
	}
	if err != nil {
		return fmt.Errorf("cgroup: add pid %d to %s: %w", pid, g.Path(), err)
	}
	return nil
}

// Kill SIGKILLs every process in the group and waits, about a second at
// most, until the group is empty. On v2 it uses cgroup.kill when the kernel
// has it (5.14+); otherwise it freezes the group (v1 freezer or v2
// cgroup.freeze, when available) so nothing can fork, SIGKILLs every pid,
// thaws, and repeats until the group is empty.
func (g *Group) Kill() error {
	if err := g.live(); err != nil {
		return err
	}
	deadline := time.Now().Add(killTimeout)
	var err error
	if g.v2 != nil {
		err = g.v2.kill(deadline)
	} else {
		err = g.v1.kill(deadline)
	}
	if err != nil {
		return fmt.Errorf("cgroup: kill %s: %w", g.Path(), err)
	}
	return nil
}

// Delete removes the group's directory in every hierarchy. The group must
// be empty (see Kill); Delete retries for about a second while the kernel
// finishes tearing processes down. Calling it again is a no-op.
func (g *Group) Delete() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.deleted {
		return nil
	}
	deadline := time.Now().Add(deleteTimeout)
	var err error
	if g.v2 != nil {
		err = g.v2.delete(deadline)
	} else {
		err = g.v1.delete(deadline)
	}
	if err != nil {
		return fmt.Errorf("cgroup: delete %s: %w", g.Path(), err)
	}
	g.deleted = true
	return nil
}

// FD opens the group's directory (O_RDONLY|O_DIRECTORY|O_CLOEXEC) for
// clone3's CLONE_INTO_CGROUP, e.g. syscall.SysProcAttr{UseCgroupFD: true,
// CgroupFD: fd}, which starts a child directly inside the group with no
// window in which it runs unlimited. The caller closes the fd. v2 only.
func (g *Group) FD() (int, error) {
	if err := g.live(); err != nil {
		return -1, err
	}
	if g.v2 == nil {
		return -1, fmt.Errorf("cgroup: fd %s: CLONE_INTO_CGROUP needs cgroup v2, this group is v1; use AddProc", g.Path())
	}
	fd, err := unix.Open(g.v2.dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("cgroup: fd %s: %w", g.v2.dir, err)
	}
	return fd, nil
}

// probeName is a fresh name for a Detect probe group.
func probeName() string {
	return fmt.Sprintf("%s%d-%d", probePfx, os.Getpid(), probeSeq.Add(1))
}

// swapActive reports whether any swap area is in use (/proc/swaps has more
// than its header line). Without swap, a limit that excludes swap is still
// a limit on total memory.
func swapActive() bool {
	f, err := os.Open("/proc/swaps")
	if err != nil {
		return true // be pessimistic
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	n := 0
	for s.Scan() {
		n++
	}
	return n > 1
}

// readInt reads a file holding one integer ("max" reads as 0).
func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 0, nil
	}
	return strconv.ParseInt(s, 10, 64)
}

// readKey returns the value of key in a "key value" per line file such as
// memory.oom_control or memory.events.
func readKey(path, key string) (int64, bool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false, err
	}
	n, err := parseKey(b, key)
	if n < 0 {
		return 0, false, err
	}
	return n, err == nil, err
}

// parseKey finds key in "key value" lines; -1 when it is not there.
func parseKey(b []byte, key string) (int64, error) {
	for line := range strings.SplitSeq(string(b), "\n") {
		k, v, ok := strings.Cut(line, " ")
		if ok && k == key {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return -1, nil
}

// readPids reads a cgroup.procs file.
func readPids(path string) ([]int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if p, err := strconv.Atoi(f); err == nil {
			pids = append(pids, p)
		}
	}
	return pids, nil
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// killPids sends SIGKILL to each pid; pids that already left are fine.
func killPids(pids []int) {
	for _, p := range pids {
		_ = unix.Kill(p, unix.SIGKILL)
	}
}

// sleepStep sleeps a little longer each round, up to 20ms.
func sleepStep(round int) {
	d := time.Duration(round+1) * 2 * time.Millisecond
	if d > 20*time.Millisecond {
		d = 20 * time.Millisecond
	}
	time.Sleep(d)
}

func joinReasons(rs []string) string {
	var out []string
	for _, r := range rs {
		if r != "" {
			out = append(out, r)
		}
	}
	return strings.Join(out, "; ")
}
