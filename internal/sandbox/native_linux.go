package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pysandbox/pysandbox/internal/sandbox/cgroup"
)

// Native is the default backend: our own init, re-executed from this binary
// in fresh namespaces.
type Native struct {
	cgroups cgroup.Info
	root    bool
	// seccomp is off only in tests that look at the layers beneath it.
	seccomp bool
	// landlock, when not nil, replaces landlockWritable (tests narrow it
	// to see Landlock refuse what the mounts alone would allow).
	landlock []string
}

// NewNative returns the native backend. It measures which cgroup features
// work here; call Posture to learn whether the whole sandbox does.
func NewNative() *Native {
	return &Native{cgroups: cgroup.Detect(), root: os.Geteuid() == 0, seccomp: true}
}

func (n *Native) Kind() Kind { return KindNative }

// Cgroups reports the cgroup support measured at construction.
func (n *Native) Cgroups() cgroup.Info { return n.cgroups }

// zygoteCPUWeight is a zygote's CPU weight, against 100 for each run.
const zygoteCPUWeight = 800

// When the server runs as root, each sandbox gets its own host uid from this
// range, so concurrent sandboxes are different users to the kernel too:
// they cannot signal or ptrace each other even if they could see each other.
// An unprivileged server can only map its own uid.
const (
	hostUIDBase  = 3_000_000_000
	hostUIDRange = 1_000_000
)

// Host id blocks for warm-pool children (root server only), above the
// per-sandbox range: 10,000 blocks of ChildIDCount ids from 3.5e9.
const (
	childHostIDBase = 3_500_000_000
	childBlocks     = 10_000
)

var childBlock = func() *atomic.Uint32 {
	var c atomic.Uint32
	c.Store(rand.Uint32())
	return &c
}()

var (
	// uidCounter starts at a random point so that two server processes on
	// one host are unlikely to hand out the same uid at the same time.
	uidCounter = func() *atomic.Uint32 {
		var c atomic.Uint32
		c.Store(rand.Uint32())
		return &c
	}()
	sandboxSeq atomic.Uint64
)

func (n *Native) nextHostID() int {
	return hostUIDBase + int(uidCounter.Add(1)%hostUIDRange)
}

