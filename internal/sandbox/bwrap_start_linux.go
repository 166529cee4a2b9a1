package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pysandbox/pysandbox/internal/sandbox/cgroup"
)

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

// cpuIf is milli when the cgroup CPU controller can enforce it, else 0.
func cpuIf(ok bool, milli int64) int64 {
	if ok {
		return milli
	}
	return 0
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
