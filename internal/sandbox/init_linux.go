package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/pysandbox/pysandbox/internal/sandbox/seccomp"
)

// InitMain must be called first thing in main (and in TestMain of packages
// that start native sandboxes). In the re-executed sandbox init it sets the
// sandbox up and execs the worker, and never returns; everywhere else it
// returns at once.
func InitMain() {
	if len(os.Args) > 0 && os.Args[0] == bwrapShimArg0 {
		bwrapShim() // the bwrap backend's shim; never returns
	}
	if len(os.Args) == 0 || os.Args[0] != initArg0 {
		return
	}
	// Every per-thread setting (capabilities, no_new_privs, seccomp) must be
	// made on the thread that finally calls execve.
	runtime.LockOSThread()
	setup := os.NewFile(fdSetup, "setup")
	err := runInit(setup)
	// Only reached on failure: tell the parent why, then die.
	fmt.Fprintf(setup, "%v", err)
	os.Exit(121)
}

func runInit(setup *os.File) error {
	var cfg initConfig
	// The parent writes the config only after it has moved us into our
	// cgroups, so nothing below runs unaccounted. It then shuts down its
	// writing half, which ends this read.
	data, err := io.ReadAll(io.LimitReader(setup, 16<<20))
	if err != nil {
		return fmt.Errorf("sandbox init: read config: %w", err)
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		return fmt.Errorf("sandbox init: decode config: %w", err)
	}
	if cfg.NewCgroupNS {
		if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
			return fmt.Errorf("sandbox init: unshare cgroup namespace: %w", os.NewSyscallError("unshare", err))
		}
	}
	if err := buildRoot(&cfg); err != nil {
		return err
	}
	if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
		return fmt.Errorf("sandbox init: %w", os.NewSyscallError("sethostname", err))
	}
	if err := loopbackUp(); err != nil {
		return err
	}
	if cfg.Proxy {
		if err := sendProxyListener(int(setup.Fd())); err != nil {
			return fmt.Errorf("sandbox init: %w", err)
		}
	}
	if err := os.Chdir(cfg.Cwd); err != nil {
		return fmt.Errorf("sandbox init: %w", err)
	}
	// Re-arm the parent-death signal: if the server dies, so does the
	// sandbox (pid 1 dying takes every process of the namespace with it).
	if err := dieWithParent(); err != nil {
		return fmt.Errorf("sandbox init: %w", err)
	}
	// Everything that allocates comes before the limits (see exec_linux.go).
	var filter *seccomp.Filter
	if cfg.Seccomp {
		profile := seccomp.Strict
		if cfg.Zygote {
			profile = seccomp.Zygote
		}
		if filter, err = seccomp.Prepare(profile); err != nil {
			return fmt.Errorf("sandbox init: %w", err)
		}
	}
	if len(cfg.Argv) == 0 {
		return errors.New("sandbox init: no command")
	}
	argv0, err := lookInRoot(cfg.Argv[0])
	if err != nil {
		return err
	}
	ex, err := prepareExec(argv0, cfg.Argv, cfg.Env)
	if err != nil {
		return fmt.Errorf("sandbox init: %w", err)
	}
	capLast := lastCap()
	if len(cfg.Landlock) > 0 {
		if err := restrictWrites(cfg.Landlock); err != nil {
			return err
		}
	}
	freeze()

	if err := setRlimits(cfg.Rlimits); err != nil {
		return fmt.Errorf("sandbox init: %w", err)
	}
	if err := dropPrivileges(cfg.KeepSetID, capLast); err != nil {
		return err
	}
	// A change of uid clears the parent-death signal, so arm it again.
	if err := dieWithParent(); err != nil {
		return fmt.Errorf("sandbox init: %w", err)
	}
	if filter != nil {
		// Install also sets no_new_privs, which seccomp requires of an
		// unprivileged process anyway.
		if err := filter.Install(); err != nil {
			return fmt.Errorf("sandbox init: %w", err)
		}
	} else if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("sandbox init: %w", os.NewSyscallError("prctl(PR_SET_NO_NEW_PRIVS)", err))
	}
	// Nothing but stdio, the control socket and the setup socket (which is
	// close-on-exec) may reach the worker.
	if err := unix.CloseRange(fdSetup+1, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return fmt.Errorf("sandbox init: %w", os.NewSyscallError("close_range", err))
	}
	unix.CloseOnExec(fdSetup)
	return fmt.Errorf("sandbox init: exec %s: %w", cfg.Argv[0], ex.exec())
}

func lookInRoot(path string) (string, error) {
	if !filepath.IsAbs(path) {
		return "", fmt.Errorf("sandbox init: interpreter path %q is not absolute", path)
	}
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("sandbox init: interpreter not visible inside the sandbox: %w", err)
	}
	return path, nil
}

// loopbackUp brings lo up in the new network namespace. It is the only
// interface there, so the sandbox can talk to itself and to nothing else.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("sandbox init: lo: %w", os.NewSyscallError("socket", err))
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return fmt.Errorf("sandbox init: lo: %w", err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("sandbox init: lo: %w", os.NewSyscallError("ioctl(SIOCGIFFLAGS)", err))
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("sandbox init: lo: %w", os.NewSyscallError("ioctl(SIOCSIFFLAGS)", err))
	}
	return nil
}

// dieWithParent arms the parent-death signal: SIGKILL when the server
// exits. A change of uid clears it, so callers arm it again after one.
func dieWithParent() error {
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		return os.NewSyscallError("prctl(PR_SET_PDEATHSIG)", err)
	}
	return nil
}

// dropPrivileges empties every capability set, the bounding set included,
// so nothing can be regained by exec. The init already runs as the sandbox
// user (see Native.Start); its capabilities came as ambient ones.
func dropPrivileges(keepSetID bool, last int) error {
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("sandbox init: %w", os.NewSyscallError("prctl(PR_CAP_AMBIENT_CLEAR_ALL)", err))
	}
	for c := 0; c <= last; c++ {
		if keepSetID && (c == unix.CAP_SETUID || c == unix.CAP_SETGID) {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && err != unix.EINVAL {
			return fmt.Errorf("sandbox init: drop cap %d: %w", c, os.NewSyscallError("prctl(PR_CAPBSET_DROP)", err))
		}
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if keepSetID {
		set := uint32(1<<unix.CAP_SETUID | 1<<unix.CAP_SETGID)
		data[0] = unix.CapUserData{Effective: set, Permitted: set, Inheritable: set}
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("sandbox init: %w", os.NewSyscallError("capset", err))
	}
	if keepSetID {
		// Ambient, so they survive the exec of the interpreter.
		for _, c := range []uintptr{unix.CAP_SETUID, unix.CAP_SETGID} {
			if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_RAISE, c, 0, 0); err != nil {
				return fmt.Errorf("sandbox init: %w", os.NewSyscallError("prctl(PR_CAP_AMBIENT_RAISE)", err))
			}
		}
	}
	return nil
}

func lastCap() int {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err == nil {
		if n, err := strconv.Atoi(string(trimNL(b))); err == nil {
			return n
		}
	}
	return 63
}

func trimNL(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return b
}