// Start starts spec's interpreter inside a new sandbox.
func (n *Native) Start(ctx context.Context, spec *Spec) (Sandbox, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s := &nativeSandbox{done: make(chan struct{})}
	ok := false
	defer func() {
		if !ok {
			s.Close()
		}
	}()
	var ctrlChild *os.File
	var err error
	s.ctrl, ctrlChild, err = controlSocket()
	if err != nil {
		return nil, err
	}
	defer ctrlChild.Close()
	setupParent, setupChild, err := socketpair()
	if err != nil {
		return nil, err
	}
	defer setupParent.Close()
	defer setupChild.Close()

	cfg, err := n.config(spec)
	if err != nil {
		return nil, err
	}

	// Only the limits this machine can enforce by cgroup are asked for; the
	// rest fall to rlimits (see rlimits) and Posture says so.
	var cgl cgroup.Limits
	if n.cgroups.Memory {
		cgl.MemoryBytes = spec.Limits.MemoryBytes
	}
	if n.cgroups.Pids {
		cgl.Pids = spec.Limits.MaxProcs
	}
	if n.cgroups.CPU {
		cgl.CPUMilli = spec.Limits.CPUMilli
		if spec.Zygote {
			// A zygote prepares every run's sandbox: under a flood of busy
			// runs it must still get its turn, or callers wait on setup.
			cgl.CPUWeight = zygoteCPUWeight
		}
	}
	if cgl.MemoryBytes > 0 || cgl.Pids > 0 || cgl.CPUMilli > 0 || cgl.CPUWeight > 0 {
		name := fmt.Sprintf("sb-%d-%d", os.Getpid(), sandboxSeq.Add(1))
		s.cg, err = cgroup.New(name, cgl)
		if err != nil {
			return nil, fmt.Errorf("sandbox: %w", err)
		}
	}

	attr := &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID |
			syscall.CLONE_NEWNET | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS,
		Pdeathsig: syscall.SIGKILL,
	}
	// The init runs as the sandbox user from the start, with ambient
	// capabilities carrying across its exec just what it needs to build the
	// root; it drops them all before the worker. No host uid the namespace
	// maps is privileged: host root never appears in a sandbox's uid_map,
	// so nothing inside (not even a process that keeps CAP_SETUID, as a
	// zygote does) can become host root.
	attr.AmbientCaps = []uintptr{unix.CAP_SYS_ADMIN, unix.CAP_NET_ADMIN, unix.CAP_SETPCAP, unix.CAP_DAC_OVERRIDE}
	var bindFiles []*os.File
	defer func() {
		for _, f := range bindFiles {
			f.Close()
		}
	}()
	if n.root {
		// A root server gives each sandbox a host uid of its own, so
		// concurrent sandboxes are different users to the kernel too.
		id := n.nextHostID()
		attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: sandboxUID, HostID: id, Size: 1}}
		attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: sandboxGID, HostID: id, Size: 1}}
		if spec.Zygote {
			// A block of host ids of its own for the zygote's children.
			base := childHostIDBase + int(childBlock.Add(1)%childBlocks)*ChildIDCount
			attr.UidMappings = append(attr.UidMappings, syscall.SysProcIDMap{ContainerID: ChildIDBase, HostID: base, Size: ChildIDCount})
			attr.GidMappings = append(attr.GidMappings, syscall.SysProcIDMap{ContainerID: ChildIDBase, HostID: base, Size: ChildIDCount})
			attr.AmbientCaps = append(attr.AmbientCaps, unix.CAP_SETUID, unix.CAP_SETGID)
			cfg.KeepSetID = true
		}
		// Clear root's supplementary groups (group 0 among them); an
		// unprivileged server cannot, since it must deny setgroups to map
		// its gid.
		attr.GidMappingsEnableSetgroups = true
		attr.Credential = &syscall.Credential{Uid: sandboxUID, Gid: sandboxGID, Groups: []uint32{}}
		// That host uid cannot open what only root can (a pyenv prefix in
		// /root, the dependency cache): root opens every bind source here,
		// as a detached copy of its mount, and the init attaches it.
		if bindFiles, err = openBindTrees(cfg.Binds); err != nil {
			return nil, err
		}
	} else {
		attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: sandboxUID, HostID: os.Getuid(), Size: 1}}
		attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: sandboxGID, HostID: os.Getgid(), Size: 1}}
	}
	cmd := &exec.Cmd{
		Path:        "/proc/self/exe",
		Args:        []string{initArg0},
		Env:         []string{},
		Stdout:      spec.Stdout,
		Stderr:      spec.Stderr,
		ExtraFiles:  append([]*os.File{ctrlChild, setupChild}, bindFiles...),
		SysProcAttr: attr,
		// Every process of the sandbox dies with its pid 1, so the pipes
		// close promptly; this only bounds a pathological wait.
		WaitDelay: 2 * time.Second,
	}
	if cmd.Stdout == nil {
		cmd.Stdout = io.Discard
	}
	if cmd.Stderr == nil {
		cmd.Stderr = io.Discard
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("sandbox: start init: %w", explainStartError(err))
	}
	s.cmd = cmd
	go s.reap()
	// The run's deadline and cancellation hold during setup too: killing
	// the init ends every read below, and the deferred Close cleans up.
	stop := context.AfterFunc(ctx, func() { cmd.Process.Kill() })
	defer stop()
	setupChild.Close()
	if s.cg != nil {
		if err := s.cg.AddProc(cmd.Process.Pid); err != nil {
			return nil, fmt.Errorf("sandbox: %w", err)
		}
		cfg.NewCgroupNS = true
	}
	if err := sendConfig(setupParent, cfg); err != nil {
		return nil, err
	}
	var first []byte
	if cfg.Proxy {
		s.proxy, err = recvProxyListenerFD(int(setupParent.Fd()))
		var no *errNoListener
		if errors.As(err, &no) {
			first = no.first // the start of the init's error
		} else if err != nil && ctx.Err() == nil {
			return nil, fmt.Errorf("sandbox: %w", err)
		}
	}
	// The init closes its end on exec (close-on-exec); anything it wrote
	// before that is its error.
	msg, err := io.ReadAll(io.LimitReader(setupParent, 64<<10))
	if err != nil {
		return nil, fmt.Errorf("sandbox: read init status: %w", err)
	}
	msg = append(first, msg...)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if len(msg) > 0 {
		return nil, fmt.Errorf("sandbox: set up: %s", strings.TrimSpace(string(msg)))
	}
	select {
	case <-s.done:
		// A program that already ran to a clean end (a short one, on a
		// busy machine) was set up fine.
		if s.exit.Code != 0 {
			return nil, fmt.Errorf("sandbox: init exited during setup (exit code %d)", s.exit.Code)
		}
	default:
	}
	ok = true
	return s, nil
}

