package pool

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/testutil"
)

// descendants lists the processes below pid on the host.
func descendants(pid int) []int {
	parent := map[int]int{}
	for _, p := range testutil.HostProcs(func(string) bool { return true }) {
		if st, ok := testutil.ReadProcStat(p); ok {
			parent[p] = st.PPid
		}
	}
	var out []int
	for p := range parent {
		for q := parent[p]; q > 1; q = parent[q] {
			if q == pid {
				out = append(out, p)
				break
			}
		}
	}
	return out
}

// TestNoHostRootInAnyUIDMap looks from the host at every process the pool
// has made (zygotes, ready children, a session and a run in flight): none
// may live in a user namespace that maps anything to host uid 0. (A root
// server's zygote keeps CAP_SETUID in its namespace; with host root mapped
// there it could become host root.)
func TestNoHostRootInAnyUIDMap(t *testing.T) {
	e, _ := newPooledEngine(t, 2, []string{"json"})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sess := e.NewSessions(engine.SessionConfig{})
	defer sess.Shutdown()
	if _, err := sess.Create(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	var out testutil.SyncBuffer
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.Run(ctx, engine.RunRequest{Code: "import time\nprint('up', flush=True)\ntime.sleep(3)", Stdout: &out})
	}()
	waitFor(t, func() bool { return strings.Contains(out.String(), "up") })

	self, _ := os.Readlink("/proc/self/ns/user")
	checked := 0
	for _, pid := range descendants(os.Getpid()) {
		ns, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/user")
		if err != nil || ns == self {
			continue // gone, or the host's namespace (the server's own helpers)
		}
		// Read from the host, uid_map shows each range's host uid.
		data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "uid_map"))
		if err != nil {
			continue
		}
		checked++
		for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			f := strings.Fields(line)
			if len(f) != 3 {
				continue
			}
			host, _ := strconv.ParseUint(f[1], 10, 64)
			n, _ := strconv.ParseUint(f[2], 10, 64)
			if host == 0 && n > 0 {
				comm, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
				t.Errorf("pid %d (%q) maps host uid 0: %q", pid, strings.ReplaceAll(string(comm), "\x00", " "), line)
			}
		}
	}
	// Two zygotes, their ready children, the session and the run.
	if checked < 5 {
		t.Errorf("only %d sandboxed processes found", checked)
	}
	<-done
}

// TestZygoteIsReplacedAfterMaxRuns: after ZygoteMaxRuns forks a zygote is
// replaced by a fresh interpreter (its own hash seed and memory layout);
// the old one goes once its last child has ended, and a run in flight on
// it finishes normally.
func TestZygoteIsReplacedAfterMaxRuns(t *testing.T) {
	e, p := newPooledEngine(t, 0, nil)
	p.cfg.ZygoteMaxRuns = 3
	zygoteOf := func() *zygote {
		p.light.mu.Lock()
		defer p.light.mu.Unlock()
		return p.light.z
	}
	first := zygoteOf()
	seeds := map[string]bool{}
	// A long run on the first zygote stays in flight across its
	// replacement.
	var out testutil.SyncBuffer
	long := make(chan *engine.Result, 1)
	go func() {
		r, _ := e.Run(context.Background(), engine.RunRequest{Code: "import time\nprint('up', flush=True)\ntime.sleep(2)\nhash('seed')", Stdout: &out})
		long <- r
	}()
	waitFor(t, func() bool { return strings.Contains(out.String(), "up") })
	for i := range 6 {
		r := run(t, e, "hash('seed')")
		if r.Status != engine.StatusSuccess {
			t.Fatalf("run %d: %+v", i, r)
		}
		seeds[fmt.Sprint(r.ReturnValue)] = true
	}
	if r := <-long; r == nil || r.Status != engine.StatusSuccess {
		t.Fatalf("the run in flight on the replaced zygote: %+v", r)
	}
	if zygoteOf() == first {
		t.Fatal("the zygote was not replaced after 3 forks")
	}
	if len(seeds) < 2 {
		t.Errorf("every run had the same str hash seed across zygotes: %v", seeds)
	}
	// The first zygote goes once its children have ended.
	waitFor(t, func() bool {
		select {
		case <-first.done:
			return true
		default:
			return false
		}
	})
}

// TestChildLandlock: pool children put themselves in a Landlock domain.
// Narrowed to /work, a write to /tmp (which the mounts allow) is refused.
func TestChildLandlock(t *testing.T) {
	if abi := landlockABIForTest(); abi == 0 {
		t.Skip("this kernel has no Landlock")
	}
	saved := landlockWritable
	landlockWritable = func() []string { return []string{"/work", "/dev/null"} }
	defer func() { landlockWritable = saved }()
	e, _ := newPooledEngine(t, 1, nil)
	code := "import errno\ndef w(p):\n    try:\n        open(p, 'w').write('x')\n        return 'ok'\n    except OSError as e:\n        return errno.errorcode[e.errno]\n[w('/tmp/x'), w('/work/x'), w('/dev/null')]"
	for i := range 2 { // a ready child and one forked on demand
		r := run(t, e, code)
		if got := fmt.Sprint(r.ReturnValue); r.Status != engine.StatusSuccess || got != "[EACCES ok ok]" {
			t.Fatalf("run %d: %s %v %s", i, r.Status, r.ReturnValue, r.Stderr)
		}
	}
}

func landlockABIForTest() int {
	v, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if errno != 0 {
		return 0
	}
	return int(v)
}

// TestZygoteMaxAgeSkipsReadyChildren: a child made ready by a zygote that
// has since passed ZygoteMaxAge is not handed out (its layout and hash seed
// have been shared long enough); the run gets one from a fresh zygote.
func TestZygoteMaxAgeSkipsReadyChildren(t *testing.T) {
	e, p := newPooledEngine(t, 2, nil)
	p.cfg.ZygoteMaxAge = time.Second
	first := run(t, e, "hash('seed')")
	time.Sleep(1500 * time.Millisecond) // the age bound is the behaviour under test
	waitFor(t, func() bool { return len(p.light.ready) > 0 })
	second := run(t, e, "hash('seed')")
	if first.Status != engine.StatusSuccess || second.Status != engine.StatusSuccess {
		t.Fatalf("%+v %+v", first, second)
	}
	if fmt.Sprint(first.ReturnValue) == fmt.Sprint(second.ReturnValue) {
		t.Errorf("a run after the zygote's max age had its hash seed: %v", first.ReturnValue)
	}
}
