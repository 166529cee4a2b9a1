package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
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
// is not running. Groups of live servers, this one included, are left
// alone, so Reclaim is safe while other servers run beside it. Processes
// still in a stale group are killed first. It returns the groups removed.
func Reclaim() (removed []string, err error) {
	var dirs []string
	switch hostMode() {
	case ModeV1:
		ds, err := v1BaseDirs()
		if err != nil {
			return nil, err
		}
		for _, d := range ds {
			dirs = append(dirs, d)
		}
	case ModeV2:
		d, err := defaultV2.baseDir()
		if err != nil {
			return nil, err
		}
		dirs = append(dirs, d)
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
			if !stale(pid) || !ours(dir) {
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

// ours reports whether this process may remove the group at dir: root
// may remove any; another user may remove only the groups it owns. A
// normal user's `check` tried to remove root servers' leftovers and
// warned of two dozen permission errors about groups that were never its
// own.
func ours(dir string) bool { return ownedBy(dir, os.Geteuid()) }

func ownedBy(dir string, euid int) bool {
	if euid == 0 {
		return true
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return false
	}
	return int(st.Uid) == euid
}

// stale reports whether the server that made a group (pid) is gone. A
// running pid is never stale, even if it may be a reused one: comparing
// start times would trust the wall clock, and a clock stepped forward
// would make a live server's groups look stale, and kill its sandboxes.
// A group behind a reused pid waits for that process to end.
func stale(pid int) bool {
	if pid == os.Getpid() {
		return false
	}
	err := unix.Kill(pid, 0)
	return errors.Is(err, unix.ESRCH)
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
