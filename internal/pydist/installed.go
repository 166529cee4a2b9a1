package pydist

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/pysandbox/pysandbox/internal/deps"
	"github.com/pysandbox/pysandbox/internal/interp"
)

// Installed lists the managed interpreters in the cache, newest first.
func (m *Manager) Installed() []Installed {
	envs, err := m.cfg.Cache.List()
	if err != nil {
		m.log.Warn("pydist: list the cache", "err", err)
		return nil
	}
	var out []Installed
	for _, e := range envs {
		if e.Kind != deps.KindPython {
			continue
		}
		it, ok := interpreterOf(&e)
		if !ok {
			continue
		}
		out = append(out, Installed{Interpreter: it, Key: e.Key, SizeBytes: e.SizeBytes, Source: e.Source, SHA256: e.SHA256, LastUsed: e.LastUsed})
	}
	sortInstalled(out)
	return out
}

// Installed is a managed interpreter in the cache.
type Installed struct {
	*interp.Interpreter
	Key       string
	SizeBytes int64
	Source    string // the URL it came from
	SHA256    string
	LastUsed  time.Time
}

func sortInstalled(l []Installed) {
	for i := 1; i < len(l); i++ {
		for j := i; j > 0 && versionLess(l[j-1].Version, l[j].Version); j-- {
			l[j-1], l[j] = l[j], l[j-1]
		}
	}
}

func versionLess(a, b string) bool {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(pa) && i < len(pb); i++ {
		x, _ := strconv.Atoi(strings.TrimRightFunc(pa[i], notDigit))
		y, _ := strconv.Atoi(strings.TrimRightFunc(pb[i], notDigit))
		if x != y {
			return x < y
		}
	}
	return len(pa) < len(pb)
}

func notDigit(r rune) bool { return r < '0' || r > '9' }

// interpreterOf is the interpreter of a cache entry.
func interpreterOf(e *deps.Env) (*interp.Interpreter, bool) {
	var major, minor, patch int
	// "3.13.1", or "3.15.0rc1" for a prerelease (its version as the
	// metadata named it, which the policy is asked about).
	if n, _ := fmt.Sscanf(e.Python, "%d.%d.%d", &major, &minor, &patch); n != 3 {
		return nil, false
	}
	bin := filepath.Join(e.Site, "bin", fmt.Sprintf("python%d.%d", major, minor))
	if fi, err := os.Lstat(bin); err != nil || !fi.Mode().IsRegular() {
		// Unpack checked it was a file or a link inside the tree.
		real, err := filepath.EvalSymlinks(bin)
		if err != nil || !strings.HasPrefix(real, e.Site+"/") {
			return nil, false
		}
		bin = real
	}
	return &interp.Interpreter{
		Path: bin, Version: e.Python, Major: major, Minor: minor, Prefix: e.Site,
		Supported: major == interp.MinVersion[0] && minor >= interp.MinVersion[1], Source: SourceManaged,
	}, true
}

// Remove deletes the installed interpreters of a version ("3.13" or
// "3.13.1") and returns what it removed.
func (m *Manager) Remove(version string, who Who) ([]Installed, error) {
	var removed []Installed
	found := false
	for _, in := range m.Installed() {
		if in.MajorMinor() != version && in.Version != version {
			continue
		}
		found = true
		if err := m.cfg.Cache.Remove(in.Key); err != nil {
			if errors.Is(err, deps.ErrInUse) {
				return removed, fmt.Errorf("managed Python %s is %s; stop the server that runs on it first", in.Version, strings.TrimPrefix(err.Error(), "deps: "))
			}
			return removed, err
		}
		removed = append(removed, in)
		m.event(Event{Action: "remove", Outcome: "removed", Version: in.Version, URL: in.Source, SHA256: in.SHA256, Who: who})
	}
	if !found {
		return nil, &NotAvailableError{Msg: fmt.Sprintf("no managed Python %s is installed", version)}
	}
	return removed, nil
}
