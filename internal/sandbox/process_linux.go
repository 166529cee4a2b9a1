package sandbox

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pysandbox/pysandbox/internal/sandbox/cgroup"
)

func socketpair() (*os.File, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox: %w", os.NewSyscallError("socketpair", err))
	}
	return os.NewFile(uintptr(fds[0]), "socket"), os.NewFile(uintptr(fds[1]), "socket"), nil
}

// controlSocket makes the worker's control channel: the Go end as a
// net.Conn, and the end to pass to the child as fd 3.
func controlSocket() (net.Conn, *os.File, error) {
	parent, child, err := socketpair()
	if err != nil {
		return nil, nil, err
	}
	conn, err := net.FileConn(parent)
	parent.Close()
	if err != nil {
		child.Close()
		return nil, nil, fmt.Errorf("sandbox: control socket: %w", err)
	}
	return conn, child, nil
}

// exitOf reads how a directly started process ended. Resource figures
// from rusage are a fallback for when no cgroup measured them.
func exitOf(ps *os.ProcessState) Exit {
	e := Exit{Code: -1}
	if ps == nil {
		return e
	}
	e.Code = ps.ExitCode()
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		e.Signal = ws.Signal()
	}
	if ru, ok := ps.SysUsage().(*syscall.Rusage); ok {
		e.PeakMemoryBytes = ru.Maxrss * 1024
		e.CPUTime = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return e
}

// FinalFigures completes e from the sandbox's cgroup, when it has one; its
// numbers cover every process, not just the one we waited for. Call it once
// every process is gone: when pid 1 of a pid namespace has been reaped, the
// kernel has already killed and reaped the rest.
func FinalFigures(cg *cgroup.Group, e *Exit) {
	if cg == nil {
		return
	}
	if f, err := cg.Figures(); err == nil {
		if f.MemoryPeakBytes > 0 {
			e.PeakMemoryBytes = f.MemoryPeakBytes
		}
		if f.CPUUsage > 0 {
			e.CPUTime = f.CPUUsage
		}
		e.OOMKilled = f.OOMKills > 0
	} else {
		e.OOMKilled = cg.OOMKilled()
	}
}

// OpenWorkspace opens /work of the sandbox whose pid 1 is pid, through
// /proc/<pid>/root, without following a symlink at /work itself.
func OpenWorkspace(pid int) (*os.File, error) {
	if pid <= 0 {
		return nil, errors.New("sandbox: no process to reach the workspace through")
	}
	path := "/proc/" + strconv.Itoa(pid) + "/root/work"
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("sandbox: open workspace: %w", os.NewSyscallError("open", err))
	}
	return os.NewFile(uintptr(fd), path), nil
}

// MemoryCurrent reads a cgroup's memory usage, 0 when there is none.
func MemoryCurrent(cg *cgroup.Group) int64 {
	if cg == nil {
		return 0
	}
	n, _ := cg.MemoryCurrent()
	return n
}

// CPUUsage reads a cgroup's CPU time so far, 0 when there is none.
func CPUUsage(cg *cgroup.Group) time.Duration {
	if cg == nil {
		return 0
	}
	d, _ := cg.CPUUsage()
	return d
}

// Idle sets a cgroup idle or not (ErrNoCPUControl when there is none);
// see Sessioner.Idle.
func Idle(cg *cgroup.Group, idle bool) error {
	if cg == nil || !cg.CanIdle() {
		return ErrNoCPUControl
	}
	return cg.SetIdle(idle)
}
