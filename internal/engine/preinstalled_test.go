package engine

import (
	"context"
	"strings"
	"sync"
	"testing"
)

// TestPreinstalledNeedsNoInstaller: a requirement the server's Python
// meets as it is runs on an engine that has no installer at all, and says
// so; one it does not meet (a version range the host's package is outside
// of, extras) still goes to the installer, here refused for want of one.
func TestPreinstalledNeedsNoInstaller(t *testing.T) {
	e := newEngine(t, nil)
	dists := e.distributions(context.Background(), e.cfg.Python)
	name, version := "", ""
	for n, v := range dists {
		if n != "" && (name == "" || n < name) {
			name, version = n, v
		}
	}
	if name == "" {
		t.Skip("the interpreter has no packages of its own")
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
		if !strings.Contains(strings.Join(said, "\n"), "not installed: "+name+" "+version) {
			t.Errorf("%s: progress %q", dep, said)
		}
		mu.Unlock()
	}
	for _, dep := range []string{name + "<0.0.0.1", name + "[extra]", name + "; python_version > '3'"} {
		_, err := e.Run(context.Background(), RunRequest{Code: "print('ran')", Dependencies: []string{dep}})
		if err == nil || !strings.Contains(err.Error(), "installs no dependencies") {
			t.Errorf("%s: %v", dep, err)
		}
	}
}
