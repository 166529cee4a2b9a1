package cgroup

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/containerd/cgroups/v3/cgroup1"
	"golang.org/x/sys/unix"
)

// TestKillWithoutFreezerV1 runs Kill's loop without the freezer, against a
// shell that keeps forking.
func TestKillWithoutFreezerV1(t *testing.T) {
	requireV1(t)
	g := newGroup(t, Limits{Pids: 64})
	cmd := startIn(t, g, io.Discard, io.Discard, "/bin/sh", "-c", `while :; do sleep 30 & sleep 0.01; done`)
	time.Sleep(200 * time.Millisecond)
	if err := g.v1.killLoop("", time.Now().Add(killTimeout)); err != nil {
		t.Fatalf("kill without freezer: %v", err)
	}
	_ = waitTimeout(t, cmd, 5*time.Second)
	if pids := g.v1.pids(); len(pids) != 0 {
		t.Errorf("pids left: %v", pids)
	}
}

// A process in a child group of a sandbox's group still counts: a group
// is reset for the next run only when nothing is left anywhere below it.
func TestResetSeesDescendantGroupsV1(t *testing.T) {
	requireV1(t)
	g := newGroup(t, Limits{Pids: 64})
	sub := filepath.Join(g.v1.dirs[cgroup1.Pids], "nested")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := startIn(t, g, io.Discard, io.Discard, "sleep", "30")
	if err := os.WriteFile(filepath.Join(sub, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if err := os.Remove(sub); err != nil {
			t.Errorf("remove %s: %v", sub, err)
		}
	})
	if pids := g.v1.pids(); !slices.Contains(pids, cmd.Process.Pid) {
		t.Errorf("pids %v miss %d in a child group", pids, cmd.Process.Pid)
	}
	if err := g.Reset(); err == nil {
		t.Error("Reset succeeded with a process in a child group")
	}
}

// A process in the group itself keeps Reset from reusing it. This is the
// case empty answers from the group's link count and its own cgroup.procs
// alone (no group below): TestResetSeesDescendantGroupsV1 is the other.
func TestResetSeesItsOwnProcessesV1(t *testing.T) {
	requireV1(t)
	g := newGroup(t, Limits{Pids: 64, MemoryBytes: 64 << 20})
	var st unix.Stat_t
	if err := unix.Stat(g.Path(), &st); err != nil || st.Nlink != 2 {
		t.Fatalf("stat %s: nlink %d, %v; want 2 for a directory without subdirectories", g.Path(), st.Nlink, err)
	}
	cmd := startIn(t, g, io.Discard, io.Discard, "sleep", "30")
	if err := g.Reset(); err == nil {
		t.Error("Reset succeeded with a process in the group")
	}
	cmd.Process.Kill()
	cmd.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for !g.v1.empty() {
		if time.Now().After(deadline) {
			t.Fatalf("the group is not empty 10s after its process was reaped: %v", g.v1.pids())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := g.Reset(); err != nil {
		t.Errorf("Reset of the emptied group: %v", err)
	}
}
