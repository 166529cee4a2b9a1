package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pysandbox/pysandbox/internal/sandbox/cgroup"
	"github.com/pysandbox/pysandbox/internal/sandbox/seccomp"
)

// Bwrap builds the same sandbox as Native with bubblewrap, for hosts that
// allow user namespaces only to bwrap (Ubuntu's AppArmor profile, for one).
//
// bwrap runs inside a small shim re-executed from this binary: the server
// puts the shim into the sandbox's cgroup before telling it anything, the
// shim sets the rlimits (and, for a root server, becomes a host uid of the
// sandbox's own) and execs bwrap, so bwrap and everything it starts are
// limited from their first instruction. bwrap then creates the namespaces,
// builds the root from read-only binds and tmpfs, drops every capability,
// installs our seccomp filter and execs the interpreter. Its options travel
// in a memory file (--args), so the host's ps shows no environment; its own
// error messages are held back from the sandbox's stderr until the
// interpreter has been exec'd, and become Start's error otherwise.
//
// What differs from Native, and why:
//   - /tmp, /work and /dev/shm are three tmpfs of TmpBytes each, not one
//     shared tmpfs: bwrap takes bind sources from the host only, so it cannot
//     bind one tmpfs of its own to several places. The memory cgroup still
//     charges tmpfs pages to the sandbox, and RLIMIT_FSIZE caps each file.
//   - The interpreter is pid 2: pid 1 is bwrap's reaper, which runs as the
//     same uid under the same seccomp filter and capability drop. Two extra
//     tasks (that reaper and bwrap's monitor outside) count towards pids.max.
//   - bwrap adds PWD=/work to the environment.
//   - bwrap reports a worker killed by signal n as exit code 128+n; Exit maps
//     such codes back to Signal, so an interpreter that exits with 129..192
//     on its own is reported as killed by a signal.
//   - Without a cgroup, PeakMemoryBytes and CPUTime are 0: the interpreter is
//     not our child, so its rusage never reaches us.
//   - A root server runs bwrap as a per-sandbox host uid (like Native's
//     worker), so bind sources such as an interpreter prefix under /root must
//     be readable by other users.
//   - /dev also has bwrap's tty and pts nodes.
//   - bwrap's pid 1 arms its parent-death signal only after setup: if the
//     server dies in the milliseconds between bwrap's clone and then, the
//     sandbox runs on to its end (still under its rlimits and cgroup) rather
//     than being killed at once.
type Bwrap struct {
	path    string
	version string
	cgroups cgroup.Info
	root    bool
	// disableUserns is set when this bwrap has --disable-userns. Without it
	// the seccomp filter alone refuses new user namespaces.
	disableUserns bool
}

// bwrapShimArg0 is argv[0] of the re-executed shim that execs bwrap.
const bwrapShimArg0 = "pysandbox-bwrap-shim"

const (
	// bwrapSetupTimeout bounds the time from starting the shim to the exec
	// of the interpreter.
	bwrapSetupTimeout = 30 * time.Second
	// bwrapDrainTimeout bounds the wait for the output pipes and for the
	// sandbox's pid 1 once bwrap itself has exited.
	bwrapDrainTimeout = 2 * time.Second

	// bwrap 0.8 writes uid maps with printf("%d"), so a host uid above
	// 2^31-1 comes out negative and the kernel refuses the map. A root
	// server's bwrap sandboxes therefore get host uids from this range,
	// below Native's and above systemd-nspawn's (which ends at 1879048191).
	bwrapHostUIDBase = 2_100_000_000
)

// bwrapRequired are the options this backend cannot do without.
var bwrapRequired = []string{
	"--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--cap-drop",
	"--clearenv", "--setenv", "--args", "--ro-bind", "--ro-bind-data", "--symlink", "--perms",
	"--size", "--tmpfs", "--remount-ro", "--seccomp", "--json-status-fd", "--block-fd",
	"--hostname", "--chdir",
}

