package cgroup

import (
	"github.com/pysandbox/pysandbox/internal/testutil"

	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/cgroups/v3/cgroup1"
	"golang.org/x/sys/unix"
)

const unifiedMount = "/sys/fs/cgroup/unified"

var nameSeq atomic.Int64

// testPrefix starts every group name this test binary creates, so the
// leftover check can tell our groups from those of other processes.
func testPrefix() string { return fmt.Sprintf("pst%d-", os.Getpid()) }

func testName(t *testing.T) string {
	n := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	return fmt.Sprintf("%s%s-%d", testPrefix(), n, nameSeq.Add(1))
}

func TestMain(m *testing.M) {
	code := m.Run()
	if left := leftovers(); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: cgroups left behind by this test run:\n  %s\n", strings.Join(left, "\n  "))
		code = 1
	}
	os.Exit(code)
}

// leftovers lists groups created by this test binary (or by its Detect
// probes) that still exist, after trying to remove the shared parents if
// they are now empty (ignoring failure: other processes may use them).
func leftovers() []string {
	var parents []string
	if hostMode() == ModeV1 {
		if subs, err := v1Subsystems(); err == nil {
			if dirs, _, err := v1Dirs(subs, baseName); err == nil {
				for _, d := range dirs {
					parents = append(parents, d)
				}
			}
		}
	}
	if isCgroup2(unifiedMount) {
		parents = append(parents, filepath.Join(unifiedMount, baseName), unifiedMount)
	}
	prefixes := []string{testPrefix(), fmt.Sprintf("%s%d-", probePfx, os.Getpid())}
	var left []string
	for _, p := range parents {
		ents, err := os.ReadDir(p)
		if err != nil {
			continue
		}
		for _, e := range ents {
			for _, pfx := range prefixes {
				if e.IsDir() && strings.HasPrefix(e.Name(), pfx) {
					left = append(left, filepath.Join(p, e.Name()))
				}
			}
		}
		if filepath.Base(p) == baseName {
			_ = os.Remove(p) // only succeeds when empty
		}
	}
	return left
}

func isCgroup2(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}

// requireV1 skips unless this machine has v1 cgroups we may write to.
func requireV1(t *testing.T) Info {
	t.Helper()
	if hostMode() != ModeV1 {
		t.Skipf("needs a cgroup v1 (legacy or hybrid) host; this one is %q", hostMode())
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to create cgroup v1 groups")
	}
	info := Detect()
	if !info.Memory || !info.Pids {
		t.Skipf("cgroup v1 memory/pids limits unavailable: %s", info.Reason)
	}
	return info
}

// newGroup creates a group and registers its cleanup.
func newGroup(t *testing.T, lim Limits) *Group {
	t.Helper()
	g, err := New(testName(t), lim)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		_ = g.Kill()
		if err := g.Delete(); err != nil {
			t.Errorf("cleanup Delete: %v", err)
		}
	})
	return g
}

// startIn starts args under /bin/sh, moves the shell into g with AddProc
// and only then lets it exec args, so nothing runs outside the group.
func startIn(t *testing.T, g *Group, stdout, stderr io.Writer, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("/bin/sh", append([]string{"-c", `read _ && exec "$@"`, "sh"}, args...)...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if err := g.AddProc(cmd.Process.Pid); err != nil {
		t.Fatalf("AddProc: %v", err)
	}
	if _, err := in.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	_ = in.Close()
	return cmd
}

// waitTimeout waits for cmd, failing the test after d.
func waitTimeout(t *testing.T, cmd *exec.Cmd, d time.Duration) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("%v did not exit within %v", cmd.Args, d)
		return nil
	}
}

func killedBy(err error) syscall.Signal {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return ws.Signal()
		}
	}
	return 0
}

// gone reports whether pid has exited (no such process, or a zombie
// waiting for a parent that is not us to reap it).
func gone(pid int) bool {
	st, ok := testutil.ReadProcStat(pid)
	return !ok || st.Dead()
}

func readTrim(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// cgroupOf returns pid's group in the hierarchy whose /proc/pid/cgroup
// controller field is ctrl ("" for the unified one).
func cgroupOf(t *testing.T, pid int, ctrl string) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(l, ":", 3)
		if len(parts) == 3 && slices.Contains(strings.Split(parts[1], ","), ctrl) {
			return parts[2]
		}
	}
	t.Fatalf("pid %d has no %q line in /proc/%d/cgroup:\n%s", pid, ctrl, pid, b)
	return ""
}

