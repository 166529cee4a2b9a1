package cgroup

import (
	"fmt"
	"io"
	"os"
	"testing"
	"time"
)

// A group's CPU counts in BaseUsage while it lives and after it is gone:
// bench's untraced CPU per run rests on it.
func TestBaseUsageKeepsDeletedGroupsV1(t *testing.T) {
	requireV1(t)
	// A name as the servers' own (see Reclaim), so that it counts as ours.
	g, err := New(fmt.Sprintf("sb-%d-%d", os.Getpid(), 1<<30+nameSeq.Add(1)), Limits{Pids: 16})
	if err != nil {
		t.Fatal(err)
	}
	u0, ok := BaseUsage()
	if !ok {
		_ = g.Delete()
		t.Skip("no v1 cpuacct hierarchy: BaseUsage has no counter to read")
	}
	if u0.Ours < 1 {
		t.Errorf("BaseUsage counts %d groups of this process with one made", u0.Ours)
	}
	// A fixed amount of work, not of time: the test holds on a slow machine.
	cmd := startIn(t, g, io.Discard, io.Discard, "/bin/sh", "-c", "i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done")
	_ = waitTimeout(t, cmd, 2*time.Minute)
	used, err := g.CPUUsage()
	if err != nil || used <= 0 {
		t.Fatalf("the group's own CPU: %v, %v", used, err)
	}
	if err := g.Delete(); err != nil {
		t.Fatal(err)
	}
	u1, ok := BaseUsage()
	if !ok {
		t.Fatal("BaseUsage could read its counter before the group, not after")
	}
	// Other tests' groups may add to it meanwhile, never take from it.
	if u1.CPU-u0.CPU < used {
		t.Errorf("BaseUsage grew by %v, less than the deleted group's own %v", u1.CPU-u0.CPU, used)
	}
	t.Logf("the group used %v; BaseUsage grew by %v", used, u1.CPU-u0.CPU)
}