// NewBwrap finds bwrap and checks that it has every option the backend
// uses. The error wraps ErrUnavailable when bwrap cannot be used at all.
func NewBwrap() (*Bwrap, error) {
	path, err := exec.LookPath("bwrap")
	if err != nil {
		return nil, fmt.Errorf("sandbox: bwrap is not installed (apt-get install bubblewrap): %w", ErrUnavailable)
	}
	if path, err = filepath.Abs(path); err != nil {
		return nil, fmt.Errorf("sandbox: bwrap: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ver, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return nil, fmt.Errorf("sandbox: %s --version: %w: %w", path, err, ErrUnavailable)
	}
	help, err := exec.CommandContext(ctx, path, "--help").Output()
	if err != nil {
		return nil, fmt.Errorf("sandbox: %s --help: %w: %w", path, err, ErrUnavailable)
	}
	b := &Bwrap{
		path:    path,
		version: strings.TrimSpace(string(ver)),
		root:    os.Geteuid() == 0,
	}
	opts := map[string]bool{}
	for _, f := range strings.Fields(string(help)) {
		if strings.HasPrefix(f, "--") {
			opts[f] = true
		}
	}
	var missing []string
	for _, o := range bwrapRequired {
		if !opts[o] {
			missing = append(missing, o)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("sandbox: %s (%s) lacks %s; bubblewrap 0.8 or later is needed: %w",
			path, b.version, strings.Join(missing, " "), ErrUnavailable)
	}
	b.disableUserns = opts["--disable-userns"]
	b.cgroups = cgroup.Detect()
	return b, nil
}

func (b *Bwrap) Kind() Kind { return KindBwrap }

// Path is the bwrap binary in use; Version what it says it is.
func (b *Bwrap) Path() string    { return b.path }
func (b *Bwrap) Version() string { return b.version }

// Cgroups reports the cgroup support measured at construction.
func (b *Bwrap) Cgroups() cgroup.Info { return b.cgroups }

// CgroupSupport reports which cgroup limits this backend applies.
func (b *Bwrap) CgroupSupport() (mem, pids bool, mode, reason string) {
	return b.cgroups.Memory, b.cgroups.Pids, string(b.cgroups.Mode), b.cgroups.Reason
}

// bwrapShimConfig is what the server tells the shim over the setup socket.
type bwrapShimConfig struct {
	Bwrap   string   `json:"bwrap"`
	Argv    []string `json:"argv"`
	Rlimits []rlimit `json:"rlimits"`
	// HostID, when not 0, is the host uid and gid the shim becomes (with no
	// supplementary groups) before it execs bwrap.
	HostID int `json:"host_id,omitempty"`
	// LastFD is the highest descriptor bwrap inherits; 3 to LastFD are the
	// control socket and the descriptors named in Argv.
	LastFD int `json:"last_fd"`
	// Parent is the server's pid: if it is gone by the time the death
	// signal is re-armed, the shim gives up.
	Parent int `json:"parent"`
}

// Descriptors of the shim (and of bwrap), in the order of ExtraFiles.
const (
	bwrapFDStatus    = 5 // --json-status-fd: child pid, then the exit code if the interpreter was exec'd
	bwrapFDArgs      = 6 // --args: every option, NUL-separated
	bwrapFDSeccomp   = 7 // --seccomp: struct sock_filter[]
	bwrapFDBlock     = 8 // --block-fd: the sandbox waits here for its RLIMIT_NPROC
	bwrapFDFirstData = 9 // --ro-bind-data sources
)

// bwrapPlan is what Start hands bwrap: its options and the contents of the
// files it copies in, in descriptor order from bwrapFDFirstData.
type bwrapPlan struct {
	options []string
	data    [][]byte
}

// plan builds the bwrap options for spec.
func (b *Bwrap) plan(spec *Spec) (*bwrapPlan, error) {
	if !filepath.IsAbs(spec.Python) {
		return nil, fmt.Errorf("sandbox: interpreter path %q is not absolute", spec.Python)
	}
	tmp := spec.Limits.TmpBytes
	if tmp <= 0 {
		tmp = 256 << 20
	}
	size := strconv.FormatInt(tmp, 10)
	p := &bwrapPlan{}
	add := func(args ...string) { p.options = append(p.options, args...) }

	// --unshare-all is user (try), ipc, pid, net, uts and cgroup (try);
	// --unshare-user makes the user namespace mandatory. The network is
	// always a namespace of its own with only lo: bwrap gives us no hook
	// to hand a proxy listener out (Spec.Proxy), so its sandboxes have no
	// way out at all.
	add("--unshare-all", "--unshare-user")
	if b.disableUserns {
		add("--disable-userns")
	}
	add("--die-with-parent", "--new-session",
		"--uid", strconv.Itoa(sandboxUID), "--gid", strconv.Itoa(sandboxGID),
		"--cap-drop", "ALL", "--hostname", "pysandbox",
		"--json-status-fd", strconv.Itoa(bwrapFDStatus),
		"--seccomp", strconv.Itoa(bwrapFDSeccomp),
		"--block-fd", strconv.Itoa(bwrapFDBlock),
		"--clearenv")
	for _, kv := range spec.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("sandbox: bwrap: environment entry %q is not NAME=value", kv)
		}
		add("--setenv", k, v)
	}

	// The host's system directories, read-only, and its merged-/usr
	// symlinks as symlinks.
	for _, d := range systemDirs(spec.Prefix) {
		fi, err := os.Lstat(d)
		if err != nil {
			continue
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			if dest, err := os.Readlink(d); err == nil {
				add("--symlink", dest, d)
			}
			continue
		}
		add("--ro-bind", d, d)
	}
	if hide, keep := usrLocal(spec.Prefix); hide {
		add("--perms", "0755", "--tmpfs", "/usr/local")
		for _, d := range keep {
			add("--ro-bind", d, d)
		}
		add("--remount-ro", "/usr/local")
	}
	for _, f := range etcBinds() {
		if _, err := os.Stat(f); err == nil {
			add("--ro-bind", f, f)
		}
	}
	for _, bd := range spec.Binds {
		if err := validBind(bd); err != nil {
			return nil, err
		}
		if bd.Writable {
			add("--bind", bd.Source, bd.Target)
		} else {
			add("--ro-bind", bd.Source, bd.Target)
		}
	}
	add("--proc", "/proc")
	// DefaultProcMasks, as far as bwrap's options reach: /dev/null bound
	// by --ro-bind is a device on a nodev mount, so a masked file cannot
	// even be opened; and since bwrap would resolve a bind source under
	// /proc in the host's /proc, the read-only paths are covered by making
	// this /proc read-only as a whole (below).
	for _, f := range procMaskedFiles {
		if _, err := os.Lstat(f); err == nil {
			add("--ro-bind", "/dev/null", f)
		}
	}
	for _, d := range procMaskedDirs {
		if _, err := os.Lstat(d); err == nil {
			add("--perms", "0555", "--tmpfs", d, "--remount-ro", d)
		}
	}
	add("--remount-ro", "/proc")
	add("--dev", "/dev",
		// bwrap's /dev is a tmpfs the sandbox user owns: give /dev/shm a
		// capped tmpfs of its own, then make /dev itself read-only.
		"--size", size, "--perms", "01777", "--tmpfs", "/dev/shm",
		"--remount-ro", "/dev",
		// One tmpfs each: bwrap can only bind host paths, so /tmp and /work
		// cannot share a tmpfs (and its size cap) the way Native's do.
		"--size", size, "--perms", "01777", "--tmpfs", "/tmp",
		"--size", size, "--perms", "0755", "--tmpfs", "/work")
	fd := bwrapFDFirstData
	for _, f := range append(etcFiles(), spec.Files...) {
		if !filepath.IsAbs(f.Path) || filepath.Clean(f.Path) != f.Path || f.Path == "/" {
			return nil, fmt.Errorf("sandbox: file path %q is not a clean absolute path", f.Path)
		}
		add("--perms", "0444", "--ro-bind-data", strconv.Itoa(fd), f.Path)
		p.data = append(p.data, f.Content)
		fd++
	}
	// Last of the mounts: everything not mounted writable above is frozen.
	add("--remount-ro", "/", "--chdir", "/work")
	for _, a := range p.options {
		if strings.IndexByte(a, 0) >= 0 {
			return nil, fmt.Errorf("sandbox: bwrap: argument %q contains a NUL byte", a)
		}
	}
	return p, nil
}

