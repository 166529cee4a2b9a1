package deps

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestPruneLRU(t *testing.T) {
	t.Parallel()
	py := systemPython(t)
	ix := newIndex(t)
	c := newCache(t, IndexConfig{NoIndex: true, FindLinks: []string{ix.Dir}})
	older, relOlder, err := ensure(t, c, py, []string{"pysbx-beta"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	newer, relNewer, err := ensure(t, c, py, []string{"pysbx-gamma"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Make the order unambiguous: meta.json's mtime is the LRU clock.
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(filepath.Join(c.envDir(older.Key), metaName), old, old); err != nil {
		t.Fatal(err)
	}
	relOlder()
	relNewer()

	// Room for one: the older goes.
	evicted, err := c.Prune(newer.SizeBytes)
	if err != nil {
		t.Fatal(err)
	}
	if len(evicted) != 1 || evicted[0].Key != older.Key {
		t.Fatalf("evicted %+v, want only %s", evicted, older.Key)
	}
	if _, err := os.Stat(filepath.Dir(older.Site)); !os.IsNotExist(err) {
		t.Errorf("evicted env still on disk: %v", err)
	}
	if _, err := os.Stat(newer.Site); err != nil {
		t.Errorf("kept env gone: %v", err)
	}

	// In use: never evicted, even by Prune(0).
	again, relAgain, err := c.Ensure(context.Background(), py, []string{"pysbx-gamma"}, nil)
	if err != nil || again.Key != newer.Key {
		t.Fatalf("re-ensure: %v %+v", err, again)
	}
	if evicted, err := c.Prune(0); err != nil || len(evicted) != 0 {
		t.Errorf("Prune(0) with the env in use evicted %+v, %v", evicted, err)
	}
	relAgain()
	relAgain() // idempotent
	if evicted, err := c.Prune(0); err != nil || len(evicted) != 1 {
		t.Errorf("Prune(0) after release evicted %+v, %v", evicted, err)
	}
	if list, _ := c.List(); len(list) != 0 {
		t.Errorf("envs left: %+v", list)
	}
	if ents, _ := os.ReadDir(c.trashDir); len(ents) != 0 {
		t.Errorf("trash left: %v", ents)
	}

	// An env bigger than the whole cache is refused, and nothing is left.
	c.cfg.MaxBytes = 1
	_, _, err = c.Ensure(context.Background(), py, []string{"pysbx-beta"}, nil)
	var ie *InstallError
	if !errors.As(err, &ie) || !strings.Contains(err.Error(), "more than the whole cache") {
		t.Errorf("oversized env: %v", err)
	}
	assertNoBuilds(t, c)

	// Ensure prunes to MaxBytes after a build, sparing what it returns:
	// room for either env, not both.
	c.cfg.MaxBytes = max(older.SizeBytes, newer.SizeBytes)
	a, relA, err := c.Ensure(context.Background(), py, []string{"pysbx-beta"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	relA()
	b, relB, err := c.Ensure(context.Background(), py, []string{"pysbx-gamma"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer relB()
	list, _ := c.List()
	if len(list) != 1 || list[0].Key != b.Key {
		t.Errorf("after building %s, envs = %+v (want only it; %s evicted)", b.Key, list, a.Key)
	}
}
