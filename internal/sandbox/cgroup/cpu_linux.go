package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/cgroups/v3/cgroup1"
)

// cpuPeriod is the CFS period a quota is expressed in (the kernel's
// default, 100 ms).
const cpuPeriod = 100_000

// quota turns CPUMilli into microseconds per cpuPeriod.
func (l Limits) quota() int64 { return l.CPUMilli * cpuPeriod / 1000 }

// Idle CPU quota: 1 ms per second, a thousandth of a CPU. A session is
// held to it between runs. Freezing would stop it entirely, but a process
// frozen by the v1 freezer does not act on SIGKILL until thawed, so a
// server killed while its sessions are frozen would leave them behind,
// stopped, for ever; a throttled process still dies at once.
const (
	idleQuota  = 1_000
	idlePeriod = 1_000_000
)

// CanIdle reports whether the group can be held to the idle quota (it has
// the CPU controller).
func (g *Group) CanIdle() bool {
	if g.v2 != nil {
		return exists(filepath.Join(g.v2.dir, "cpu.max"))
	}
	return g.v1.dirs[cgroup1.Cpu] != ""
}

// SetIdle holds the group to the idle quota (true), or gives it back the
// quota it was made with (false).
func (g *Group) SetIdle(idle bool) error {
	if err := g.live(); err != nil {
		return err
	}
	quota, period := g.lim.quota(), int64(cpuPeriod)
	if idle {
		quota, period = idleQuota, idlePeriod
	}
	var err error
	if g.v2 != nil {
		v := "max"
		if quota > 0 {
			v = strconv.FormatInt(quota, 10)
		}
		err = os.WriteFile(filepath.Join(g.v2.dir, "cpu.max"), []byte(v+" "+strconv.FormatInt(period, 10)), 0)
	} else {
		d := g.v1.dirs[cgroup1.Cpu]
		if quota <= 0 {
			quota = -1
		}
		err = g.v1.f.write(filepath.Join(d, "cpu.cfs_period_us"), strconv.FormatInt(period, 10))
		if err == nil {
			err = g.v1.f.write(filepath.Join(d, "cpu.cfs_quota_us"), strconv.FormatInt(quota, 10))
		}
	}
	if err != nil {
		return fmt.Errorf("cgroup: %s: set idle=%v: %w", g.Path(), idle, err)
	}
	g.idle.Store(idle)
	return nil
}

// CPUQuota is the group's CPU quota as the kernel has it: microseconds
// per period (-1: none). It is what SetIdle and Reset leave behind.
func (g *Group) CPUQuota() (quota, period int64, err error) {
	if err := g.live(); err != nil {
		return 0, 0, err
	}
	if g.v2 != nil {
		b, err := os.ReadFile(filepath.Join(g.v2.dir, "cpu.max"))
		if err != nil {
			return 0, 0, err
		}
		q, p, ok := strings.Cut(strings.TrimSpace(string(b)), " ")
		if !ok {
			return 0, 0, fmt.Errorf("cgroup: cpu.max %q", b)
		}
		if period, err = strconv.ParseInt(p, 10, 64); err != nil {
			return 0, 0, err
		}
		if q == "max" {
			return -1, period, nil
		}
		quota, err = strconv.ParseInt(q, 10, 64)
		return quota, period, err
	}
	d := g.v1.dirs[cgroup1.Cpu]
	if d == "" {
		return 0, 0, errors.New("cgroup: no cpu controller")
	}
	if quota, err = readInt(filepath.Join(d, "cpu.cfs_quota_us")); err != nil {
		return 0, 0, err
	}
	period, err = readInt(filepath.Join(d, "cpu.cfs_period_us"))
	return quota, period, err
}

// SetWeight sets the group's share of contended CPUs (100 is a plain
// process's; v2 cpu.weight, v1 cpu.shares scaled the same way). A group
// without the CPU controller ignores it.
func (g *Group) SetWeight(w uint64) error {
	if err := g.live(); err != nil {
		return err
	}
	w = min(max(w, 1), 10000)
	var err error
	if g.v2 != nil {
		p := filepath.Join(g.v2.dir, "cpu.weight")
		if !exists(p) {
			return nil
		}
		err = os.WriteFile(p, []byte(strconv.FormatUint(w, 10)), 0)
	} else if d := g.v1.dirs[cgroup1.Cpu]; d != "" {
		err = g.v1.f.write(filepath.Join(d, "cpu.shares"), strconv.FormatUint(max(w*1024/100, 2), 10))
	}
	if err != nil {
		return fmt.Errorf("cgroup: %s: set weight %d: %w", g.Path(), w, err)
	}
	return nil
}
