package pool

import (
	"context"
	"testing"

	"github.com/pysandbox/pysandbox/internal/engine"
)

func TestPooledHello(t *testing.T) {
	e, p := newPooledEngine(t, 2, nil)
	for i := 0; i < 5; i++ {
		r, err := e.Run(context.Background(), engine.RunRequest{Code: "import os\nprint('hi', os.getpid(), os.getuid())\n21*2"})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%+v", r)
	}
	t.Logf("%+v", p.Stats())
}
