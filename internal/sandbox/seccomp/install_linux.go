package seccomp

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Install sets no_new_privs and attaches the filter to every thread of the
// calling process. It cannot be undone: the filter stays on this process and
// on everything it forks or execs.
//
// Call it in the process that is about to exec the untrusted interpreter,
// after all setup that needs the denied calls (mounts, namespaces) is done,
// and exec soon after, from the same goroutine. The caller should hold
// runtime.LockOSThread from before Install until the exec; Install also locks
// the goroutine to its thread and leaves it locked. That matters because
// no_new_privs is set per thread, and on kernels without seccomp(2) (before
// 3.17) only the calling thread gets the filter, so the exec must come from
// that thread.
func Install() error { return InstallProfile(Strict) }

// InstallProfile is Install with the filter of profile p.
func InstallProfile(p Profile) error {
	f, err := Prepare(p)
	if err != nil {
		return err
	}
	return f.Install()
}

// A Filter is a profile's program in the form the kernel takes, built ahead
// of Install so that Install itself allocates nothing. A sandbox init sets
// RLIMIT_AS before it installs the filter, and past that point any heap
// growth of the Go runtime fails (see the sandbox package's exec).
type Filter struct {
	socks []unix.SockFilter
	prog  unix.SockFprog
}

// Prepare builds the filter of profile p.
func Prepare(p Profile) (*Filter, error) {
	filter, err := ProgramFor(p)
	if err != nil {
		return nil, err
	}
	if len(filter) == 0 {
		return nil, errors.New("seccomp: empty program")
	}
	f := &Filter{socks: make([]unix.SockFilter, len(filter))}
	for i, ins := range filter {
		f.socks[i] = unix.SockFilter{Code: ins.Op, Jt: ins.Jt, Jf: ins.Jf, K: ins.K}
	}
	f.prog = unix.SockFprog{Len: uint16(len(f.socks)), Filter: &f.socks[0]}
	return f, nil
}

// Install sets no_new_privs and attaches f to every thread of the calling
// process, with the caveats of the package-level Install.
func (f *Filter) Install() error {
	socks, prog := f.socks, &f.prog
	runtime.LockOSThread()

	// Without no_new_privs the kernel refuses a filter from an unprivileged
	// process, and a setuid binary exec'd later could run with privileges
	// under a filter it does not expect. It must be set on the thread that
	// calls seccomp(2); TSYNC then copies it to the other threads.
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("seccomp: set no_new_privs: %w", os.NewSyscallError("prctl", err))
	}

	// TSYNC puts the filter on all threads at once. A Go process always has
	// several, and any of them may be the one that later forks and execs.
	r, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
		unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(prog)))
	runtime.KeepAlive(socks)
	switch {
	case errno == unix.ENOSYS:
		// Kernels before 3.17 only have the prctl interface, which filters
		// the calling thread alone (see the doc comment).
		// Raw syscall rather than unix.Prctl: a pointer may only be passed
		// as uintptr in the call expression of the syscall itself.
		_, _, errno := unix.Syscall(unix.SYS_PRCTL, unix.PR_SET_SECCOMP,
			unix.SECCOMP_MODE_FILTER, uintptr(unsafe.Pointer(prog)))
		runtime.KeepAlive(socks)
		if errno != 0 {
			return fmt.Errorf("seccomp: install filter: %w", os.NewSyscallError("prctl", errno))
		}
	case errno != 0:
		return fmt.Errorf("seccomp: install filter: %w", os.NewSyscallError("seccomp", errno))
	case r != 0:
		// With TSYNC, a positive return is the ID of a thread that could not
		// be synchronised (it already has a diverging filter); nothing was
		// installed.
		return fmt.Errorf("seccomp: install filter: thread %d could not be synchronised", r)
	}
	return nil
}
