package cgroup

import (
	"path/filepath"
	"runtime"
	"strconv"
	"testing"

	"github.com/containerd/cgroups/v3/cgroup1"
)

// TestWeightV1 checks SetWeight's cpu.shares, and the weight of the parent
// every sandbox is below: one process's per CPU.
func TestWeightV1(t *testing.T) {
	requireV1(t)
	g := newGroup(t, Limits{MemoryBytes: 64 << 20, CPUMilli: 1000})
	d := g.v1.dirs[cgroup1.Cpu]
	if d == "" {
		t.Skip("no v1 cpu hierarchy on this machine")
	}
	for w, shares := range map[uint64]string{1: "10", 100: "1024", 800: "8192"} {
		if err := g.SetWeight(w); err != nil {
			t.Fatal(err)
		}
		if got := readTrim(t, filepath.Join(d, "cpu.shares")); got != shares {
			t.Errorf("SetWeight(%d): cpu.shares %s, want %s", w, got, shares)
		}
	}
	if got, want := readTrim(t, filepath.Join(filepath.Dir(d), "cpu.shares")), strconv.Itoa(1024*runtime.NumCPU()); got != want {
		t.Errorf("parent cpu.shares %s, want %s", got, want)
	}
}

// TestCPUQuota: the quota reads back as SetIdle and Reset leave it.
func TestCPUQuota(t *testing.T) {
	g := newGroup(t, Limits{MemoryBytes: 64 << 20, CPUMilli: 500})
	if !g.CanIdle() {
		t.Skip("no cpu controller for the group on this machine")
	}
	check := func(what string, quota, period int64) {
		t.Helper()
		q, p, err := g.CPUQuota()
		if err != nil || q != quota || p != period {
			t.Errorf("%s: quota %d period %d (%v), want %d %d", what, q, p, err, quota, period)
		}
	}
	check("made", 50_000, cpuPeriod)
	if err := g.SetIdle(true); err != nil {
		t.Fatal(err)
	}
	check("idle", idleQuota, idlePeriod)
	if g.v2 == nil {
		if err := g.Reset(); err != nil {
			t.Fatal(err)
		}
		check("reset", 50_000, cpuPeriod)
	}
}