func sendConfig(w *os.File, cfg *initConfig) error {
	data, err := json.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("sandbox: encode init config: %w", err)
	}
	if _, err := w.Write(data); err != nil {
		return fmt.Errorf("sandbox: send init config: %w", err)
	}
	if err := unix.Shutdown(int(w.Fd()), unix.SHUT_WR); err != nil {
		return fmt.Errorf("sandbox: send init config: %w", os.NewSyscallError("shutdown", err))
	}
	return nil
}

// explainStartError turns the kernel's terse refusals into advice.
func explainStartError(err error) error {
	if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.ENOSPC) {
		return fmt.Errorf("%w: %w (%s)", ErrUnavailable, err, userNSHint())
	}
	return err
}

// config builds the init's configuration.
func (n *Native) config(spec *Spec) (*initConfig, error) {
	if !filepath.IsAbs(spec.Python) {
		return nil, fmt.Errorf("sandbox: interpreter path %q is not absolute", spec.Python)
	}
	cfg := &initConfig{
		TmpBytes: spec.Limits.TmpBytes,
		Argv:     append([]string{spec.Python}, spec.Args...),
		Env:      spec.Env,
		Cwd:      "/work",
		Hostname: "pysandbox",
		Files:    spec.Files,
		Etc:      etcFiles(),
		Seccomp:  n.seccomp,
		Zygote:   spec.Zygote,
		MaskProc: !spec.Zygote,
	}
	if !spec.Zygote {
		cfg.Landlock = slices.Clone(landlockWritable)
		if n.landlock != nil {
			cfg.Landlock = slices.Clone(n.landlock)
		}
		for _, b := range spec.Binds {
			if b.Writable {
				cfg.Landlock = append(cfg.Landlock, b.Target)
			}
		}
	}
	if cfg.TmpBytes <= 0 {
		cfg.TmpBytes = 256 << 20
	}
	cfg.Rlimits = rlimits(spec.Limits, n.cgroups)
	add := func(hostPath, target string, writable bool) error {
		fi, err := os.Stat(hostPath)
		if err != nil {
			return fmt.Errorf("sandbox: bind source: %w", err)
		}
		dev := fi.Mode()&os.ModeDevice != 0
		cfg.Binds = append(cfg.Binds, bindMount{Source: hostPath, Target: target, Dir: fi.IsDir(), Writable: writable, Device: dev})
		return nil
	}
	for _, p := range systemDirs(spec.Prefix) {
		fi, err := os.Lstat(p)
		if err != nil {
			continue
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			dest, err := os.Readlink(p)
			if err == nil {
				cfg.Symlinks = append(cfg.Symlinks, [2]string{dest, p})
			}
			continue
		}
		if err := add(p, p, false); err != nil {
			return nil, err
		}
	}
	// /usr/local is the host's own (its etc, its programs): only the
	// Python directories in it are needed, unless the interpreter lives
	// there.
	if hide, keep := usrLocal(spec.Prefix); hide {
		cfg.Binds = append(cfg.Binds, bindMount{Target: "/usr/local", Dir: true, Empty: true})
		for _, p := range keep {
			if err := add(p, p, false); err != nil {
				return nil, err
			}
		}
	}
	for _, p := range etcBinds() {
		if _, err := os.Stat(p); err == nil {
			if err := add(p, p, false); err != nil {
				return nil, err
			}
		}
	}
	for _, b := range spec.Binds {
		if err := validBind(b); err != nil {
			return nil, err
		}
		if err := add(b.Source, b.Target, b.Writable); err != nil {
			return nil, err
		}
	}
	cfg.Proxy = spec.Proxy
	for _, d := range []string{"null", "zero", "full", "random", "urandom"} {
		if err := add("/dev/"+d, "/dev/"+d, true); err != nil {
			return nil, err
		}
	}
	return cfg, nil
}

