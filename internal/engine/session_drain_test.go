package engine

import (
	"context"
	"testing"
)

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
