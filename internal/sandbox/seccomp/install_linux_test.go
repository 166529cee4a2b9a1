package seccomp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// helperEnv tells a re-executed test binary which helper to run. The filter
// cannot be removed once installed, so every real-kernel check happens in a
// child process and the parent only reads its report.
const helperEnv = "PYSANDBOX_SECCOMP_HELPER"

const resultPrefix = "seccomp-result: "

// requireSeccomp skips only when the kernel has no seccomp support at all;
// /proc/<pid>/status has a Seccomp line exactly when CONFIG_SECCOMP is set.
func requireSeccomp(t *testing.T) {
	t.Helper()
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(status, []byte("\nSeccomp:")) {
		t.Skip("kernel built without CONFIG_SECCOMP")
	}
}

func runHelper(t *testing.T, mode string) *exec.Cmd {
	t.Helper()
	// The timeout turns a helper stuck by a broken filter into a failure.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode)
	cmd.Stderr = os.Stderr
	return cmd
}

func TestInstallKernel(t *testing.T) {
	requireSeccomp(t)
	out, err := runHelper(t, "probe").Output()
	if err != nil {
		t.Fatalf("helper failed: %v\n%s", err, out)
	}
	var got map[string]string
	for line := range strings.Lines(string(out)) {
		if s, ok := strings.CutPrefix(line, resultPrefix); ok {
			if err := json.Unmarshal([]byte(s), &got); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got == nil {
		t.Fatalf("helper printed no result:\n%s", out)
	}

	want := map[string]string{
		"install":              "ok",
		"status.Seccomp":       "2",
		"status.NoNewPrivs":    "1",
		"all threads filtered": "ok",

		// Must keep working.
		"getpid":            "ok",
		"open file":         "ok",
		"fork+exec":         "ok",
		"new threads":       "ok",
		"ioctl FIONREAD":    "ok",
		"socket AF_UNIX":    "ok",
		"personality query": "ok",

		// Refused. Each call's arguments are chosen so that, without the
		// filter, it would succeed or fail with some other errno; EPERM
		// therefore comes from the filter, not from missing privileges.
		"unshare CLONE_NEWUSER":          "EPERM",  // EINVAL: Go is multithreaded
		"mount":                          "EPERM",  // ENOENT: no such target
		"ptrace PTRACE_TRACEME":          "EPERM",  // succeeds
		"keyctl":                         "EPERM",  // succeeds
		"clone CLONE_NEWNET":             "EPERM",  // succeeds as root
		"clone CLONE_NEWUSER, high bits": "EPERM",  // succeeds
		"clone3":                         "ENOSYS", // EINVAL: size 0
		"ioctl TIOCSTI":                  "EPERM",  // ENOTTY on a pipe
		"ioctl TIOCSTI, high bits":       "EPERM",  // ENOTTY on a pipe
		"socket AF_VSOCK":                "EPERM",  // succeeds where vsock exists (VMs)
		"personality ADDR_NO_RANDOMIZE":  "EPERM",  // succeeds
		"bpf":                            "EPERM",  // E2BIG
		"io_uring_setup":                 "EPERM",  // EFAULT
	}
	for probe, w := range want {
		if g, ok := got[probe]; !ok {
			t.Errorf("%s: no result", probe)
		} else if g != w {
			t.Errorf("%s: got %s, want %s", probe, g, w)
		}
	}
	// landlock must stay usable; what it returns depends on the kernel.
	if g := got["landlock_create_ruleset"]; g == "EPERM" || g == "" {
		t.Errorf("landlock_create_ruleset: got %q, want anything but EPERM", g)
	}
	t.Logf("helper results: %v", got)
}

func TestInstallKillsX32(t *testing.T) {
	requireSeccomp(t)
	if !native.x32 {
		t.Skip("x32 exists only on amd64")
	}
	err := runHelper(t, "x32").Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("helper survived an x32 syscall (err=%v)", err)
	}
	ws := exit.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGSYS {
		t.Fatalf("helper ended with %v, want death by SIGSYS", exit)
	}
}

// TestHelperProcess is not a test: it is the child side of the tests above.
func TestHelperProcess(t *testing.T) {
	switch os.Getenv(helperEnv) {
	case "":
		return
	case "probe":
		probe()
	case "x32":
		// SIGSYS dumps core by default; there is nothing to learn from it.
		unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{})
		if err := Install(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		unix.RawSyscall(x32Bit|unix.SYS_GETPID, 0, 0, 0)
		fmt.Fprintln(os.Stderr, "x32 getpid returned")
	}
	os.Exit(0)
}

func probe() {
	res := map[string]string{}
	record := func(name string, err error) {
		var errno unix.Errno
		switch {
		case err == nil:
			res[name] = "ok"
		case errors.As(err, &errno):
			res[name] = unix.ErrnoName(errno)
		default:
			res[name] = err.Error()
		}
	}
	errnoErr := func(e unix.Errno) error {
		if e == 0 {
			return nil
		}
		return e
	}
	defer func() {
		b, _ := json.Marshal(res)
		fmt.Printf("\n%s%s\n", resultPrefix, b)
	}()

	if err := Install(); err != nil {
		record("install", err)
		return
	}
	record("install", nil)

	status, err := procStatus("/proc/self/status")
	record("open file", err)
	res["status.Seccomp"] = status["Seccomp"]
	res["status.NoNewPrivs"] = status["NoNewPrivs"]
	record("all threads filtered", allThreadsFiltered())

	if pid := unix.Getpid(); pid <= 0 {
		record("getpid", fmt.Errorf("getpid returned %d", pid))
	} else {
		record("getpid", nil)
	}
	record("fork+exec", exec.Command("/bin/true").Run())
	record("new threads", newThreads(8))

	record("unshare CLONE_NEWUSER", unix.Unshare(unix.CLONE_NEWUSER))
	record("mount", unix.Mount("none", "/nonexistent/seccomp-probe", "tmpfs", 0, ""))
	_, err = unix.KeyctlInt(unix.KEYCTL_GET_KEYRING_ID, unix.KEY_SPEC_SESSION_KEYRING, 0, 0, 0)
	record("keyctl", err)
	record("clone CLONE_NEWNET", rawClone(unix.CLONE_NEWNET|uintptr(unix.SIGCHLD)))
	record("clone CLONE_NEWUSER, high bits", rawClone(0xffffffff_00000000|unix.CLONE_NEWUSER|uintptr(unix.SIGCHLD)))
	_, _, e := unix.RawSyscall(unix.SYS_CLONE3, 0, 0, 0)
	record("clone3", errnoErr(e))

	var p [2]int
	if err := unix.Pipe(p[:]); err != nil {
		record("pipe", err)
		return
	}
	c := byte('x')
	_, _, e = unix.Syscall(unix.SYS_IOCTL, uintptr(p[0]), unix.TIOCSTI, uintptr(unsafe.Pointer(&c)))
	record("ioctl TIOCSTI", errnoErr(e))
	_, _, e = unix.Syscall(unix.SYS_IOCTL, uintptr(p[0]), 1<<32|unix.TIOCSTI, uintptr(unsafe.Pointer(&c)))
	record("ioctl TIOCSTI, high bits", errnoErr(e))
	_, err = unix.IoctlGetInt(p[0], unix.TIOCINQ)
	record("ioctl FIONREAD", err)

	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	record("socket AF_UNIX", err)
	unix.Close(fd)
	_, err = unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM, 0)
	record("socket AF_VSOCK", err)

	_, _, e = unix.RawSyscall(unix.SYS_PERSONALITY, perQuery, 0, 0)
	record("personality query", errnoErr(e))
	_, _, e = unix.RawSyscall(unix.SYS_PERSONALITY, 0x0040000, 0, 0) // ADDR_NO_RANDOMIZE
	record("personality ADDR_NO_RANDOMIZE", errnoErr(e))

	_, _, e = unix.RawSyscall(unix.SYS_BPF, unix.BPF_PROG_LOAD, 0, 0)
	record("bpf", errnoErr(e))
	_, _, e = unix.RawSyscall(unix.SYS_IO_URING_SETUP, 1, 0, 0)
	record("io_uring_setup", errnoErr(e))
	_, _, e = unix.RawSyscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	record("landlock_create_ruleset", errnoErr(e))

	// Last: if this wrongly succeeded, the parent test process would become
	// our tracer and the next signal would stop us for good.
	_, _, e = unix.RawSyscall(unix.SYS_PTRACE, unix.PTRACE_TRACEME, 0, 0)
	record("ptrace PTRACE_TRACEME", errnoErr(e))
}