// openBindTrees opens a detached copy of the mount of every bind source
// (open_tree with OPEN_TREE_CLONE) and records, in each bind, the
// descriptor number the init will find it under.
func openBindTrees(binds []bindMount) ([]*os.File, error) {
	var files []*os.File
	for i := range binds {
		b := &binds[i]
		if b.Empty {
			continue
		}
		fd, err := unix.OpenTree(unix.AT_FDCWD, b.Source, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
		if err != nil {
			for _, f := range files {
				f.Close()
			}
			return nil, fmt.Errorf("sandbox: bind source %s: %w", b.Source, os.NewSyscallError("open_tree", err))
		}
		b.FD = fdFirstBind + len(files)
		files = append(files, os.NewFile(uintptr(fd), b.Source))
	}
	return files, nil
}

// systemDirs lists what the interpreter needs from the host: /usr, the
// library directories (or their merged-/usr symlinks), and the
// interpreter's own prefix when it lives elsewhere (pyenv, /opt).
func systemDirs(prefix string) []string {
	dirs := []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}
	if prefix != "" && prefix != "/" && !underAny(prefix, dirs) {
		dirs = append(dirs, filepath.Clean(prefix))
	}
	return dirs
}

// usrLocal reports whether /usr/local should be hidden behind an empty
// directory, and which of its directories to show again: the site
// directories Debian's interpreters look in (/usr/local/lib/python3.X).
func usrLocal(prefix string) (hide bool, keep []string) {
	const dir = "/usr/local"
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
		return false, nil
	}
	if prefix != "" && underAny(prefix, []string{dir}) {
		return false, nil
	}
	matches, _ := filepath.Glob(dir + "/lib/python3*")
	for _, m := range matches {
		if fi, err := os.Lstat(m); err == nil && fi.IsDir() {
			keep = append(keep, m)
		}
	}
	return true, keep
}

func underAny(p string, dirs []string) bool {
	p = filepath.Clean(p)
	for _, d := range dirs {
		if p == d || strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}

// etcBinds are the host files under /etc that Python and common libraries
// read. Everything else in /etc (passwd, shadow, ssh keys, ...) stays out.
func etcBinds() []string {
	list := []string{
		"/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime",
		"/etc/mime.types", "/etc/matplotlibrc", "/etc/fonts", "/etc/ssl/certs", "/etc/alternatives",
	}
	// Debian's interpreters read /etc/python3.X (sitecustomize.py).
	matches, _ := filepath.Glob("/etc/python3*")
	return append(list, matches...)
}

// etcFiles are generated: just enough for getpwuid and "localhost" to work.
func etcFiles() []File {
	return []File{
		{Path: "/etc/passwd", Content: []byte(fmt.Sprintf("root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:%d:%d:sandbox:/work:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n", sandboxUID, sandboxGID))},
		{Path: "/etc/group", Content: []byte(fmt.Sprintf("root:x:0:\nsandbox:x:%d:\nnogroup:x:65534:\n", sandboxGID))},
		{Path: "/etc/hosts", Content: []byte("127.0.0.1 localhost pysandbox\n::1 localhost ip6-localhost\n")},
		{Path: "/etc/hostname", Content: []byte("pysandbox\n")},
		{Path: "/etc/resolv.conf", Content: []byte("# no network in the sandbox\n")},
		{Path: "/etc/nsswitch.conf", Content: []byte("passwd: files\ngroup: files\nhosts: files\n")},
	}
}

// rlimits are applied inside every sandbox. Where no cgroup can enforce the
// memory or pids limit, RLIMIT_AS and RLIMIT_NPROC take over (RLIMIT_NPROC
// is counted per user namespace, so it is per sandbox).
func rlimits(l Limits, cg cgroup.Info) []rlimit {
	tmp := uint64(l.TmpBytes)
	if tmp == 0 {
		tmp = 256 << 20
	}
	nofile := l.MaxOpenFile
	if nofile == 0 {
		nofile = 1024
	}
	out := []rlimit{
		{Resource: unix.RLIMIT_CORE, Cur: 0, Max: 0},
		{Resource: unix.RLIMIT_NOFILE, Cur: nofile, Max: nofile},
		{Resource: unix.RLIMIT_FSIZE, Cur: tmp, Max: tmp},
	}
	if l.MaxProcs > 0 {
		out = append(out, rlimit{Resource: unix.RLIMIT_NPROC, Cur: uint64(l.MaxProcs), Max: uint64(l.MaxProcs)})
	}
	if l.CPUSeconds > 0 {
		out = append(out, rlimit{Resource: unix.RLIMIT_CPU, Cur: l.CPUSeconds, Max: l.CPUSeconds + 1})
	}
	if l.MemoryBytes > 0 && !cg.Memory {
		out = append(out, rlimit{Resource: unix.RLIMIT_AS, Cur: uint64(l.MemoryBytes), Max: uint64(l.MemoryBytes)})
	}
	return out
}

type nativeSandbox struct {
	cmd   *exec.Cmd
	cg    *cgroup.Group
	ctrl  net.Conn
	proxy net.Listener

	done      chan struct{} // closed when the init and the output copies are done
	exit      Exit
	closeOnce sync.Once
	closeErr  error
}

func (s *nativeSandbox) Control() net.Conn { return s.ctrl }

// ProxyListener implements Proxied.
func (s *nativeSandbox) ProxyListener() net.Listener { return s.proxy }

func (s *nativeSandbox) reap() {
	s.cmd.Wait()
	e := exitOf(s.cmd.ProcessState)
	// pid 1 is gone, so is everything else in its namespace.
	FinalFigures(s.cg, &e)
	s.exit = e
	close(s.done)
}

func (s *nativeSandbox) Wait() Exit {
	<-s.done
	return s.exit
}

func (s *nativeSandbox) Kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		// SIGKILL to pid 1 of the namespace: the kernel then kills every
		// other process in it, however deep or detached.
		s.cmd.Process.Kill()
	}
}

