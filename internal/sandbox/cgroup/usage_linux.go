package cgroup

import (
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/containerd/cgroups/v3/cgroup1"
)

// v1BaseDirs is the base (pysandbox, below our own group) in each mounted
// v1 hierarchy.
func v1BaseDirs() (map[cgroup1.Name]string, error) {
	subs, err := v1Subsystems()
	if err != nil {
		return nil, err
	}
	ds, _, err := v1Dirs(subs, baseName)
	return ds, err
}

// baseDir is the v2 base: <own>/pysandbox.
func (h *v2Host) baseDir() (string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	own, err := h.ownGroup()
	if err != nil {
		return "", err
	}
	return filepath.Join(h.mount, own, baseName), nil
}

// Usage is what BaseUsage reads.
type Usage struct {
	// CPU used so far by every group below the base.
	CPU time.Duration
	// Ours and Others count the groups there now of this server and of
	// other ones (by the pid in their names, as Reclaim reads them).
	Ours, Others int
}

// BaseUsage is the CPU time used so far by every group made below the
// base (pysandbox in each v1 hierarchy, <own>/pysandbox on v2), those
// already deleted included: the kernel charges a group's ancestors as it
// charges the group, so this sums every sandbox, warm-pool zygote and
// child of a server without tracing any of them (when they are in groups
// at all: see Ours). It includes other servers' groups too (Others). ok is
// false where there is no such counter (v1 without the cpuacct hierarchy).
func BaseUsage() (u Usage, ok bool) {
	var dir string
	switch hostMode() {
	case ModeV1:
		ds, err := v1BaseDirs()
		if err != nil || ds[cgroup1.Cpuacct] == "" {
			return Usage{}, false
		}
		dir = ds[cgroup1.Cpuacct]
		ns, err := readInt(filepath.Join(dir, "cpuacct.usage"))
		if err != nil {
			return Usage{}, false
		}
		u.CPU = time.Duration(ns)
	case ModeV2:
		d, err := defaultV2.baseDir()
		if err != nil {
			return Usage{}, false
		}
		dir = d
		us, found, err := readKey(filepath.Join(dir, "cpu.stat"), "usage_usec")
		if err != nil || !found {
			return Usage{}, false
		}
		u.CPU = time.Duration(us) * time.Microsecond
	default:
		return Usage{}, false
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if m := staleName.FindStringSubmatch(e.Name()); m != nil && e.IsDir() {
			if pid, _ := strconv.Atoi(m[1]); pid == os.Getpid() {
				u.Ours++
			} else {
				u.Others++
			}
		}
	}
	return u, true
}