// seccompBytes is the filter as the struct sock_filter array bwrap's
// --seccomp reads.
func seccompBytes() ([]byte, error) {
	prog, err := seccomp.Program()
	if err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	return seccomp.Encode(prog), nil
}

// memfile returns data in an anonymous memory file positioned at its start,
// for bwrap to read: unlike a pipe, it never blocks the writer.
func memfile(name string, data []byte) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("sandbox: %w", os.NewSyscallError("memfd_create", err))
	}
	f := os.NewFile(uintptr(fd), name)
	if _, err := f.Write(data); err != nil {
		f.Close()
		return nil, fmt.Errorf("sandbox: write %s: %w", name, err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, fmt.Errorf("sandbox: seek %s: %w", name, err)
	}
	return f, nil
}

// splitRlimits splits Native's rlimits into those the shim sets and
// RLIMIT_NPROC.
//
// RLIMIT_NPROC is checked against the task count of the caller's uid in its
// user namespace and in every ancestor, where the limit of each level is
// the one its creator had when it created the namespace below. Set in the
// shim, it thus also bounds the count of the uid in the host's namespace.
// For a root server that uid is the sandbox's own (see HostID), so the shim
// sets it. For anyone else it is the server's uid, shared with the server
// and all its sandboxes; then the server sets it on the sandbox's first
// process once bwrap has cloned it into the new user namespace (and before
// that process forks the interpreter: it waits on --block-fd), so it counts
// this sandbox only, as Native's does. (The server cannot do that for a
// root server's sandbox without CAP_SYS_RESOURCE, which containers drop.)
func splitRlimits(all []rlimit) (shim []rlimit, nproc *rlimit) {
	for i := range all {
		if all[i].Resource == unix.RLIMIT_NPROC {
			nproc = &all[i]
			continue
		}
		shim = append(shim, all[i])
	}
	return shim, nproc
}

