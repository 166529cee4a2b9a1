package cgroup

import (
	"bufio"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// unifiedHost returns a v2Host on this hybrid machine's controller-less
// cgroup2 mount: enough to test the v2 code for creation, clone3 into the
// group, cgroup.kill, cpu.stat and deletion, but not memory or pids limits.
func unifiedHost(t *testing.T) *v2Host {
	t.Helper()
	if !isCgroup2(unifiedMount) {
		t.Skipf("needs a cgroup2 mount at %s", unifiedMount)
	}
	if unix.Access(unifiedMount, unix.W_OK) != nil {
		t.Skipf("needs write access to %s", unifiedMount)
	}
	return &v2Host{mount: unifiedMount}
}

func TestV2OnUnifiedHierarchy(t *testing.T) {
	h := unifiedHost(t)
	v2, err := h.newGroup(testName(t), Limits{})
	if err != nil {
		t.Fatalf("newGroup: %v", err)
	}
	g := &Group{name: filepath.Base(v2.dir), v2: v2}
	t.Cleanup(func() { _ = g.Kill(); _ = g.Delete() })
	if !exists(filepath.Join(g.Path(), "cgroup.kill")) {
		t.Skip("kernel has no cgroup.kill")
	}

	fd, err := g.FD()
	if err != nil {
		t.Fatal(err)
	}
	// clone3(CLONE_INTO_CGROUP): the child starts inside the group.
	cmd := exec.Command("/bin/sh", "-c", `sleep 300 & echo $!; i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; wait`)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		unix.Close(fd)
		t.Fatalf("start with CLONE_INTO_CGROUP: %v", err)
	}
	unix.Close(fd)
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	grandchild, _ := strconv.Atoi(strings.TrimSpace(line))
	want := strings.TrimPrefix(g.Path(), unifiedMount)
	for _, pid := range []int{cmd.Process.Pid, grandchild} {
		if got := cgroupOf(t, pid, ""); got != want {
			t.Errorf("pid %d in unified group %q, want %q", pid, got, want)
		}
	}
	time.Sleep(100 * time.Millisecond)
	st, err := g.Stats()
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	t.Logf("Stats: %+v", st)
	if st.CPUUsage <= 0 {
		t.Errorf("CPUUsage = %v, want > 0 from cpu.stat", st.CPUUsage)
	}
	if c, err := g.CPUUsage(); err != nil || c < st.CPUUsage {
		t.Errorf("CPUUsage() = %v (%v), Stats %v", c, err, st.CPUUsage)
	}
	if f, err := g.Figures(); err != nil || f.CPUUsage < st.CPUUsage || f.OOMKills != 0 {
		t.Errorf("Figures = %+v (%v), Stats %+v", f, err, st)
	}
	if g.OOMKilled() {
		t.Error("OOMKilled without a memory controller")
	}
	if err := g.Kill(); err != nil {
		t.Fatalf("Kill (cgroup.kill): %v", err)
	}
	if sig := killedBy(waitTimeout(t, cmd, 5*time.Second)); sig != syscall.SIGKILL {
		t.Errorf("child ended by %v, want SIGKILL", sig)
	}
	for i := 0; !gone(grandchild); i++ {
		if i == 100 {
			t.Fatalf("grandchild %d survived Kill", grandchild)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := g.Delete(); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if exists(g.Path()) {
		t.Errorf("%s still exists after Delete", g.Path())
	}
	if err := g.Delete(); err != nil {
		t.Errorf("second Delete: %v", err)
	}
}

// TestV2KillLoop exercises the pre-5.14 Kill (freeze + SIGKILL) on v2.
func TestV2KillLoop(t *testing.T) {
	h := unifiedHost(t)
	v2, err := h.newGroup(testName(t), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	g := &Group{name: filepath.Base(v2.dir), v2: v2}
	t.Cleanup(func() { _ = g.Kill(); _ = g.Delete() })
	cmd := startIn(t, g, io.Discard, io.Discard, "/bin/sh", "-c", `while :; do sleep 30 & sleep 0.01; done`)
	time.Sleep(200 * time.Millisecond)
	if err := v2.killLoop(time.Now().Add(killTimeout)); err != nil {
		t.Fatalf("killLoop: %v", err)
	}
	_ = waitTimeout(t, cmd, 5*time.Second)
	if !v2.empty() {
		t.Error("group still populated")
	}
	if got := readTrim(t, filepath.Join(v2.dir, "cgroup.freeze")); got != "0" {
		t.Errorf("cgroup.freeze = %s after kill, want 0 (thawed)", got)
	}
	if err := g.Delete(); err != nil {
		t.Fatal(err)
	}
}

// TestV2NotDelegated: the unified mount here has no controllers, which is
// what an undelegated v2 group looks like.
func TestV2NotDelegated(t *testing.T) {
	h := unifiedHost(t)
	if _, err := h.newGroup(testName(t), Limits{MemoryBytes: 64 << 20, Pids: 8}); err == nil || !errors.Is(err, errNotDelegated) {
		t.Errorf("newGroup with limits and no controllers = %v, want a not-delegated error", err)
	}
	info := h.detect()
	t.Logf("detect: %+v", info)
	if info.Mode != ModeV2 || info.Memory || info.Pids || !strings.Contains(info.Reason, "Delegate=yes") {
		t.Errorf("detect = %+v, want v2 without memory/pids and advice about Delegate=yes", info)
	}
}

// TestV2MoveToLeaf checks the "no internal processes" step: every process
// of our (here: a stand-in) own group moves into <own>/pysandbox-server.
func TestV2MoveToLeaf(t *testing.T) {
	h := unifiedHost(t)
	own := "/" + testName(t)
	ownDir := filepath.Join(unifiedMount, own)
	if err := os.Mkdir(ownDir, 0o755); err != nil {
		t.Fatal(err)
	}
	leaf := filepath.Join(ownDir, serverLeaf)
	cmd := exec.Command("/bin/sleep", "300")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = os.Remove(leaf)
		_ = os.Remove(ownDir)
		if exists(ownDir) {
			t.Errorf("could not remove %s", ownDir)
		}
	})
	if err := os.WriteFile(filepath.Join(ownDir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}

	h.selfGroup = func() (string, error) { return own + "/" + serverLeaf, nil }
	h.mu.Lock()
	got, err := h.ownGroup()
	h.mu.Unlock()
	if err != nil || got != own {
		t.Fatalf("ownGroup from inside the leaf = %q, %v; want %q", got, err, own)
	}
	if err := h.moveToLeaf(ownDir); err != nil {
		t.Fatalf("moveToLeaf: %v", err)
	}
	if p := readTrim(t, filepath.Join(ownDir, "cgroup.procs")); p != "" {
		t.Errorf("own group still holds %q", p)
	}
	if p := cgroupOf(t, cmd.Process.Pid, ""); p != own+"/"+serverLeaf {
		t.Errorf("process in %q, want %q", p, own+"/"+serverLeaf)
	}
	// Put it back so the directories can go.
	if err := os.WriteFile(filepath.Join(unifiedMount, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
}
