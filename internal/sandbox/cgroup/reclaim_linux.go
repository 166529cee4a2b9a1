package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// staleName matches the groups a server makes: sb-PID-N (a sandbox),
// pool-PID-N (a warm-pool child), pysandbox-probe-PID-N (Detect).
var staleName = regexp.MustCompile(`^(?:sb|pool|pysandbox-probe)-([0-9]+)-[0-9]+$`)

// Reclaim removes the groups that servers which are gone left behind: a
// server killed with SIGKILL, or by the OOM killer, cannot delete its
// groups, and nothing else would. A group is stale when the pid in its name
// is not running, or is running but started after the group was made (the
// pid was reused). Groups of live servers, this one included, are left
// alone, so Reclaim is safe while other servers run beside it. Processes
// still in a stale group are killed first. It returns the groups removed.
func Reclaim() (removed []string, err error) {
	var dirs []string
	switch hostMode() {
	case ModeV1:
		subs, err := v1Subsystems()
		if err != nil {
			return nil, err
		}
		ds, _, err := v1Dirs(subs, baseName)
		if err != nil {
			return nil, err
		}
		for _, d := range ds {
			dirs = append(dirs, d)
		}
	case ModeV2:
		own, err := defaultV2.ownGroup()
		if err != nil {
			return nil, err
		}
		dirs = append(dirs, filepath.Join(defaultV2.mount, own, baseName))
	default:
		return nil, nil
	}
	var errs []error
	for _, parent := range dirs {
		ents, err := os.ReadDir(parent)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
			continue
		}
		for _, e := range ents {
			m := staleName.FindStringSubmatch(e.Name())
			if m == nil || !e.IsDir() {
				continue
			}
			dir := filepath.Join(parent, e.Name())
			pid, _ := strconv.Atoi(m[1])
			if !stale(dir, pid) {
				continue
			}
			if err := removeStale(dir); err != nil {
				errs = append(errs, err)
				continue
			}
			removed = append(removed, dir)
		}
	}
	return removed, errors.Join(errs...)
}

// stale reports whether the server that made dir (pid) is gone.
func stale(dir string, pid int) bool {
	if pid == os.Getpid() {
		return false
	}
	start, ok := processStart(pid)
	if !ok {
		return true // no such process
	}
	var st unix.Stat_t
	if unix.Stat(dir, &st) != nil {
		return false
	}
	made := time.Unix(st.Ctim.Sec, st.Ctim.Nsec)
	// A process that started after the group existed cannot have made it.
	return start.After(made.Add(time.Second))
}

// processStart is when pid started, from /proc/PID/stat and the boot time.
func processStart(pid int) (time.Time, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return time.Time{}, false
	}
	// Fields after the command (which may hold spaces and parentheses).
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return time.Time{}, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return time.Time{}, false
	}
	ticks, err := strconv.ParseInt(f[19], 10, 64) // starttime, field 22
	if err != nil {
		return time.Time{}, false
	}
	var info unix.Sysinfo_t
	if unix.Sysinfo(&info) != nil {
		return time.Time{}, false
	}
	boot := time.Now().Add(-time.Duration(info.Uptime) * time.Second)
	return boot.Add(time.Duration(ticks) * time.Second / 100), true // USER_HZ is 100 on Linux
}

// removeStale kills what is left in dir (thawing it first) and removes it.
func removeStale(dir string) error {
	if exists(filepath.Join(dir, "freezer.state")) {
		os.WriteFile(filepath.Join(dir, "freezer.state"), []byte("THAWED"), 0)
	}
	if exists(filepath.Join(dir, "cgroup.freeze")) {
		os.WriteFile(filepath.Join(dir, "cgroup.freeze"), []byte("0"), 0)
	}
	deadline := time.Now().Add(deleteTimeout)
	for i := 0; ; i++ {
		// Children first (a v2 group may hold nested ones).
		if sub, _ := os.ReadDir(dir); len(sub) > 0 {
			for _, e := range sub {
				if e.IsDir() {
					removeStale(filepath.Join(dir, e.Name()))
				}
			}
		}
		pids, _ := readPids(filepath.Join(dir, "cgroup.procs"))
		killPids(pids)
		err := os.Remove(dir)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if time.Now().After(deadline) || !errors.Is(err, syscall.EBUSY) {
			return fmt.Errorf("cgroup: remove stale %s: %w", dir, err)
		}
		sleepStep(i)
	}
}
