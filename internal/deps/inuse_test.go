package deps

import (
	"context"
	"os"
	"testing"
	"time"
)

// TestPruneSparesOtherProcesses: an env one cache (one process: a running
// server) uses is not evicted by another cache over the same directory
// (`pysandbox cache prune`), and is once it is released.
func TestPruneSparesOtherProcesses(t *testing.T) {
	t.Parallel()
	py := systemPython(t)
	ix := newIndex(t)
	server := newCache(t, IndexConfig{NoIndex: true, FindLinks: []string{ix.Dir}})
	env, release, err := ensure(t, server, py, []string{"pysbx-beta"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	prune, err := New(server.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if evicted, err := prune.Prune(0); err != nil || len(evicted) != 0 {
		t.Fatalf("another process's Prune(0) evicted an env in use: %+v %v", evicted, err)
	}
	if _, err := os.Stat(env.Site); err != nil {
		t.Fatalf("the env in use is gone: %v", err)
	}
	// The other process can use it too (shared locks), then let it go.
	_, release2, err := prune.Ensure(context.Background(), py, []string{"pysbx-beta"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	release2()
	release()
	// A process another test forks meanwhile holds a copy of every open
	// descriptor, the lock's among them, until its exec: Prune then sees
	// the env as in use, and rightly skips it. It is evicted at the next.
	for deadline := time.Now().Add(time.Minute); ; { // guards a hang only
		evicted, err := prune.Prune(0)
		if err != nil || len(evicted) > 1 {
			t.Fatalf("Prune(0) after release: %+v %v", evicted, err)
		}
		if len(evicted) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Prune(0) after release evicted nothing")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The server finds it gone and builds it again.
	env2, release3, err := server.Ensure(context.Background(), py, []string{"pysbx-beta"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer release3()
	if _, err := os.Stat(env2.Site); err != nil {
		t.Errorf("rebuilt env: %v", err)
	}
}
