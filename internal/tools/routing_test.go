package tools

import (
	"testing"

	"github.com/pysandbox/pysandbox/internal/engine"
)

// TestOnePerID: list_sessions across replicas lists a session both a
// stopping replica and the one it handed it to hold once, the running
// one if either runs it, and keeps the order of the rest.
func TestOnePerID(t *testing.T) {
	p, r := engine.StatePaused, engine.StateRunning
	got := onePerID([]engine.SessionInfo{
		{ID: "a", State: p}, {ID: "b", State: r}, {ID: "a", State: r, Runs: 2}, {ID: "c", State: p, Runs: 1}, {ID: "c", State: p, Runs: 2}, {ID: "b", State: p},
	})
	want := []engine.SessionInfo{{ID: "a", State: r, Runs: 2}, {ID: "b", State: r}, {ID: "c", State: p, Runs: 1}}
	if len(got) != len(want) {
		t.Fatalf("%+v", got)
	}
	for i := range want {
		if got[i].ID != want[i].ID || got[i].State != want[i].State || got[i].Runs != want[i].Runs {
			t.Errorf("%d: %+v, want %+v", i, got[i], want[i])
		}
	}
}
