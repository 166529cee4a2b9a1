package deps

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/sandbox"
	"github.com/pysandbox/pysandbox/internal/testutil/pypi"
)

func TestConcurrentEnsureBuildsOnce(t *testing.T) {
	t.Parallel()
	py := systemPython(t)
	ix := newIndex(t)
	c := newCache(t, IndexConfig{IndexURL: ix.URL})
	const n = 5
	var wg sync.WaitGroup
	envs := make([]*Env, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var release func()
			envs[i], release, errs[i] = c.Ensure(context.Background(), py, []string{"pysbx-gamma"}, nil)
			if release != nil {
				release()
			}
		}()
	}
	wg.Wait()
	for i := range n {
		if errors.Is(errs[i], sandbox.ErrUnavailable) {
			t.Skip(errs[i])
		}
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		if envs[i].Key != envs[0].Key {
			t.Errorf("caller %d got key %s, caller 0 %s", i, envs[i].Key, envs[0].Key)
		}
	}
	if got := ix.Downloads(pypi.WheelFilename(gamma)); got != 1 {
		t.Errorf("wheel downloaded %d times, want 1", got)
	}
	if got := c.Installs(); got != 1 {
		t.Errorf("installer ran %d times, want 1", got)
	}
}

func TestCancelKillsAbandonedBuild(t *testing.T) {
	t.Parallel()
	py := systemPython(t)
	ix := newIndex(t)
	c := newCache(t, IndexConfig{IndexURL: ix.URL})
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{}, 1)
	go func() {
		<-started
		cancel()
	}()
	_, _, err := c.Ensure(ctx, py, []string{"pysbx-alpha"}, func(string) {
		select {
		case started <- struct{}{}:
		default:
		}
	})
	if errors.Is(err, sandbox.ErrUnavailable) {
		t.Skip(err)
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	// The build is killed and cleaned up in the background.
	deadline := time.Now().Add(20 * time.Second)
	for {
		ents, _ := os.ReadDir(c.buildDir)
		c.mu.Lock()
		pending := len(c.builds)
		c.mu.Unlock()
		if len(ents) == 0 && pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("build not cleaned up: %v", ents)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A later call builds afresh and succeeds.
	env, release, err := c.Ensure(context.Background(), py, []string{"pysbx-alpha"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	release()
	if n := c.Installs(); n != 2 {
		t.Errorf("installer ran %d times, want 2 (the killed one and the rebuild)", n)
	}
	if got := importValues(t, py.Path, env.Site, "pysbx_alpha"); got != "pysbx-alpha-1.0.0" {
		t.Errorf("VALUE = %q", got)
	}
}
