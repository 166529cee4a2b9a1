package sandbox

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/sandbox/cgroup"
	"github.com/pysandbox/pysandbox/internal/testutil"
)

func TestBwrapSetupErrorIsStartError(t *testing.T) {
	b := requireBwrap(t)
	out, errb := &testutil.SyncBuffer{}, &testutil.SyncBuffer{}
	spec := bwrapSpec("print(1)", Limits{MemoryBytes: 128 << 20, MaxProcs: 16}, out, errb)
	spec.Python = "/usr/bin/no-such-python3"
	sb, err := b.Start(context.Background(), spec)
	if err == nil {
		sb.Close()
		t.Fatal("Start succeeded with a missing interpreter")
	}
	if !strings.Contains(err.Error(), "bwrap: execvp /usr/bin/no-such-python3") {
		t.Errorf("Start error %q does not carry bwrap's message", err)
	}
	if out.String() != "" || errb.String() != "" {
		t.Errorf("bwrap's error reached the sandbox's output: stdout %q stderr %q", out, errb)
	}
	t.Logf("Start error: %v", err)
}

func TestBwrapMemoryBomb(t *testing.T) {
	b := requireBwrap(t)
	code := "a = []\nwhile True:\n    a.append(b'\\x01' * (1 << 20))\n"
	s, _, errb := startBwrap(t, b, code, Limits{MemoryBytes: 64 << 20, MaxProcs: 16})
	done := make(chan Exit, 1)
	go func() { done <- s.Wait() }()
	var e Exit
	select {
	case e = <-done:
	case <-time.After(time.Minute):
		s.Kill()
		t.Fatal("memory bomb still running after a minute")
	}
	if b.cgroups.Memory {
		if !e.OOMKilled || e.Signal != syscall.SIGKILL {
			t.Errorf("exit %+v, want OOMKilled by SIGKILL\nstderr: %s", e, errb)
		}
		if e.PeakMemoryBytes > 80<<20 {
			t.Errorf("peak memory %d above the 64MiB limit", e.PeakMemoryBytes)
		}
	} else if e.Code == 0 || !strings.Contains(errb.String(), "MemoryError") {
		t.Errorf("without a memory cgroup RLIMIT_AS must stop it: exit %+v stderr %s", e, errb)
	}
	t.Logf("exit %+v", e)
	checkGone(t, s)
}

func TestBwrapForkBomb(t *testing.T) {
	b := requireBwrap(t)
	const maxProcs = 16
	code := `
import os, time
n = 0
err = None
while n < 1000:
    try:
        pid = os.fork()
    except OSError as e:
        err = e.errno
        break
    if pid == 0:
        time.sleep(120)
        os._exit(0)
    n += 1
print(n, err, flush=True)
`
	s, out, errb := startBwrap(t, b, code, Limits{MemoryBytes: 256 << 20, MaxProcs: maxProcs})
	e := s.Wait()
	f := strings.Fields(out.String())
	if len(f) != 2 {
		t.Fatalf("output %q stderr %q exit %+v", out, errb, e)
	}
	n, _ := strconv.Atoi(f[0])
	if n <= 0 || n >= maxProcs || f[1] != strconv.Itoa(int(syscall.EAGAIN)) {
		t.Errorf("forked %d children, then errno %s; want fewer than %d and EAGAIN", n, f[1], maxProcs)
	}
	t.Logf("forked %d of at most %d tasks, exit %+v", n, maxProcs, e)
	checkGone(t, s)
}

func TestBwrapConcurrent(t *testing.T) {
	b := requireBwrap(t)
	const n = 4
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code := fmt.Sprintf("import os, time; open('/tmp/mine', 'w').write('%d'); time.sleep(0.3); print(os.getuid(), open('/tmp/mine').read(), sorted(os.listdir('/tmp')))", i)
			out, errb := &testutil.SyncBuffer{}, &testutil.SyncBuffer{}
			sb, err := b.Start(context.Background(), bwrapSpec(code, Limits{MemoryBytes: 128 << 20, MaxProcs: 16}, out, errb))
			if err != nil {
				t.Error(err)
				return
			}
			defer sb.Close()
			e := sb.Wait()
			if want := fmt.Sprintf("1000 %d ['mine']\n", i); e.Code != 0 || out.String() != want {
				t.Errorf("sandbox %d: exit %+v stdout %q (want %q) stderr %q", i, e, out, want, errb)
			}
		}()
	}
	wg.Wait()
}

// The bwrap shim sets RLIMIT_AS (no memory cgroup) before it execs bwrap,
// and must not grow its heap after that (see
// TestNativeRlimitASStartsWithLargeEnvironment). The environment reaches
// bwrap through a descriptor, so here its argument list is made large. This
// one did not fail reliably before the fix (the shim's heap usually had room
// left from decoding its config); it guards the path, not the bug.
func TestBwrapRlimitASStartsWithLargeArguments(t *testing.T) {
	b := requireBwrap(t)
	b.cgroups = cgroup.Info{} // as for a user without cgroup delegation
	for range 3 {
		spec := bwrapSpec("import sys, resource; print(len(sys.argv), len(sys.argv[-1]), resource.getrlimit(resource.RLIMIT_AS)[0] >> 20)",
			Limits{MemoryBytes: 96 << 20, MaxProcs: 16, TmpBytes: 16 << 20}, nil, nil)
		for range 12 {
			spec.Args = append(spec.Args, strings.Repeat("x", 100<<10))
		}
		wantOutput(t, b, spec, "13 102400 96\n")
	}
}
