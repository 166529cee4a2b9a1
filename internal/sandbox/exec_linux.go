package sandbox

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The last steps of the sandbox init and of the bwrap shim run after the
// rlimits are set, and must not allocate.
//
// Why: without a memory cgroup the memory limit is RLIMIT_AS, and a Go
// process has already reserved more address space than a typical limit (the
// runtime maps 1-2 GiB of arenas and page-allocator summaries it has not
// touched). Once RLIMIT_AS is below that, every mmap fails, so any heap
// growth kills the process with "fatal error: runtime: out of memory". That
// was seen under load, when a small allocation between setrlimit and execve
// needed a fresh span. So everything that allocates is done first
// (preparedExec, seccomp.Prepare), the collector is switched off, and only
// then are the limits set and the interpreter exec'd.

// preparedExec is an execve whose arguments are already C strings.
type preparedExec struct {
	path       *byte
	argv, envv []*byte
}

func prepareExec(path string, argv, env []string) (*preparedExec, error) {
	p, err := unix.BytePtrFromString(path)
	if err != nil {
		return nil, fmt.Errorf("exec %s: %w", path, err)
	}
	a, err := syscall.SlicePtrFromStrings(argv)
	if err != nil {
		return nil, fmt.Errorf("exec %s: arguments: %w", path, err)
	}
	e, err := syscall.SlicePtrFromStrings(env)
	if err != nil {
		return nil, fmt.Errorf("exec %s: environment: %w", path, err)
	}
	return &preparedExec{path: p, argv: a, envv: e}, nil
}

// freeze stops the collector, whose cycles and background sweeping
// allocate runtime metadata, so that nothing grows the heap between the
// limits and the exec: no new cycle may start, and the last one is finished
// here, sweep included (runtime.GC sweeps every span before it returns).
func freeze() {
	debug.SetGCPercent(-1)
	runtime.GC()
}

// setRlimits applies rls; it allocates only to report a failure. Each is
// a raw prlimit64, as the exec is: through the runtime's syscall path, a
// call the scheduler saw as blocked could have its work handed to a new
// thread, whose stack mmap fails under the new RLIMIT_AS and aborts the
// process ("runtime/cgo: pthread_create failed", seen under load).
func setRlimits(rls []rlimit) error {
	for i := range rls {
		lim := unix.Rlimit{Cur: rls[i].Cur, Max: rls[i].Max}
		_, _, errno := unix.RawSyscall6(unix.SYS_PRLIMIT64, 0, uintptr(rls[i].Resource), uintptr(unsafe.Pointer(&lim)), 0, 0, 0)
		runtime.KeepAlive(&lim)
		if errno != 0 {
			return fmt.Errorf("rlimit %d: %w", rls[i].Resource, os.NewSyscallError("prlimit64", errno))
		}
	}
	return nil
}

// exec replaces the process. It is a raw system call, as syscall.Exec's
// own is, so the runtime cannot hand this thread's work to a new thread (a
// new thread allocates) while the kernel loads the interpreter. It returns
// only on failure.
func (p *preparedExec) exec() error {
	_, _, errno := unix.RawSyscall(unix.SYS_EXECVE,
		uintptr(unsafe.Pointer(p.path)),
		uintptr(unsafe.Pointer(&p.argv[0])),
		uintptr(unsafe.Pointer(&p.envv[0])))
	runtime.KeepAlive(p)
	return os.NewSyscallError("execve", errno)
}