func TestDetectV1(t *testing.T) {
	if hostMode() != ModeV1 {
		t.Skipf("needs a cgroup v1 (legacy or hybrid) host; this one is %q", hostMode())
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to create cgroup v1 groups")
	}
	info := Detect()
	t.Logf("Detect: %+v", info)
	if info.Mode != ModeV1 || !info.Memory || !info.Pids || info.Reason != "" {
		t.Fatalf("Detect = %+v, want v1 with memory and pids and no reason", info)
	}
	if !strings.Contains(info.Parent, "memory=/sys/fs/cgroup/memory/") || !strings.Contains(info.Parent, "pids=/sys/fs/cgroup/pids/") {
		t.Errorf("Parent = %q, want memory= and pids= directories", info.Parent)
	}
}

func TestGroupLifecycleV1(t *testing.T) {
	requireV1(t)
	const mem, pids = 128 << 20, 32
	g := newGroup(t, Limits{MemoryBytes: mem, Pids: pids})

	dirs := g.v1.dirs
	for _, n := range []cgroup1.Name{cgroup1.Memory, cgroup1.Pids} {
		if dirs[n] == "" || !exists(dirs[n]) {
			t.Fatalf("no %s directory: %v", n, dirs)
		}
	}
	if g.Path() != dirs[cgroup1.Memory] || filepath.Base(g.Path()) != g.name || filepath.Base(filepath.Dir(g.Path())) != baseName {
		t.Errorf("Path = %q, want <own memory group>/%s/%s", g.Path(), baseName, g.name)
	}
	md := dirs[cgroup1.Memory]
	if got := readTrim(t, filepath.Join(md, "memory.limit_in_bytes")); got != strconv.Itoa(mem) {
		t.Errorf("memory.limit_in_bytes = %s, want %d", got, mem)
	}
	if g.v1.memsw {
		if got := readTrim(t, filepath.Join(md, "memory.memsw.limit_in_bytes")); got != strconv.Itoa(mem) {
			t.Errorf("memory.memsw.limit_in_bytes = %s, want %d", got, mem)
		}
	}
	if got := readTrim(t, filepath.Join(dirs[cgroup1.Pids], "pids.max")); got != strconv.Itoa(pids) {
		t.Errorf("pids.max = %s, want %d", got, pids)
	}
	if _, err := g.FD(); err == nil || !strings.Contains(err.Error(), "v2") {
		t.Errorf("FD on v1 = %v, want an error saying it is v2 only", err)
	}

	// A shell that forks a grandchild and reports its pid.
	pr, pw := io.Pipe()
	cmd := startIn(t, g, pw, os.Stderr, "/bin/sh", "-c", `sleep 300 & echo $!; wait`)
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	grandchild, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("grandchild pid %q: %v", line, err)
	}
	for _, pid := range []int{cmd.Process.Pid, grandchild} {
		for ctrl, dir := range map[string]string{"memory": md, "pids": dirs[cgroup1.Pids]} {
			if got := cgroupOf(t, pid, ctrl); !strings.HasSuffix(dir, got) || !strings.HasSuffix(got, "/"+baseName+"/"+g.name) {
				t.Errorf("pid %d is in %s group %q, want the one of %s", pid, ctrl, got, dir)
			}
		}
	}

	// Burn a little CPU inside the group so cpuacct has something to show.
	burn := exec.Command("/bin/sh", "-c", `read _; i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done`)
	burn.Stdin = strings.NewReader("go\n")
	if err := burn.Start(); err != nil {
		t.Fatal(err)
	}
	if err := g.AddProc(burn.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if err := burn.Wait(); err != nil {
		t.Fatal(err)
	}

	st, err := g.Stats()
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	t.Logf("Stats: %+v", st)
	if st.PidsCurrent != 2 || st.PidsMax != pids {
		t.Errorf("pids current/max = %d/%d, want 2/%d", st.PidsCurrent, st.PidsMax, pids)
	}
	if st.MemoryCurrentBytes <= 0 || st.MemoryPeakBytes < st.MemoryCurrentBytes || st.MemoryPeakBytes > mem {
		t.Errorf("memory current/peak = %d/%d, want 0 < current <= peak <= %d", st.MemoryCurrentBytes, st.MemoryPeakBytes, mem)
	}
	if _, ok := dirs[cgroup1.Cpuacct]; ok && st.CPUUsage <= 0 {
		t.Errorf("CPUUsage = %v, want > 0 (cpuacct is mounted)", st.CPUUsage)
	}
	if st.OOMKills != 0 || g.OOMKilled() {
		t.Errorf("OOM kills = %d / OOMKilled = %v, want none", st.OOMKills, g.OOMKilled())
	}

	start := time.Now()
	if err := g.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	t.Logf("Kill took %v", time.Since(start))
	if sig := killedBy(waitTimeout(t, cmd, 5*time.Second)); sig != syscall.SIGKILL {
		t.Errorf("child ended by signal %v, want SIGKILL", sig)
	}
	for i := 0; !gone(grandchild); i++ {
		if i == 100 {
			t.Fatalf("grandchild %d survived Kill", grandchild)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, d := range dirs {
		if got := readTrim(t, filepath.Join(d, "cgroup.procs")); got != "" {
			t.Errorf("%s/cgroup.procs after Kill = %q, want empty", d, got)
		}
	}
	if err := g.Kill(); err != nil {
		t.Errorf("Kill on an empty group: %v", err)
	}

	if err := g.Delete(); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	for n, d := range dirs {
		if exists(d) {
			t.Errorf("%s directory %s still exists after Delete", n, d)
		}
	}
	if err := g.Delete(); err != nil {
		t.Errorf("second Delete: %v", err)
	}
	if _, err := g.Stats(); err == nil {
		t.Error("Stats after Delete succeeded, want an error")
	}
	if err := g.AddProc(os.Getpid()); err == nil {
		t.Error("AddProc after Delete succeeded, want an error")
	}
}

// uncachedFile writes a file of size bytes and drops it from the page
// cache, so that reading it charges the reader's group.
func uncachedFile(t *testing.T, size int) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "cached")
	if err := os.WriteFile(file, bytes.Repeat([]byte{'x'}, size), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	f.Sync()
	unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
	f.Close()
	return file
}

// TestResetForgetsPageCacheV1: the page cache a run read stays charged to
// its v1 group after its processes are gone; Reset reclaims it, so the
// next run in the group neither starts its peak there nor pays for its
// reclaim (an attack read 500 MB and the next run, a print, reported a
// 517 MB peak).
func TestResetForgetsPageCacheV1(t *testing.T) {
	requireV1(t)
	const size = 64 << 20
	file := uncachedFile(t, size)
	g := newGroup(t, Limits{MemoryBytes: 512 << 20, Pids: 64})
	cmd := startIn(t, g, io.Discard, io.Discard, "cat", file)
	if err := waitTimeout(t, cmd, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	if m, err := g.MemoryCurrent(); err != nil || m < size/2 {
		t.Skipf("the read left %d bytes charged (%v): this kernel uncharges page cache at exit, nothing to reset", m, err)
	}
	if err := g.Reset(); err != nil {
		t.Fatal(err)
	}
	m, err := g.MemoryCurrent()
	fig, ferr := g.Figures()
	if err != nil || ferr != nil || m > maxResidue || fig.MemoryPeakBytes > maxResidue {
		t.Errorf("after Reset: %d bytes charged (%v), figures %+v (%v)", m, err, fig, ferr)
	}
	g.Kill()
}

func TestPidsLimitV1(t *testing.T) {
	requireV1(t)
	const limit = 8
	g := newGroup(t, Limits{Pids: limit})
	var stderr testutil.SyncBuffer
	cmd := startIn(t, g, io.Discard, &stderr, "/bin/sh", "-c",
		`i=0; while [ $i -lt 20 ]; do sleep 30 & i=$((i+1)); done; echo done >&2; wait`)

	var peak int64
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		st, err := g.Stats()
		if err != nil {
			t.Fatal(err)
		}
		if st.PidsMax != limit {
			t.Fatalf("PidsMax = %d, want %d", st.PidsMax, limit)
		}
		peak = max(peak, st.PidsCurrent)
		if strings.Contains(strings.ToLower(stderr.String()), "fork") && st.PidsCurrent == limit {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("peak pids %d; shell stderr: %q", peak, stderr.String())
	if peak > limit {
		t.Errorf("pids.current reached %d, above the limit %d", peak, limit)
	}
	if !strings.Contains(strings.ToLower(stderr.String()), "fork") {
		t.Errorf("no fork failure reported by the shell; stderr %q", stderr.String())
	}
	events, _, err := readKey(filepath.Join(g.v1.dirs[cgroup1.Pids], "pids.events"), "max")
	if err == nil && events < 1 {
		t.Errorf("pids.events max = %d, want >= 1 refused fork", events)
	}
	if err := g.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = waitTimeout(t, cmd, 5*time.Second)
	if p := readTrim(t, filepath.Join(g.v1.dirs[cgroup1.Pids], "cgroup.procs")); p != "" {
		t.Errorf("cgroup.procs after Kill = %q, want empty", p)
	}
	// pids.current drops only once the killed sleeps, orphaned to init,
	// have been reaped.
	for i := 0; ; i++ {
		st, err := g.Stats()
		if err != nil {
			t.Fatal(err)
		}
		if st.PidsCurrent == 0 {
			break
		}
		if i == 200 {
			t.Fatalf("pids.current still %d 2s after Kill", st.PidsCurrent)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestNewRejectsBadNames(t *testing.T) {
	for _, name := range []string{"", ".", "..", "a/b", "/abs", "../escape", "a..b", "x\ny", serverLeaf, probePfx + "1-1", strings.Repeat("x", 201)} {
		if g, err := New(name, Limits{}); err == nil {
			_ = g.Delete()
			t.Errorf("New(%q) succeeded, want an error", name)
		} else if !strings.HasPrefix(err.Error(), "cgroup: invalid group name") {
			t.Errorf("New(%q) = %v, want an invalid-name error", name, err)
		}
	}
	if _, err := New("ok", Limits{MemoryBytes: -1}); err == nil {
		t.Error("New with a negative limit succeeded")
	}
}

func TestNewRefusesExistingV1(t *testing.T) {
	requireV1(t)
	g := newGroup(t, Limits{Pids: 4})
	if g2, err := New(g.name, Limits{Pids: 4}); err == nil {
		_ = g2.Delete()
		t.Fatal("second New with the same name succeeded")
	} else if !errors.Is(err, os.ErrExist) {
		t.Errorf("second New = %v, want ErrExist", err)
	}
	if !exists(g.Path()) {
		t.Error("the failed New removed the existing group")
	}
}

// TestKeptFilesV1 uses a group the way the pool does, many times over
// (join, figures, reset), and checks that the files it keeps open are
// closed with the group: a server must not leak descriptors over runs.
func TestKeptFilesV1(t *testing.T) {
	requireV1(t)
	fds := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	before := fds()
	g, err := New(fmt.Sprintf("kept-%d", os.Getpid()), Limits{MemoryBytes: 64 << 20, Pids: 16, CPUMilli: 500})
	if err != nil {
		t.Fatal(err)
	}
	// The first use leaves page cache charged, so that its reset opens
	// every file a group keeps (memory.force_empty only when needed):
	// later uses, which may need it or not, open nothing more.
	file := uncachedFile(t, 8<<20)
	var afterOne int
	for i := range 20 {
		if i == 1 {
			afterOne = fds()
		}
		argv := []string{"/bin/true"}
		if i == 0 {
			argv = []string{"cat", file}
		}
		cmd := startIn(t, g, io.Discard, io.Discard, argv...)
		cmd.Wait()
		if _, err := g.Stats(); err != nil {
			t.Fatal(err)
		}
		g.OOMKilled()
		if err := g.SetIdle(true); err != nil && g.CanIdle() {
			t.Fatal(err)
		}
		if err := g.Reset(); err != nil {
			t.Fatal(err)
		}
	}
	if now := fds(); now != afterOne {
		t.Errorf("%d descriptors after one use of the group, %d after 20: files are not reused", afterOne, now)
	}
	if err := g.Delete(); err != nil {
		t.Fatal(err)
	}
	if after := fds(); after != before {
		t.Errorf("%d descriptors before the group, %d after deleting it", before, after)
	}
}
