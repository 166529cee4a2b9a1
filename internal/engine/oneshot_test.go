package engine

import (
	"context"
	"testing"

	"github.com/pysandbox/pysandbox/internal/testutil/afterlife"
)

// TestNothingRunsAfterTheAnswer: a cold one-shot run that tries to go on
// after its reply (a daemon thread, an atexit handler registered during
// atexit, a flush after the reply) is over when the caller has its
// answer, since its CPU time has been reported by then; and like a
// script, the run waits for its non-daemon threads first.
func TestNothingRunsAfterTheAnswer(t *testing.T) {
	e := newEngine(t, nil)
	r, err := e.Run(context.Background(), RunRequest{Code: afterlife.Code("coldafter")})
	if err != nil || r.Status != StatusSuccess || r.Stdout != "renamed\n" {
		t.Fatalf("%v %+v", err, r)
	}
	afterlife.Check(t, "coldafter")
	r, err = e.Run(context.Background(), RunRequest{Code: afterlife.Threads})
	if err != nil || r.Status != StatusSuccess || r.Stdout != afterlife.ThreadsOut {
		t.Fatalf("%v %+v", err, r)
	}
}