func (s *nativeSandbox) Close() error {
	s.closeOnce.Do(func() {
		s.Kill()
		if s.cmd != nil {
			<-s.done
		}
		if s.ctrl != nil {
			s.ctrl.Close()
		}
		if s.proxy != nil {
			s.proxy.Close()
		}
		if s.cg != nil {
			s.closeErr = s.cg.Delete()
		}
	})
	return s.closeErr
}

// CgroupSupport reports which cgroup limits this backend applies.
func (n *Native) CgroupSupport() (mem, pids bool, mode, reason string) {
	return n.cgroups.Memory, n.cgroups.Pids, string(n.cgroups.Mode), n.cgroups.Reason
}

// RlimitTriples lists the rlimits of a sandbox as {resource, soft, hard},
// for a pooled worker that sets them on itself.
func RlimitTriples(l Limits, cg cgroup.Info) [][3]uint64 {
	var out [][3]uint64
	for _, r := range rlimits(l, cg) {
		out = append(out, [3]uint64{uint64(r.Resource), r.Cur, r.Max})
	}
	return out
}

func (s *nativeSandbox) OpenWorkspace() (*os.File, error) {
	if s.cmd == nil || s.cmd.Process == nil {
		return nil, errors.New("sandbox: not started")
	}
	return OpenWorkspace(s.cmd.Process.Pid)
}

func (s *nativeSandbox) Interrupt() error {
	if s.cmd == nil || s.cmd.Process == nil {
		return errors.New("sandbox: not started")
	}
	return s.cmd.Process.Signal(syscall.SIGINT)
}

// MemoryCurrent is the memory the sandbox uses now (0 without a cgroup).
func (s *nativeSandbox) MemoryCurrent() int64 { return MemoryCurrent(s.cg) }

// Idle implements Sessioner.
func (s *nativeSandbox) Idle(idle bool) error { return Idle(s.cg, idle) }

// CPUUsage is the CPU time the sandbox used so far (0 without a cgroup).
func (s *nativeSandbox) CPUUsage() time.Duration { return CPUUsage(s.cg) }

// CPUSupport reports whether sandboxes get a CPU quota (and sessions the
// idle quota between runs).
func (n *Native) CPUSupport() bool { return n.cgroups.CPU }
