package snapshot

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestInstances: a second server on a held directory gets an instance
// directory below it, writing with the directory's key; while it runs,
// nothing of it is adopted; once it has stopped, the next holder of the
// directory adopts its snapshots, which then open (their MACs hold) and
// list as its own. A snapshot the holder has already is left alone.
func TestInstances(t *testing.T) {
	dir := t.TempDir()
	unlockA, _, err := Lock(dir)
	if err != nil {
		t.Fatal(err)
	}
	sub, unlockB, err := LockInstance(dir)
	if err != nil || sub != filepath.Join(dir, "instances", "2") {
		t.Fatalf("instance %q: %v", sub, err)
	}
	if sub3, unlockC, err := LockInstance(dir); err != nil || sub3 != filepath.Join(dir, "instances", "3") {
		t.Fatalf("a third server: %q %v", sub3, err)
	} else {
		unlockC()
	}
	main, err := Open(filepath.Join(dir, "sessions"), key(7))
	if err != nil {
		t.Fatal(err)
	}
	second, err := Open(filepath.Join(sub, "sessions"), key(7))
	if err != nil {
		t.Fatal(err)
	}
	write(t, second, idB, "bob", []byte("globals"), nil)
	write(t, second, idA, "alice", []byte("second's"), nil)
	write(t, main, idA, "alice", []byte("main's"), nil)
	// Under another key (a state directory of its own once): not adopted.
	const idC = "s-00000000000000000000000000000000"
	other, err := Open(t.TempDir(), key(9))
	if err != nil {
		t.Fatal(err)
	}
	write(t, other, idC, "carol", []byte("x"), nil)
	if err := os.Rename(other.path(idC), second.path(idC)); err != nil {
		t.Fatal(err)
	}
	// A write its server was killed in: swept.
	os.WriteFile(filepath.Join(second.dir, tmpPrefix+"x"), []byte("half"), 0o600)
	if n, err := main.Adopt(dir); n != 0 || err != nil {
		t.Fatalf("adopted %d from a live server (%v)", n, err)
	}
	unlockB()
	unlockA()
	// The next server: it holds the directory and takes the rest over.
	if _, _, err := Lock(dir); err != nil {
		t.Fatal(err)
	}
	if n, err := main.Adopt(dir); n != 1 || err == nil || !strings.Contains(err.Error(), idC) {
		t.Fatalf("adopted %d (%v); want 1, and the one under another key refused", n, err)
	}
	if _, err := os.Stat(second.path(idC)); err != nil {
		t.Errorf("the refused snapshot was not left where it was: %v", err)
	}
	if m, _ := filepath.Glob(filepath.Join(second.dir, tmpPrefix+"*")); len(m) != 0 {
		t.Errorf("left: %v", m)
	}
	snap, err := main.Open(idB)
	if err != nil || snap.Meta.Owner != "bob" {
		t.Fatalf("the adopted snapshot: %v", err)
	}
	snap.Close()
	if snap, err := main.Open(idA); err != nil || snap.Meta.Owner != "alice" || snap.Size == 0 {
		t.Fatalf("the holder's own: %v", err)
	} else {
		snap.Close()
	}
	if infos, bad := main.List(); len(infos) != 2 || len(bad) != 0 {
		t.Errorf("list: %+v %v", infos, bad)
	}
	// Every instance held: ErrLocked, as for the directory itself.
	var unlocks []func()
	for range maxInstances {
		_, u, err := LockInstance(dir)
		if err != nil {
			t.Fatal(err)
		}
		unlocks = append(unlocks, u)
	}
	if _, _, err := LockInstance(dir); !errors.Is(err, ErrLocked) {
		t.Errorf("every instance held: %v", err)
	}
	for _, u := range unlocks {
		u()
	}
}