// Start starts spec's interpreter inside a new bwrap sandbox. It returns once
// the interpreter has been exec'd; an error from bwrap's setup is returned
// here, not written to spec.Stderr.
func (b *Bwrap) Start(ctx context.Context, spec *Spec) (Sandbox, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p, err := b.plan(spec)
	if err != nil {
		return nil, err
	}
	s := &bwrapSandbox{
		done:       make(chan struct{}),
		initSeen:   make(chan struct{}),
		statusDone: make(chan struct{}),
		pidfd:      -1,
		bwrap:      b.path,
		stderr:     &stderrGate{},
	}
	ok := false
	defer func() {
		if !ok {
			s.Close()
		}
	}()

	// Descriptors the shim inherits, in the order of fdControl, fdSetup and
	// the bwrapFD* constants (ExtraFiles start at 3); all closed here once
	// it has them.
	var child []*os.File
	defer func() {
		for _, f := range child {
			if f != nil {
				f.Close()
			}
		}
	}()
	// Read ends, handed over to their goroutines once the shim runs.
	var reads []*os.File
	defer func() {
		for _, f := range reads {
			f.Close()
		}
	}()

	var ctrlChild *os.File
	s.ctrl, ctrlChild, err = controlSocket()
	if err != nil {
		return nil, err
	}
	child = append(child, ctrlChild)
	setupParent, setupChild, err := socketpair()
	if err != nil {
		return nil, err
	}
	defer setupParent.Close()
	child = append(child, setupChild)
	statusR, statusW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	reads = append(reads, statusR)
	child = append(child, statusW)

	args := []byte(strings.Join(p.options, "\x00") + "\x00")
	argsFile, err := memfile("bwrap-args", args)
	if err != nil {
		return nil, err
	}
	child = append(child, argsFile)
	filter, err := seccompBytes()
	if err != nil {
		return nil, err
	}
	filterFile, err := memfile("bwrap-seccomp", filter)
	if err != nil {
		return nil, err
	}
	child = append(child, filterFile)
	blockR, blockW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	s.block = blockW
	child = append(child, blockR)
	for i, d := range p.data {
		f, err := memfile("bwrap-data-"+strconv.Itoa(i), d)
		if err != nil {
			return nil, err
		}
		child = append(child, f)
	}
	stdoutR, stdoutW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	reads = append(reads, stdoutR)
	stderrR, stderrW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	reads = append(reads, stderrR)
	extra := append([]*os.File(nil), child...)
	child = append(child, stdoutW, stderrW)

	shimLimits, nproc := rlimits(spec.Limits, b.cgroups), (*rlimit)(nil)
	if !b.root {
		shimLimits, nproc = splitRlimits(shimLimits)
	}
	cfg := &bwrapShimConfig{
		Bwrap:   b.path,
		Argv:    append([]string{"bwrap", "--args", strconv.Itoa(bwrapFDArgs), "--", spec.Python}, spec.Args...),
		Rlimits: shimLimits,
		LastFD:  fdControl + len(extra) - 1,
		Parent:  os.Getpid(),
	}
	if b.root {
		// Like Native's worker, each sandbox is a host user of its own.
		cfg.HostID = bwrapHostUIDBase + int(uidCounter.Add(1)%hostUIDRange)
	}

	if spec.Limits.MemoryBytes > 0 || spec.Limits.MaxProcs > 0 {
		if b.cgroups.Memory || b.cgroups.Pids || (b.cgroups.CPU && spec.Limits.CPUMilli > 0) {
			name := fmt.Sprintf("sb-%d-%d", os.Getpid(), sandboxSeq.Add(1))
			s.cg, err = cgroup.New(name, cgroup.Limits{MemoryBytes: spec.Limits.MemoryBytes, Pids: spec.Limits.MaxProcs, CPUMilli: cpuIf(b.cgroups.CPU, spec.Limits.CPUMilli)})
			if err != nil {
				return nil, fmt.Errorf("sandbox: %w", err)
			}
		}
	}

	cmd := &exec.Cmd{
		Path:        "/proc/self/exe",
		Args:        []string{bwrapShimArg0},
		Env:         []string{},
		Stdout:      stdoutW,
		Stderr:      stderrW,
		ExtraFiles:  extra,
		SysProcAttr: &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL},
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("sandbox: start bwrap shim: %w", err)
	}
	s.mu.Lock()
	s.cmd = cmd
	s.mu.Unlock()
	for _, f := range child {
		f.Close()
	}
	child = nil
	out := spec.Stdout
	if out == nil {
		out = io.Discard
	}
	s.pipes = []*os.File{stdoutR, stderrR}
	s.status = statusR
	go s.readStatus(statusR)
	s.copiers.Add(2)
	go func() {
		defer s.copiers.Done()
		drain(out, stdoutR)
	}()
	go func() {
		defer s.copiers.Done()
		drain(s.stderr, stderrR)
	}()
	reads = nil
	go s.reap()

	if s.cg != nil {
		if err := s.cg.AddProc(cmd.Process.Pid); err != nil {
			return nil, fmt.Errorf("sandbox: %w", err)
		}
	}
	data, err := json.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("sandbox: encode shim config: %w", err)
	}
	if _, err := setupParent.Write(data); err != nil {
		return nil, fmt.Errorf("sandbox: send shim config: %w", err)
	}
	if err := unix.Shutdown(int(setupParent.Fd()), unix.SHUT_WR); err != nil {
		return nil, fmt.Errorf("sandbox: send shim config: %w", os.NewSyscallError("shutdown", err))
	}
	// The shim closes its end on exec (close-on-exec); anything it wrote
	// before that is its error.
	msg, err := io.ReadAll(io.LimitReader(setupParent, 64<<10))
	if err != nil {
		return nil, fmt.Errorf("sandbox: read shim status: %w", err)
	}
	if len(msg) > 0 {
		return nil, fmt.Errorf("sandbox: bwrap shim: %s", strings.TrimSpace(string(msg)))
	}

	if err := s.waitExec(ctx, nproc); err != nil {
		return nil, s.setupError(err, cfg.HostID)
	}
	s.stderr.release(spec.Stderr)
	ok = true
	return s, nil
}

