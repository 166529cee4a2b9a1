package sandbox

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
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

// CPUSupport reports whether sandboxes get a CPU quota (and sessions the
// idle quota between runs).
func (b *Bwrap) CPUSupport() bool { return b.cgroups.CPU }
