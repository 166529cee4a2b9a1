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