// waitExec waits until the interpreter has been exec'd. bwrap has no way to
// say so while the sandbox runs: its status descriptor gives the pid of the
// sandbox's first process at once, and only at the end whether the exec
// happened. So this watches that process's child (the future interpreter)
// until it is no longer bwrap, and falls back to the final status when the
// sandbox has already ended.
func (s *bwrapSandbox) waitExec(ctx context.Context, nproc *rlimit) error {
	timeout := time.NewTimer(bwrapSetupTimeout)
	defer timeout.Stop()
	bwrapFI, err := os.Stat(s.bwrap)
	if err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	known := s.initSeen
	pid := 0
	delay := 500 * time.Microsecond
	for {
		if pid > 0 && s.execed(pid, bwrapFI) {
			return nil
		}
		select {
		case <-s.done:
			if s.execOK.Load() {
				return nil
			}
			return errors.New("bwrap exited before it started the interpreter")
		case <-known:
			known = nil
			s.mu.Lock()
			pid = s.initPid
			s.mu.Unlock()
			if err := s.unblock(pid, nproc); err != nil {
				return err
			}
			continue
		case <-ctx.Done():
			return ctx.Err()
		case <-timeout.C:
			return fmt.Errorf("bwrap did not start the interpreter within %s", bwrapSetupTimeout)
		case <-time.After(delay):
		}
		if delay < 20*time.Millisecond {
			delay *= 2
		}
	}
}

// unblock gives the sandbox's first process its RLIMIT_NPROC, which the
// interpreter inherits, and lets it go on to fork the interpreter.
func (s *bwrapSandbox) unblock(pid int, nproc *rlimit) error {
	if nproc != nil {
		lim := unix.Rlimit{Cur: nproc.Cur, Max: nproc.Max}
		if err := unix.Prlimit(pid, nproc.Resource, &lim, nil); err != nil {
			return fmt.Errorf("sandbox: RLIMIT_NPROC of the sandbox: %w", os.NewSyscallError("prlimit", err))
		}
	}
	if _, err := s.block.Write([]byte{0}); err != nil {
		return fmt.Errorf("sandbox: release bwrap: %w", err)
	}
	s.block.Close()
	return nil
}

// execed reports whether a child of the sandbox's pid 1 runs something other
// than bwrap. bwrap forks that child after all of its setup and execs the
// interpreter in it right away.
func (s *bwrapSandbox) execed(init int, bwrapFI os.FileInfo) bool {
	for _, pid := range childPids(init) {
		dir := "/proc/" + strconv.Itoa(pid)
		if fi, err := os.Stat(dir + "/exe"); err == nil {
			if !os.SameFile(fi, bwrapFI) {
				return true
			}
			continue
		}
		if comm, err := os.ReadFile(dir + "/comm"); err == nil && strings.TrimSpace(string(comm)) != filepath.Base(s.bwrap) {
			return true
		}
	}
	return false
}

// childPids lists the children of pid.
func childPids(pid int) []int {
	var out []int
	p := strconv.Itoa(pid)
	if b, err := os.ReadFile("/proc/" + p + "/task/" + p + "/children"); err == nil {
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				out = append(out, n)
			}
		}
		return out
	}
	// Kernels without CONFIG_PROC_CHILDREN: look for the parent pid.
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may contain anything but ')'
		// is last.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) > 1 && f[1] == p {
			out = append(out, n)
		}
	}
	return out
}

