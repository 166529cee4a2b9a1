package engine

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
)

// TestPauseResume: a paused session frees its sandbox and comes back
// under its id with its variables, functions, classes and files, for its
// owner only; what could not be saved is said.
func TestPauseResume(t *testing.T) {
	ctx := context.Background()
	var events []SnapshotEvent
	s, _ := pausable(t, "", SnapshotConfig{Events: func(e SnapshotEvent) { events = append(events, e) }})
	info, err := s.Create(ctx, 0, CreateOptions{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	id := info.ID
	srun(t, s, id, "data = {'k': list(range(5))}\ndef f(x, k=2):\n    return x * k + len(data['k'])\nclass C:\n    def m(self):\n        return 'm'\nc = C()\nimport json as j\nwith open('kept.txt', 'w') as fh:\n    fh.write('on disk')\ndel fh\nlock = __import__('threading').Lock()")
	res, err := s.Pause(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Unsaveable) != 1 || res.Unsaveable[0].Name != "lock" || !strings.Contains(res.Unsaveable[0].Reason, "lock") {
		t.Errorf("unsaveable: %+v", res.Unsaveable)
	}
	if owner, paused := s.Paused(id); !paused || owner != "alice" {
		t.Fatalf("not listed as paused: %q %v", owner, paused)
	}
	if _, err := s.Run(ctx, id, RunRequest{Code: "1"}); !errors.As(err, new(*PausedError)) {
		t.Errorf("a run on a paused session without resuming it: %v", err)
	}
	// Someone else: as if it did not exist.
	if _, err := s.Resume(ctx, id, ResumeOptions{Owner: "bob"}); !errors.Is(err, ErrNoSession) {
		t.Errorf("bob's resume: %v", err)
	}
	if err := s.CheckOwner(id, "bob"); !errors.Is(err, ErrNoSession) {
		t.Errorf("bob's check: %v", err)
	}
	rr, err := s.Resume(ctx, id, ResumeOptions{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if rr == nil || rr.Files != 1 || len(rr.Unsaveable) != 1 || !strings.Contains(rr.Summary(), "lock (") {
		t.Errorf("resume: %+v", rr)
	}
	r := srun(t, s, id, "print(f(3), isinstance(c, C), c.m(), j.dumps(data), open('kept.txt').read(), 'lock' in globals())")
	if r.Stdout != "11 True m {\"k\": [0, 1, 2, 3, 4]} on disk False\n" {
		t.Errorf("after resume: %+v", r)
	}
	var kinds []string
	for _, e := range events {
		kinds = append(kinds, e.Kind+":"+e.Caller)
	}
	if strings.Join(kinds, " ") != "pause:alice refuse:bob refuse:bob resume:alice" {
		t.Errorf("events: %v", kinds)
	}
	// Closing deletes the snapshot too.
	if err := s.Close(id); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(s.SnapshotStore().Dir()); len(ents) != 0 {
		t.Errorf("left after close: %v", ents)
	}
}
