package cgroup

import (
	"fmt"
	"time"
)

// Stats is a snapshot of a group's usage.
type Stats struct {
	// MemoryPeakBytes is the high-water mark: memory.memsw.max_usage_in_bytes
	// (or memory.max_usage_in_bytes without swap accounting) on v1,
	// memory.peak on v2 (kernel 5.19+; older kernels report at least the
	// current usage).
	MemoryPeakBytes    int64
	MemoryCurrentBytes int64
	// OOMKills counts processes the kernel OOM killer killed in the group.
	OOMKills int64
	// PidsCurrent counts tasks in the group; PidsMax is its limit, 0 when
	// unlimited.
	PidsCurrent, PidsMax int64
	// CPUUsage is user+system time used by the group, from cpuacct (v1) or
	// cpu.stat usage_usec (v2); 0 when that controller is not available.
	CPUUsage time.Duration
}

// Stats reads the group's current usage.
func (g *Group) Stats() (Stats, error) {
	if err := g.live(); err != nil {
		return Stats{}, err
	}
	var (
		st  Stats
		err error
	)
	if g.v2 != nil {
		st, err = g.v2.stats()
	} else {
		st, err = g.v1.stats()
	}
	if err != nil {
		return Stats{}, fmt.Errorf("cgroup: stats %s: %w", g.Path(), err)
	}
	st.OOMKills -= g.oomBase.Load()
	return st, nil
}

// Figures are what a run reports of itself when it ends: its peak
// memory, its CPU time and its OOM kills. Reading only these (three
// files on v1) rather than every counter matters: the pool reads them
// for every run.
type Figures struct {
	MemoryPeakBytes int64
	CPUUsage        time.Duration
	OOMKills        int64
}

// Figures reads the group's figures (see Stats for each one's source).
func (g *Group) Figures() (Figures, error) {
	if err := g.live(); err != nil {
		return Figures{}, err
	}
	var (
		f   Figures
		err error
	)
	if g.v2 != nil {
		f, err = g.v2.figures()
	} else {
		f, err = g.v1.figures()
	}
	if err != nil {
		return Figures{}, fmt.Errorf("cgroup: figures %s: %w", g.Path(), err)
	}
	f.OOMKills -= g.oomBase.Load()
	return f, nil
}

// MemoryCurrent reads the group's memory usage now (RAM and swap where
// swap is accounted), from one file.
func (g *Group) MemoryCurrent() (int64, error) {
	if err := g.live(); err != nil {
		return 0, err
	}
	var (
		n   int64
		err error
	)
	if g.v2 != nil {
		n, err = g.v2.memoryCurrent()
	} else {
		n, err = g.v1.memoryCurrent()
	}
	if err != nil {
		return 0, fmt.Errorf("cgroup: memory %s: %w", g.Path(), err)
	}
	return n, nil
}

// CPUUsage reads the group's CPU time so far, from one file; 0 without a
// CPU accounting controller.
func (g *Group) CPUUsage() (time.Duration, error) {
	if err := g.live(); err != nil {
		return 0, err
	}
	var (
		d   time.Duration
		err error
	)
	if g.v2 != nil {
		d, err = g.v2.cpuUsage()
	} else {
		d, err = g.v1.cpuUsage()
	}
	if err != nil {
		return 0, fmt.Errorf("cgroup: cpu %s: %w", g.Path(), err)
	}
	return d, nil
}

// OOMKilled reports whether the kernel OOM killer killed a process in this
// group (v1: memory.oom_control oom_kill > 0; v2: memory.events oom_kill >
// 0). On old v1 kernels without that counter it reports false; the caller
// may then treat memory.failcnt > 0 together with a SIGKILL as an OOM kill.
func (g *Group) OOMKilled() bool {
	if g.live() != nil {
		return false
	}
	if g.v2 != nil {
		return g.v2.oomKills() > 0
	}
	return g.v1.oomKills() > g.oomBase.Load()
}
