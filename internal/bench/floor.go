package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pysandbox/pysandbox/internal/pool"
)

// floorCode is the physical floor of an isolated run on this machine: a
// warm interpreter (one that imported what the worker imports) forks a
// child straight into a new pid namespace, and the child unshares the
// namespaces a pooled run's pid 1 unshares (mount, network, IPC, UTS,
// cgroup, then a user namespace of its own) and exits. Nothing else: no
// mounts, no lockdown, no code, no server. The interpreter first moves
// into a user namespace of its own where it holds every capability, as
// the zygote does, so the floor needs no privilege and is the same for
// root and for a user.
//
// It prints the CPU time of itself and of its reaped children, in ns,
// over N forks (from its own fork, which the rest of the work is in).
const floorCode = `
import ast, binascii, builtins, io, json, keyword, linecache, marshal, os, signal, socket, time, traceback, types, warnings
import ctypes, fcntl, resource, struct
N = int(COUNT)
libc = ctypes.CDLL(None, use_errno=True)
NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET = 0x20000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000
def check(r, what):
    if r != 0:
        raise OSError(ctypes.get_errno(), what)
uid, gid = os.geteuid(), os.getegid()
check(libc.unshare(NEWUSER), "unshare(user)")
with open("/proc/self/setgroups", "w") as f:
    f.write("deny")
with open("/proc/self/uid_map", "w") as f:
    f.write("%d %d 1" % (uid, uid))
with open("/proc/self/gid_map", "w") as f:
    f.write("%d %d 1" % (gid, gid))
# setns back to a pid namespace needs a capability in the user namespace
# that owns it: fork into one ours owns first, as the zygote does.
check(libc.unshare(NEWPID), "unshare(pid)")
first = os.fork()
if first != 0:
    _, st = os.waitpid(first, 0)
    os._exit(1 if st else 0)
own = os.open("/proc/self/ns/pid", os.O_RDONLY)
def once():
    check(libc.unshare(NEWPID), "unshare(pid)")
    pid = os.fork()
    if pid == 0:
        try:
            check(libc.unshare(NEWNS | NEWNET | NEWIPC | NEWUTS), "unshare")
            check(libc.unshare(NEWCGROUP), "unshare(cgroup)")
            check(libc.unshare(NEWUSER), "unshare(user)")
        finally:
            os._exit(0)
    check(libc.setns(own, NEWPID), "setns(pid)")
    _, st = os.waitpid(pid, 0)
    if st != 0:
        raise OSError("a floor child failed")
for _ in range(3):
    once()
def cpu():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime
print("ready", flush=True)
input()
t = cpu()
for _ in range(N):
    once()
print(int((cpu() - t) * 1e9), flush=True)
input()
`

// floorResult is the floor's CPU per fork: the processes' own and the
// kernel threads' (the namespaces' deferred teardown).
type floorResult struct {
	process, kernel time.Duration
	kernelGone      bool
}

func (f floorResult) total() time.Duration { return f.process + f.kernel }

// measureFloor runs floorCode with the baseline interpreter, n forks,
// and counts the kernel threads' CPU over the same span.
func measureFloor(ctx context.Context, python string, n int) (floorResult, error) {
	cmd := exec.CommandContext(ctx, python, "-c", strings.Replace(floorCode, "COUNT", strconv.Itoa(n), 1))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return floorResult{}, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return floorResult{}, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return floorResult{}, fmt.Errorf("bench: floor: %w", err)
	}
	defer cmd.Wait()
	defer stdin.Close()
	// Its lines are short: a longer one fails as bufio.ErrBufferFull.
	out := bufio.NewReaderSize(stdout, 64)
	line := func() (string, error) {
		b, err := out.ReadSlice('\n')
		if err != nil {
			return "", fmt.Errorf("bench: floor: %w (%s)", err, strings.TrimSpace(stderr.String()))
		}
		return string(b[:len(b)-1]), nil
	}
	if s, err := line(); err != nil || s != "ready" {
		return floorResult{}, fmt.Errorf("bench: floor did not start: %q %v", s, err)
	}
	// The last forks' namespaces are torn down by now, or nearly.
	time.Sleep(20 * time.Millisecond)
	rest := measureRest(restWindow)
	k0, w0 := kernelThreadsCPU(), pool.Monotonic()
	io.WriteString(stdin, "\n")
	s, err := line()
	if err != nil {
		return floorResult{}, err
	}
	ns, err := strconv.ParseInt(s, 10, 64)
	if err != nil || ns < 0 {
		return floorResult{}, fmt.Errorf("bench: floor printed %q", s)
	}
	time.Sleep(20 * time.Millisecond)
	k1, w1 := kernelThreadsCPU(), pool.Monotonic()
	io.WriteString(stdin, "\n")
	return floorResult{
		process:    time.Duration(ns) / time.Duration(n),
		kernel:     beyond(k1-k0, rest.kernel, w1-w0) / time.Duration(n),
		kernelGone: k1 < k0,
	}, nil
}
