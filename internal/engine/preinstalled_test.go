package engine

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/pysandbox/pysandbox/internal/interp"
	"github.com/pysandbox/pysandbox/internal/testutil/pypi"
)

// hostPackage is a distribution the test interpreter has of its own,
// with its version; the test is skipped without one.
func hostPackage(t *testing.T, e *Engine) (string, string) {
	t.Helper()
	name, version := "", ""
	for n, v := range e.distributions(context.Background(), e.cfg.Python) {
		if name == "" || n < name {
			name, version = n, v
		}
	}
	if name == "" {
		t.Skip("the interpreter has no packages of its own")
	}
	return name, version
}

// TestPreinstalledNeedsNoInstaller: requirements the server's Python meets
// as it is run on an engine that has no installer at all, and say so; a
// set with one it does not meet (a version range the host's package is
// outside of, extras, a marker, a package it lacks) goes whole to the
// installer, here refused for want of one.
func TestPreinstalledNeedsNoInstaller(t *testing.T) {
	e := newEngine(t, nil)
	// The first call that asks is cancelled: the listing is the server's,
	// and still made (one caller must not turn it off for all).
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	first := e.distributions(cancelled, e.cfg.Python)
	name, version := hostPackage(t, e)
	if len(first) == 0 {
		t.Errorf("a cancelled first call left the listing empty")
	}
	for _, dep := range []string{name, name + ">=" + version, name + "==" + version} {
		var mu sync.Mutex
		var said []string
		r, err := e.Run(context.Background(), RunRequest{Code: "print('ran')", Dependencies: []string{dep}, Progress: func(s string) {
			mu.Lock()
			said = append(said, s)
			mu.Unlock()
		}})
		if err != nil || r.Status != StatusSuccess || r.Stdout != "ran\n" {
			t.Fatalf("%s: %v %+v", dep, err, r)
		}
		mu.Lock()
		if !strings.Contains(strings.Join(said, "\n"), "nothing to install: "+name+" "+version) {
			t.Errorf("%s: progress %q", dep, said)
		}
		mu.Unlock()
	}
	for _, deps := range [][]string{{name + "<0.0.0.1"}, {name + "[extra]"}, {name + "; python_version > '3'"}, {name, "pysbx-nonexistent"}} {
		_, err := e.Run(context.Background(), RunRequest{Code: "print('ran')", Dependencies: deps})
		if err == nil || !strings.Contains(err.Error(), "installs no dependencies") {
			t.Errorf("%s: %v", deps, err)
		}
	}
}

// TestPreinstalledResolvedTogether: the shortcut never splits a set. A
// requirement the host meets ("NAME<999") beside one whose package needs
// NAME>=999 goes whole to the installer, which finds the conflict, rather
// than installing NAME 999 over the range the host's copy met; in a
// session, a requirement met by the host is kept and resolved with what
// is installed later, and once the session has packages of its own
// (which come first on its path) nothing is taken from the host's.
func TestPreinstalledResolvedTogether(t *testing.T) {
	name, _ := hostPackage(t, newEngine(t, nil))
	idx := pypi.NewIndex(t,
		pypi.Package{Name: name, Version: "999.0"},
		pypi.Package{Name: "pysbx-needs-new", Version: "1.0", Requires: []string{name + ">=999"}},
		pypi.Package{Name: "pysbx-plain", Version: "1.0"})
	mod := func(c *Config) {
		c.Interpreters = interp.Discover(context.Background())
		c.Deps = testDeps(t, idx, c.Limits)
	}
	e := newEngine(t, mod)
	r, err := e.Run(context.Background(), RunRequest{Code: "print('ran')", Dependencies: []string{name + "<999", "pysbx-needs-new"}})
	if err != nil || r.Status != StatusInstallError {
		t.Fatalf("a set that conflicts: %v %+v", err, r)
	}
	var ie interface{ Summary() string }

	s := newSessions(t, mod, SessionConfig{})
	info, err := s.Create(context.Background(), 0, CreateOptions{Dependencies: []string{name + "<999"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Install(context.Background(), info.ID, []string{"pysbx-needs-new"}, nil); err == nil || !errors.As(err, &ie) {
		t.Fatalf("install against the session's own range: %v", err)
	}
	// A session with packages installed: the host's copy is shadowed.
	id := create(t, s)
	if inst, err := s.Install(context.Background(), id, []string{name + "==999.0"}, nil); err != nil || len(inst.Preinstalled) != 0 {
		t.Fatalf("install %s 999: %+v %v", name, inst, err)
	}
	if inst, err := s.Install(context.Background(), id, []string{"pysbx-plain"}, nil); err != nil || len(inst.Preinstalled) != 0 {
		t.Fatalf("then another package: %+v %v", inst, err)
	}
	if inst, err := s.Install(context.Background(), id, []string{name}, nil); err != nil || len(inst.Preinstalled) != 0 || !strings.Contains(strings.Join(inst.Requirements, " "), name+"==999.0") {
		t.Fatalf("the host's %s in a session with its own: %+v %v", name, inst, err)
	}
}
