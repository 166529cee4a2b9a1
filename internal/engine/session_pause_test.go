package engine

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/snapshot"
)

// pausable is a session manager whose snapshots go to dir (a fresh one
// when "").
func pausable(t *testing.T, dir string, snap SnapshotConfig) (*Sessions, string) {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	st, err := snapshot.Open(dir, make([]byte, 32))
	if err != nil {
		t.Fatal(err)
	}
	snap.Store = st
	return newSessions(t, nil, SessionConfig{Snapshots: snap}), dir
}

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

// TestCheckpointSurvivesCrash: with every-run checkpoints, a server that
// stops without pausing (killed) leaves each session as of its last run,
// and a new manager on the same directory resumes it.
func TestCheckpointSurvivesCrash(t *testing.T) {
	ctx := context.Background()
	s, dir := pausable(t, "", SnapshotConfig{EveryRun: true})
	info, _ := s.Create(ctx, 0, CreateOptions{Owner: "o"})
	srun(t, s, info.ID, "n = 1")
	srun(t, s, info.ID, "n += 41")
	s.Shutdown() // nothing paused: as a crash leaves it
	s2, _ := pausable(t, dir, SnapshotConfig{})
	if _, paused := s2.Paused(info.ID); !paused {
		t.Fatal("the checkpoint is not listed after the restart")
	}
	if _, err := s2.Resume(ctx, info.ID, ResumeOptions{Owner: "o"}); err != nil {
		t.Fatal(err)
	}
	if r := srun(t, s2, info.ID, "print(n)"); r.Stdout != "42\n" {
		t.Errorf("after the crash: %+v", r)
	}
}

// TestPauseLimits: a session over the size cap is not paused and keeps
// running; the paused quota holds; a paused session expires.
func TestPauseLimits(t *testing.T) {
	ctx := context.Background()
	s, dir := pausable(t, "", SnapshotConfig{MaxBytes: 1 << 20, MaxPaused: 1, PausedTTL: time.Second})
	a, _ := s.Create(ctx, 0, CreateOptions{Owner: "o"})
	srun(t, s, a.ID, "big = bytes(2 << 20)")
	if _, err := s.Pause(ctx, a.ID); !errors.Is(err, ErrSnapshotTooBig) {
		t.Errorf("over the cap: %v", err)
	}
	if r := srun(t, s, a.ID, "print(len(big))"); r.Stdout != "2097152\n" {
		t.Errorf("after the refused pause: %+v", r)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("a refused pause left %v", ents)
	}
	srun(t, s, a.ID, "del big")
	if _, err := s.Pause(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	b, _ := s.Create(ctx, 0, CreateOptions{Owner: "o"})
	if _, err := s.Pause(ctx, b.ID); !errors.Is(err, ErrPausedQuota) {
		t.Errorf("second pause: %v", err)
	}
	deadline := time.Now().Add(time.Minute) // guards a hang only
	for time.Now().Before(deadline) {
		if _, paused := s.Paused(a.ID); !paused {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := s.Resume(ctx, a.ID, ResumeOptions{Owner: "o"}); err == nil || !strings.Contains(err.Error(), "not resumed within") {
		t.Errorf("expired: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, a.ID+".snap")); !os.IsNotExist(err) {
		t.Errorf("the expired snapshot: %v", err)
	}
}

// TestPauseInterrupted: a pause whose pickling does not end (a __reduce__
// that loops) is interrupted when its caller gives up, and the session
// keeps running with its state.
func TestPauseInterrupted(t *testing.T) {
	s, _ := pausable(t, "", SnapshotConfig{})
	info, _ := s.Create(context.Background(), 0, CreateOptions{Owner: "o"})
	srun(t, s, info.ID, "class Slow:\n    def __reduce__(self):\n        while True:\n            pass\nx = 7\nslow = Slow()")
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	if _, err := s.Pause(ctx, info.ID); err == nil {
		t.Fatal("a pause that cannot end succeeded")
	}
	if d := time.Since(start); d > 30*time.Second { // guards a hang only
		t.Errorf("the pause took %v after its caller gave up", d)
	}
	if r := srun(t, s, info.ID, "print(x)"); r.Stdout != "7\n" {
		t.Errorf("after the interrupted pause: %+v", r)
	}
	if _, paused := s.Paused(info.ID); paused {
		t.Error("listed as paused")
	}
}
