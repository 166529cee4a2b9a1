package pool

import (
	"github.com/pysandbox/pysandbox/internal/testutil"

	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pysandbox/pysandbox/internal/engine"
)

func run(t *testing.T, e *engine.Engine, code string) *engine.Result {
	t.Helper()
	r, err := e.Run(context.Background(), engine.RunRequest{Code: code})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestPooledRunIsASandbox(t *testing.T) {
	e, p := newPooledEngine(t, 2, nil)
	for i := 0; i < 4; i++ {
		if i == 1 {
			// One run from a ready child at least: on a loaded machine
			// the refill can lose the race with the next run, which is
			// then forked on demand (a miss, as it should be).
			waitFor(t, func() bool { return len(p.light.ready) > 0 })
		}
		r := run(t, e, "import os, socket\nprint(os.getpid(), os.getuid(), socket.gethostname(), os.getcwd())\n21*2")
		if r.Status != engine.StatusSuccess || r.Stdout != "1 1000 pysandbox /work\n" || fmt.Sprint(r.ReturnValue) != "42" {
			t.Fatalf("run %d: %+v", i, r)
		}
	}
	if st := p.Stats(); st.Hits == 0 {
		t.Errorf("no run was served from the pool: %+v", st)
	}
}

// Two runs alive at the same time attack each other: neither may see,
// signal, ptrace or share files with the other.
func TestSiblingsCannotReachEachOther(t *testing.T) {
	e, _ := newPooledEngine(t, 2, nil)
	victim := `
import os, socket, sys, time
for d in ("/tmp", "/work", "/dev/shm"):
    open(d + "/victim-secret", "w").write("secret")
srv = socket.socket(socket.AF_UNIX)
srv.bind("\0pysandbox-victim")
srv.listen(1)
srv.setblocking(False)
print("READY", open("/proc/self/uid_map").read().split()[1], os.readlink("/proc/self/ns/pid"), flush=True)
time.sleep(3)
try:
    srv.accept()
    print("ATTACKER CONNECTED")
except BlockingIOError:
    pass
print(sorted(os.listdir("/tmp")), sorted(os.listdir("/work")), sorted(os.listdir("/dev/shm")))
`
	var out testutil.SyncBuffer
	done := make(chan *engine.Result, 1)
	go func() {
		r, err := e.Run(context.Background(), engine.RunRequest{Code: victim, Stdout: &out})
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(out.String(), "READY") {
		if time.Now().After(deadline) {
			t.Fatalf("victim did not start: %q", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	attacker := `
import ctypes, errno, json, os, signal, socket
res = {}
res["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
res["files"] = [p for p in ("/tmp/victim-secret", "/work/victim-secret", "/dev/shm/victim-secret") if os.path.exists(p)]
s = socket.socket(socket.AF_UNIX)
try:
    s.connect("\0pysandbox-victim")
    res["abstract"] = "connected"
except OSError as e:
    res["abstract"] = errno.errorcode[e.errno]
killed = []
for pid in range(2, 4000):
    try:
        os.kill(pid, 0)
        killed.append(pid)
    except OSError:
        pass
res["signalable"] = killed
libc = ctypes.CDLL(None, use_errno=True)
res["ptrace"] = libc.ptrace(16, 1, 0, 0)  # PTRACE_ATTACH to pid 1 (ourselves, the only pid 1 we can name)
res["ptrace_errno"] = errno.errorcode.get(ctypes.get_errno(), "")
res["uid_map"] = open("/proc/self/uid_map").read().split()[1]
res["pidns"] = os.readlink("/proc/self/ns/pid")
print(json.dumps(res))
`
	r := run(t, e, attacker)
	if r.Status != engine.StatusSuccess {
		t.Fatalf("attacker: %+v", r)
	}
	var got struct {
		PIDs        []int    `json:"pids"`
		Files       []string `json:"files"`
		Abstract    string   `json:"abstract"`
		Signalable  []int    `json:"signalable"`
		Ptrace      int      `json:"ptrace"`
		PtraceErrno string   `json:"ptrace_errno"`
		UIDMap      string   `json:"uid_map"`
		PidNS       string   `json:"pidns"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &got); err != nil {
		t.Fatalf("%v: %q", err, r.Stdout)
	}
	if len(got.PIDs) != 1 || got.PIDs[0] != 1 {
		t.Errorf("attacker sees processes %v", got.PIDs)
	}
	if len(got.Files) > 0 {
		t.Errorf("attacker sees the victim's files %v", got.Files)
	}
	if got.Abstract == "connected" {
		t.Error("attacker connected to the victim's abstract socket")
	}
	if len(got.Signalable) > 0 {
		t.Errorf("attacker can signal pids %v", got.Signalable)
	}
	if got.Ptrace != -1 || got.PtraceErrno != "EPERM" {
		t.Errorf("ptrace: %d %s", got.Ptrace, got.PtraceErrno)
	}
	vr := <-done
	vout := vr.Stdout
	if strings.Contains(vout, "ATTACKER CONNECTED") || !strings.Contains(vout, "['victim-secret'] ['victim-secret'] ['victim-secret']") {
		t.Errorf("victim's view changed: %q", vout)
	}
	var vUID, vNS string
	fmt.Sscanf(vout, "READY %s %s", &vUID, &vNS)
	if vNS == got.PidNS {
		t.Errorf("victim and attacker share pid namespace %s", vNS)
	}
	if os.Geteuid() == 0 && vUID == got.UIDMap {
		t.Errorf("victim and attacker run as the same host user (%s)", vUID)
	}
}

// A ready child that dies while idle is replaced, never handed out.
func TestIdleDeathIsReplaced(t *testing.T) {
	e, p := newPooledEngine(t, 2, nil)
	waitFor(t, func() bool { return len(p.light.ready) == 2 })
	c := <-p.light.ready
	if err := unix.Kill(c.hostPID, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-c.done
	p.light.ready <- c // put the corpse back where Start will find it
	waitFor(t, func() bool { return p.Stats().IdleDeaths == 1 })
	for i := 0; i < 4; i++ {
		if r := run(t, e, "print('ok')"); r.Status != engine.StatusSuccess {
			t.Fatalf("run %d after an idle death: %+v", i, r)
		}
	}
}

func TestPreload(t *testing.T) {
	var logs bytes.Buffer
	ctx := context.Background()
	e, _ := newPooledEngine(t, 1, nil)
	p, err := New(ctx, Config{Backend: nativeOf(t), Spec: e.RunSpec(), Preload: []string{"decimal", "no_such_module_xyz"}, Size: 1,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatalf("a missing preload module must not fail the pool: %v", err)
	}
	defer p.Close()
	loaded, failed := p.Preload()
	if len(loaded) != 1 || loaded[0] != "decimal" || !strings.Contains(failed["no_such_module_xyz"], "ModuleNotFoundError") {
		t.Errorf("loaded %v failed %v", loaded, failed)
	}
	if !strings.Contains(logs.String(), "no_such_module_xyz") || !strings.Contains(logs.String(), "WARN") {
		t.Errorf("no warning logged: %q", logs.String())
	}
	eng := engineWith(t, p)
	// A run that imports a preloaded module finds it already imported...
	r, err := eng.Run(ctx, engine.RunRequest{Code: "import sys\npre = 'decimal' in sys.modules\nimport decimal\npre"})
	if err != nil || r.ReturnValue != true {
		t.Errorf("decimal not preloaded in the run: %v %+v", err, r)
	}
	// ...and a run that does not goes to the small zygote.
	r, err = eng.Run(ctx, engine.RunRequest{Code: "import sys\n'decimal' in sys.modules"})
	if err != nil || r.ReturnValue != false {
		t.Errorf("a run without the import got the preloading zygote: %v %+v", err, r)
	}
}

// Under a burst, runs start in the order they asked.
func TestBurstQueuesFairly(t *testing.T) {
	e, _ := newPooledEngine(t, 2, nil, func(c *engine.Config) { c.MaxConcurrent = 1 })
	var mu sync.Mutex
	var order []int
	finished := func() int { mu.Lock(); defer mu.Unlock(); return len(order) }
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := e.Run(context.Background(), engine.RunRequest{Code: "import time\ntime.sleep(0.2)"})
			if err != nil || r.Status != engine.StatusSuccess {
				t.Errorf("run %d: %v %+v", i, err, r)
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
		}()
		// Start the next caller only once this one holds the slot, waits in
		// the queue or is done, so the order of asking is known.
		waitFor(t, func() bool { return e.Running()+e.Waiting()+finished() >= i+1 })
	}
	wg.Wait()
	if !sort.IntsAreSorted(order) {
		t.Errorf("runs finished in order %v, want the order they queued in", order)
	}
}

func TestMemoryBudgetCapsIdleChildren(t *testing.T) {
	ctx := context.Background()
	e, _ := newPooledEngine(t, 0, nil)
	// The zygote is about 14 MiB and an idle child about 2 MiB of its own:
	// 20 MiB has room for a few idle children, not eight.
	p, err := New(ctx, Config{Backend: nativeOf(t), Spec: e.RunSpec(), Size: 8, MemoryBudget: 20 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	time.Sleep(time.Second)
	if n := len(p.light.ready); n >= 8 {
		t.Errorf("%d idle children prepared within a 20 MiB budget", n)
	}
	// Runs still work: children are forked on demand.
	if r, err := engineWith(t, p).Run(ctx, engine.RunRequest{Code: "1"}); err != nil || r.Status != engine.StatusSuccess {
		t.Fatalf("%v %+v", err, r)
	}
}

func TestCloseLeavesNothing(t *testing.T) {
	e, p := newPooledEngine(t, 3, nil)
	waitFor(t, func() bool { return len(p.light.ready) == 3 })
	run(t, e, "print(1)")
	zns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", p.ready0HostPID(t)))
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	waitFor(t, func() bool {
		m, _ := filepath.Glob(fmt.Sprintf("/sys/fs/cgroup/*/pysandbox/pool-%d-*", os.Getpid()))
		m2, _ := filepath.Glob(fmt.Sprintf("/sys/fs/cgroup/*/*/*/pysandbox/pool-%d-*", os.Getpid()))
		return len(m)+len(m2) == 0 && !processesIn(zns)
	})
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 15s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func processesIn(pidNS string) bool { return len(pidsIn(pidNS)) > 0 }

// pidsIn lists the host pids of the processes in the pid namespace pidNS
// (zombies included).
func pidsIn(pidNS string) []string {
	var pids []string
	ents, _ := os.ReadDir("/proc")
	for _, d := range ents {
		if ns, err := os.Readlink("/proc/" + d.Name() + "/ns/pid"); err == nil && ns == pidNS {
			pids = append(pids, d.Name())
		}
	}
	return pids
}

// ready0HostPID returns the host pid of one idle child, leaving it idle.
func (p *Pool) ready0HostPID(t *testing.T) int {
	t.Helper()
	c := <-p.light.ready
	p.light.ready <- c
	return c.hostPID
}

// With pandas preloaded, a pandas run in a fresh sandbox finds it imported.
func TestPreloadPandas(t *testing.T) {
	e, p := newPooledEngine(t, 1, []string{"pandas"})
	if loaded, failed := p.Preload(); len(loaded) != 1 || len(failed) != 0 {
		t.Fatalf("pandas not preloaded (install python3-pandas): %v %v", loaded, failed)
	}
	r := run(t, e, "import sys\npre = 'pandas' in sys.modules\nimport pandas as pd\ndf = pd.DataFrame({'x': range(10)})\n{'pre': pre, 'sum': int(df.x.sum())}")
	if r.Status != engine.StatusSuccess || fmt.Sprint(r.ReturnValue) != "map[pre:true sum:45]" {
		t.Fatalf("%+v", r)
	}
}

// A zygote that dies is replaced, and the server keeps serving.
func TestZygoteDeathIsSurvived(t *testing.T) {
	e, p := newPooledEngine(t, 1, nil)
	p.light.mu.Lock()
	z := p.light.z
	p.light.mu.Unlock()
	z.sb.Kill()
	<-z.done
	for i := 0; i < 3; i++ {
		if r := run(t, e, "print('still here')"); r.Status != engine.StatusSuccess || r.Stdout != "still here\n" {
			t.Fatalf("run %d after the zygote died: %+v", i, r)
		}
	}
}