// setupError ends a sandbox whose setup failed and says why, in bwrap's
// words when it said anything.
func (s *bwrapSandbox) setupError(cause error, hostID int) error {
	select {
	case <-s.initSeen:
	case <-s.done:
	case <-time.After(time.Second):
		// bwrap reports its first child at once. Killing bwrap before
		// then could strand that child, which waits for bwrap's go-ahead.
	}
	s.Kill()
	<-s.done
	if errors.Is(cause, context.Canceled) || errors.Is(cause, context.DeadlineExceeded) {
		return fmt.Errorf("sandbox: bwrap: %w", cause)
	}
	msg := strings.TrimSpace(s.stderr.held())
	if msg == "" {
		return fmt.Errorf("sandbox: bwrap: %w", cause)
	}
	err := fmt.Errorf("sandbox: %s", msg)
	switch {
	case strings.Contains(msg, "namespace") || strings.Contains(msg, "uid map") || strings.Contains(msg, "gid map"):
		return fmt.Errorf("%w (%s): %w", err, userNSHint(), ErrUnavailable)
	case hostID != 0 && strings.Contains(msg, "Permission denied"):
		return fmt.Errorf("%w (bwrap runs as host uid %d, which must be able to read every bind source, the interpreter's prefix included)", err, hostID)
	}
	return err
}

type bwrapSandbox struct {
	bwrap string
	cg    *cgroup.Group
	ctrl  net.Conn

	block *os.File // write end of bwrap's --block-fd

	mu      sync.Mutex
	cmd     *exec.Cmd // the shim, then bwrap's monitor process
	initPid int       // the sandbox's pid 1, in our pid namespace
	pidfd   int       // a pidfd of initPid, or -1

	initSeen   chan struct{} // closed once initPid is known
	status     *os.File      // read end of bwrap's --json-status-fd
	statusDone chan struct{} // closed when it has been read to the end
	execOK     atomic.Bool   // bwrap reported an exit code: the interpreter was exec'd
	stderr     *stderrGate
	pipes      []*os.File     // read ends of stdout and stderr
	copiers    sync.WaitGroup // their copies

	done      chan struct{} // closed when everything has exited and been read
	exit      Exit
	closeOnce sync.Once
	closeErr  error
}

func (s *bwrapSandbox) Control() net.Conn { return s.ctrl }

// readStatus reads bwrap's --json-status-fd: a first document with the
// sandbox's first pid and, when the interpreter was exec'd, a last one with
// its exit code.
func (s *bwrapSandbox) readStatus(r *os.File) {
	defer close(s.statusDone)
	defer r.Close()
	dec := json.NewDecoder(r)
	for {
		var st struct {
			ChildPid *int `json:"child-pid"`
			ExitCode *int `json:"exit-code"`
		}
		if err := dec.Decode(&st); err != nil {
			io.Copy(io.Discard, r)
			return
		}
		if st.ChildPid != nil && *st.ChildPid > 0 {
			s.setInit(*st.ChildPid)
		}
		if st.ExitCode != nil {
			s.execOK.Store(true)
		}
	}
}

func (s *bwrapSandbox) setInit(pid int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.initPid != 0 {
		return
	}
	s.initPid = pid
	// bwrap reports the pid right after clone, while the process is its
	// unreaped child, so the pid cannot have been reused yet.
	if fd, err := unix.PidfdOpen(pid, 0); err == nil {
		s.pidfd = fd
	}
	close(s.initSeen)
}

func (s *bwrapSandbox) killInit() {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.pidfd >= 0:
		unix.PidfdSendSignal(s.pidfd, unix.SIGKILL, nil, 0)
	case s.initPid > 0:
		unix.Kill(s.initPid, unix.SIGKILL)
	}
}