// rawClone calls clone(2) directly, as a C program or a ctypes call would.
// If the filter let it through, the child leaves at once and the call is
// reported as a failure.
func rawClone(flags uintptr) error {
	pid, _, e := unix.RawSyscall6(unix.SYS_CLONE, flags, 0, 0, 0, 0, 0)
	if e != 0 {
		return e
	}
	if pid == 0 {
		unix.RawSyscall(unix.SYS_EXIT_GROUP, 0, 0, 0)
	}
	var ws unix.WaitStatus
	unix.Wait4(int(pid), &ws, 0, nil)
	return fmt.Errorf("clone succeeded (child %d)", pid)
}

// newThreads makes the Go runtime start n more OS threads (clone with thread
// flags) and checks they all came up.
func newThreads(n int) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	release := make(chan struct{})
	tids := map[int]bool{}
	for range n {
		wg.Add(1)
		go func() {
			runtime.LockOSThread() // each goroutine holds its own thread
			mu.Lock()
			tids[unix.Gettid()] = true
			mu.Unlock()
			wg.Done()
			<-release
		}()
	}
	wg.Wait()
	close(release)
	if len(tids) != n {
		return fmt.Errorf("got %d distinct threads, want %d", len(tids), n)
	}
	return nil
}

// allThreadsFiltered checks that TSYNC reached every thread, not only the
// one that called Install.
func allThreadsFiltered() error {
	dirs, err := filepath.Glob("/proc/self/task/*/status")
	if err != nil || len(dirs) == 0 {
		return fmt.Errorf("no threads found: %v", err)
	}
	for _, path := range dirs {
		st, err := procStatus(path)
		if err != nil {
			return err
		}
		if st["Seccomp"] != "2" || st["NoNewPrivs"] != "1" {
			return fmt.Errorf("%s: Seccomp=%s NoNewPrivs=%s", path, st["Seccomp"], st["NoNewPrivs"])
		}
	}
	return nil
}

func procStatus(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok {
			st[k] = strings.TrimSpace(v)
		}
	}
	return st, sc.Err()
}
