package cgroup

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// deadPid is the pid of a process that has exited and been reaped.
func deadPid(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

// TestReclaimStaleGroups: groups named after a server that is gone are
// removed, with the process still in one killed; groups of a live server
// (this one) stay.
func TestReclaimStaleGroups(t *testing.T) {
	requireV1(t)
	dead := deadPid(t)
	stale, err := New(fmt.Sprintf("sb-%d-1", dead), Limits{MemoryBytes: 64 << 20, Pids: 16})
	if err != nil {
		t.Fatal(err)
	}
	stale2, err := New(fmt.Sprintf("pool-%d-7", dead), Limits{Pids: 16})
	if err != nil {
		t.Fatal(err)
	}
	live := newGroup(t, Limits{Pids: 16}) // named after this process
	liveNamed, err := New(fmt.Sprintf("sb-%d-424242", os.Getpid()), Limits{Pids: 16})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { liveNamed.Delete() })
	// A process left in the stale group (as a SIGKILLed server can leave).
	sleeper := exec.Command("sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- sleeper.Wait() }()
	if err := stale.AddProc(sleeper.Process.Pid); err != nil {
		t.Fatal(err)
	}

	removed, err := Reclaim()
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []*Group{stale, stale2} {
		for _, d := range g.v1.dirs {
			if exists(d) {
				t.Errorf("stale %s is still there", d)
			}
			if !slices.Contains(removed, d) {
				t.Errorf("Reclaim did not report %s (removed %v)", d, removed)
			}
		}
	}
	for _, g := range []*Group{live, liveNamed} {
		for _, d := range g.v1.dirs {
			if !exists(d) {
				t.Errorf("a live server's %s was removed", d)
			}
		}
	}
	select {
	case <-waited:
	case <-time.After(15 * time.Second):
		sleeper.Process.Kill()
		t.Error("the process in the stale group was not killed")
	}
	// Reclaiming again finds nothing.
	if again, err := Reclaim(); err != nil || len(again) > 0 {
		t.Errorf("second Reclaim: %v %v", again, err)
	}
}

// TestReclaimLeavesOtherUsersGroups: a server that is not root removes
// only the stale groups it owns; root may remove any.
func TestReclaimLeavesOtherUsersGroups(t *testing.T) {
	dir := t.TempDir()
	mine := filepath.Join(dir, "mine")
	if err := os.Mkdir(mine, 0o755); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(mine, 999, 999); err != nil {
			t.Fatal(err)
		}
	}
	owner := 999
	if os.Geteuid() != 0 {
		owner = os.Geteuid()
	}
	if !ownedBy(mine, owner) || ownedBy(dir, owner) && os.Geteuid() == 0 || !ownedBy(dir, 0) {
		t.Errorf("ownedBy: own %v, another's %v, root %v", ownedBy(mine, owner), ownedBy(dir, owner), ownedBy(dir, 0))
	}
}
