package engine

import (
	"context"
	"strings"
	"testing"

	"github.com/pysandbox/pysandbox/internal/sandbox"
)

// --sandbox none works, and says everywhere that it is unsandboxed.
func TestNoneBackendSaysUnsandboxed(t *testing.T) {
	e := newEngine(t, func(c *Config) { c.Backend = sandbox.None{} })
	r, err := e.Run(context.Background(), RunRequest{Code: "import os\nprint(os.getcwd())\n40 + 2"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != StatusSuccess || r.Sandbox != "none" || !strings.Contains(r.Stdout, "pysandbox-none-") {
		t.Fatalf("%+v", r)
	}
	p := e.Measure(context.Background(), nil)
	if p.Posture != "unsandboxed" || p.Backend != "none" || !p.Usable() {
		t.Fatalf("posture %+v", p)
	}
	if p.Layers.NetNamespace.Active || p.Layers.Seccomp.Active || !strings.Contains(strings.Join(p.Problems, " "), "nothing is isolated") {
		t.Errorf("posture claims isolation it does not have: %+v", p)
	}
}

// The native posture reports every layer as measured from inside.
func TestMeasureNative(t *testing.T) {
	e := newEngine(t, nil)
	p := e.Measure(context.Background(), nil)
	if p.Posture != "sandboxed" || !p.Usable() {
		t.Fatalf("posture %s, problems %v", p.Posture, p.Problems)
	}
	if !p.Layers.CgroupNamespace.Active || !p.Layers.ReadOnlyRoot.Active || !p.Layers.UnprivilegedUser.Active {
		t.Errorf("%+v", p.Layers)
	}
	if !strings.HasPrefix(p.Network, "none") {
		t.Errorf("network %q", p.Network)
	}
}
