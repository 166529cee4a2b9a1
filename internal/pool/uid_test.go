package pool

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/sandbox"
)

func TestUIDSet(t *testing.T) {
	s := newUIDSet(128)
	for i := range 128 {
		if id, ok := s.take(); !ok || id != i {
			t.Fatalf("take %d: %d %v", i, id, ok)
		}
	}
	if id, ok := s.take(); ok {
		t.Fatalf("a full set gave %d", id)
	}
	// Freed ids come back in turn from where the search stopped, never
	// one in use.
	s.put(70)
	s.put(3)
	s.put(3) // twice: no effect
	for _, want := range []int{3, 70} {
		if id, ok := s.take(); !ok || id != want {
			t.Fatalf("take: %d %v, want %d", id, ok, want)
		}
	}
	if _, ok := s.take(); ok {
		t.Fatal("full again, yet take gave an id")
	}
	for i := range 128 {
		s.put(i)
	}
	s.take() // 71: the search goes on after the last id given
	if id, _ := s.take(); id != 72 {
		t.Errorf("after 71: %d", id)
	}
}

// TestLiveChildKeepsItsUser: a child that lives on (a session's) keeps
// its user to itself however many runs are spawned meanwhile. Proved
// with a block of 64 ids: with ids taken in turn modulo the block, the
// 64th spawn after it was the same user.
func TestLiveChildKeepsItsUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only a root server maps a block of ids for its children")
	}
	saved := childUIDs
	childUIDs = newUIDSet(64)
	t.Cleanup(func() { childUIDs = saved })
	e, p := newPooledEngine(t, 2, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sb, err := p.Start(ctx, p.cfg.Spec)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	held := sb.(*child).uid
	if held < sandbox.ChildIDBase {
		t.Fatalf("held child's uid %d", held)
	}
	for i := range 100 {
		r, err := e.Run(ctx, engine.RunRequest{Code: "open('/proc/self/uid_map').read().split()[1]"})
		if err != nil || r.Status != engine.StatusSuccess {
			t.Fatalf("run %d: %v %+v", i, err, r)
		}
		if got := fmt.Sprint(r.ReturnValue); got == fmt.Sprint(held) {
			t.Fatalf("run %d was user %s, as the live child is", i, got)
		}
	}
}