// waitInit waits until the sandbox's pid 1 has exited. The kernel kills and
// reaps every other process of its pid namespace before that.
func (s *bwrapSandbox) waitInit(timeout time.Duration) {
	s.mu.Lock()
	fd, pid := s.pidfd, s.initPid
	s.mu.Unlock()
	deadline := time.Now().Add(timeout)
	if fd >= 0 {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			ms := int(time.Until(deadline) / time.Millisecond)
			if ms <= 0 {
				return
			}
			n, err := unix.Poll(pfd, ms)
			if n > 0 || (err != nil && err != unix.EINTR) {
				return
			}
		}
	}
	for pid > 0 && time.Now().Before(deadline) {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return
		}
		if i := bytes.LastIndexByte(b, ')'); i > 0 && len(b) > i+2 && (b[i+2] == 'Z' || b[i+2] == 'X') {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (s *bwrapSandbox) reap() {
	err := s.cmd.Wait()
	// Only bwrap's monitor held the status descriptor, so it ends now, and
	// with it the last chance to learn the sandbox's pid 1.
	select {
	case <-s.statusDone:
	case <-time.After(bwrapDrainTimeout):
		s.status.Close()
		<-s.statusDone
	}
	// The monitor has exited: pid 1 has a death signal for that, but do not
	// wait for it to be delivered.
	s.killInit()
	s.waitInit(bwrapDrainTimeout)
	e := Exit{Code: -1}
	if ps := s.cmd.ProcessState; ps != nil {
		if ws, ok := ps.Sys().(syscall.WaitStatus); ok {
			switch {
			case ws.Signaled():
				// bwrap itself was killed (Kill).
				e.Signal = ws.Signal()
			case ws.Exited():
				e.Code = ws.ExitStatus()
				// bwrap exits with 128+n when the interpreter was killed
				// by signal n, as a shell does.
				if e.Code > 128 && e.Code <= 128+64 {
					e.Signal = syscall.Signal(e.Code - 128)
					e.Code = -1
				}
			}
		}
	} else if err != nil {
		e.Code = -1
	}
	if s.cg != nil {
		s.cg.Kill() // bwrap's pid 1 is its own reaper, not ours: make sure
	}
	FinalFigures(s.cg, &e)
	copied := make(chan struct{})
	go func() {
		s.copiers.Wait()
		close(copied)
	}()
	select {
	case <-copied:
	case <-time.After(bwrapDrainTimeout):
		// Something outside the sandbox holds a pipe open (it cannot be a
		// process of the sandbox: they are all gone). Stop copying.
		for _, f := range s.pipes {
			f.Close()
		}
		<-copied
	}
	s.exit = e
	close(s.done)
}

func (s *bwrapSandbox) Wait() Exit {
	<-s.done
	return s.exit
}

// Kill SIGKILLs bwrap, the sandbox's pid 1 (which takes its whole pid
// namespace with it) and whatever is in the cgroup.
func (s *bwrapSandbox) Kill() {
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		cmd.Process.Kill()
	}
	s.killInit()
	if s.cg != nil {
		s.cg.Kill()
	}
}

func (s *bwrapSandbox) Close() error {
	s.closeOnce.Do(func() {
		s.Kill()
		s.mu.Lock()
		started := s.cmd != nil
		s.mu.Unlock()
		if started {
			<-s.done
		}
		if s.ctrl != nil {
			s.ctrl.Close()
		}
		if s.block != nil {
			// Only now: on EOF bwrap would go on without RLIMIT_NPROC.
			s.block.Close()
		}
		s.mu.Lock()
		if s.pidfd >= 0 {
			unix.Close(s.pidfd)
			s.pidfd = -1
		}
		s.initPid = 0
		s.mu.Unlock()
		if s.cg != nil {
			s.closeErr = s.cg.Delete()
		}
	})
	return s.closeErr
}

// drain copies r to w until EOF. A failing w does not stop the copy, so the
// sandbox never blocks on a full pipe.
func drain(w io.Writer, r *os.File) {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 && w != nil {
			if _, werr := w.Write(buf[:n]); werr != nil {
				w = nil
			}
		}
		if err != nil {
			r.Close()
			return
		}
	}
}

// stderrGate holds the sandbox's stderr back until the interpreter runs:
// until then it can only be bwrap's own error messages, which belong in
// Start's error.
type stderrGate struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	out  io.Writer
	open bool
}

func (g *stderrGate) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.open {
		g.buf.Write(p)
	} else if g.out != nil {
		if _, err := g.out.Write(p); err != nil {
			g.out = nil
		}
	}
	return len(p), nil
}

// release passes what was held, and everything after it, to w.
func (g *stderrGate) release(w io.Writer) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.open, g.out = true, w
	if w != nil && g.buf.Len() > 0 {
		if _, err := w.Write(g.buf.Bytes()); err != nil {
			g.out = nil
		}
	}
	g.buf = bytes.Buffer{}
}

func (g *stderrGate) held() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	const max = 8 << 10
	b := g.buf.Bytes()
	if len(b) > max {
		b = b[:max]
	}
	return string(b)
}

// bwrapShim is the re-executed shim: it applies the limits bwrap cannot and
// execs bwrap. It never returns.
func bwrapShim() {
	setup := os.NewFile(fdSetup, "setup")
	err := runBwrapShim(setup)
	// Only reached on failure: tell the parent why, then die.
	fmt.Fprintf(setup, "%v", err)
	os.Exit(121)
}

