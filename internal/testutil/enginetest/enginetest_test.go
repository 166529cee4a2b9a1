package enginetest

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/sandbox"
)

func TestMain(m *testing.M) {
	// The native backend re-executes this test binary as the sandbox init.
	sandbox.InitMain()
	os.Exit(m.Run())
}

// TestNew: the engine runs code in a native sandbox, with the limits and
// the changes asked for.
func TestNew(t *testing.T) {
	e := New(t, func(c *engine.Config) { c.MaxOutput = 4096 }, func(c *engine.Config) { c.DefaultTimeout = 30 * time.Second })
	if c := e.Config(); c.MaxOutput != 4096 || c.DefaultTimeout != 30*time.Second || c.MaxTimeout != time.Minute || c.Limits.MemoryBytes != Limits.MemoryBytes || c.Limits.MaxProcs != Limits.MaxProcs || c.Limits.TmpBytes != Limits.TmpBytes {
		t.Errorf("config %+v", c)
	}
	r, err := e.Run(context.Background(), engine.RunRequest{Code: "import os\nprint(os.getuid())\n6*7"})
	if err != nil || r.Status != engine.StatusSuccess || r.Stdout != "1000\n" || fmt.Sprint(r.ReturnValue) != "42" {
		t.Fatalf("%v %+v", err, r)
	}
}