func runBwrapShim(setup *os.File) error {
	var cfg bwrapShimConfig
	// The parent writes the config only after it has moved us into the
	// cgroup, then shuts down its writing half, which ends this read.
	data, err := io.ReadAll(io.LimitReader(setup, 16<<20))
	if err != nil {
		return fmt.Errorf("bwrap shim: read config: %w", err)
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		return fmt.Errorf("bwrap shim: decode config: %w", err)
	}
	if len(cfg.Argv) == 0 || cfg.LastFD < fdSetup {
		return errors.New("bwrap shim: incomplete config")
	}
	// Everything that allocates comes before the limits (see exec_linux.go).
	ex, err := prepareExec(cfg.Bwrap, cfg.Argv, []string{})
	if err != nil {
		return fmt.Errorf("bwrap shim: %w", err)
	}
	freeze()
	// Limits first, while a root server's shim may still raise them.
	if err := setRlimits(cfg.Rlimits); err != nil {
		return fmt.Errorf("bwrap shim: %w", err)
	}
	if cfg.HostID != 0 {
		// Go applies these to every thread of the process. Dropping root
		// also empties every capability set, as bwrap demands of a
		// non-setuid, non-root caller.
		if err := syscall.Setgroups([]int{}); err != nil {
			return fmt.Errorf("bwrap shim: %w", os.NewSyscallError("setgroups", err))
		}
		if err := syscall.Setresgid(cfg.HostID, cfg.HostID, cfg.HostID); err != nil {
			return fmt.Errorf("bwrap shim: %w", os.NewSyscallError("setresgid", err))
		}
		if err := syscall.Setresuid(cfg.HostID, cfg.HostID, cfg.HostID); err != nil {
			return fmt.Errorf("bwrap shim: %w", os.NewSyscallError("setresuid", err))
		}
	}
	// A uid change clears the parent-death signal; bwrap's
	// --die-with-parent only takes over after its exec.
	if err := dieWithParent(); err != nil {
		return fmt.Errorf("bwrap shim: %w", err)
	}
	if os.Getppid() != cfg.Parent {
		return errors.New("bwrap shim: the server has exited")
	}
	// bwrap inherits stdio, the control socket and the descriptors its
	// arguments name; the setup socket closes on exec, so EOF means exec'd.
	if err := unix.CloseRange(uint(cfg.LastFD)+1, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return fmt.Errorf("bwrap shim: %w", os.NewSyscallError("close_range", err))
	}
	unix.CloseOnExec(fdSetup)
	return fmt.Errorf("bwrap shim: exec %s: %w", cfg.Bwrap, ex.exec())
}

// OpenWorkspace implements Sessioner: /work is reached through the
// sandbox's pid 1 (bwrap's reaper), which shares the worker's mounts.
func (s *bwrapSandbox) OpenWorkspace() (*os.File, error) {
	s.mu.Lock()
	pid := s.initPid
	s.mu.Unlock()
	return OpenWorkspace(pid)
}

// Interrupt implements Sessioner. Under bwrap the worker is not pid 1 but
// the reaper's only child.
func (s *bwrapSandbox) Interrupt() error {
	s.mu.Lock()
	pid := s.initPid
	s.mu.Unlock()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		return fmt.Errorf("sandbox: find the worker: %w", err)
	}
	fields := strings.Fields(string(b))
	if len(fields) == 0 {
		return errors.New("sandbox: the worker has exited")
	}
	worker, err := strconv.Atoi(fields[0])
	if err != nil {
		return fmt.Errorf("sandbox: find the worker: %w", err)
	}
	return os.NewSyscallError("kill", unix.Kill(worker, unix.SIGINT))
}

// Idle implements Sessioner. bwrap sessions are not held to the idle
// quota: when the server dies, a bwrap session ends by its worker exiting
// on its own (Python's teardown, tens of milliseconds of CPU), which a
// thousandth of a CPU would stretch to minutes. Their processes keep their
// run quota between runs instead.
func (s *bwrapSandbox) Idle(bool) error { return ErrNoCPUControl }

// cpuIf is milli when the cgroup CPU controller can enforce it, else 0.
func cpuIf(ok bool, milli int64) int64 {
	if ok {
		return milli
	}
	return 0
}

// CPUUsage is the CPU time the sandbox used so far (0 without a cgroup).
func (s *bwrapSandbox) CPUUsage() time.Duration { return CPUUsage(s.cg) }

// MemoryCurrent is the memory the sandbox uses now (0 without a cgroup).
func (s *bwrapSandbox) MemoryCurrent() int64 { return MemoryCurrent(s.cg) }

// CPUSupport reports whether sandboxes get a CPU quota (and sessions the
// idle quota between runs).
func (b *Bwrap) CPUSupport() bool { return b.cgroups.CPU }
