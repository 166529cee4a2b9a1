package snapshot

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestKeyAndLock(t *testing.T) {
	dir := t.TempDir()
	k1, err := LoadKey(dir)
	if err != nil || len(k1) != 32 {
		t.Fatal(k1, err)
	}
	k2, _ := LoadKey(dir)
	if !bytes.Equal(k1, k2) {
		t.Error("the key changed")
	}
	os.Chmod(filepath.Join(dir, KeyFile), 0o644)
	if _, err := LoadKey(dir); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("readable key: %v", err)
	}
	if bytes.Equal(DeriveKey([]byte("a")), DeriveKey([]byte("b"))) {
		t.Error("derived keys agree")
	}
	unlock, _, err := Lock(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, holder, err := Lock(dir); !errors.Is(err, ErrLocked) || !strings.Contains(holder, "pid") {
		t.Errorf("second lock: %v %q", err, holder)
	}
	unlock()
	unlock2, _, err := Lock(dir)
	if err != nil {
		t.Errorf("after unlock: %v", err)
	} else {
		unlock2()
	}
}

// chownOther gives path to another uid (65534, nobody), as a file another
// user left; the test is skipped where this process may not (not root).
func chownOther(t *testing.T, path string) {
	t.Helper()
	uid := 65534
	if os.Geteuid() == uid {
		uid--
	}
	if err := os.Lchown(path, uid, uid); errors.Is(err, syscall.EPERM) {
		t.Skip("cannot chown to another uid here:", err)
	} else if err != nil {
		t.Fatal(err)
	}
}

// outside is a file out of the state directory, as a link in it would
// name: a file of root's the lock must not truncate, a key of another
// user's.
func outside(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "precious")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func unchanged(t *testing.T, path, want string) {
	t.Helper()
	if got, err := os.ReadFile(path); err != nil || string(got) != want {
		t.Errorf("%s: %q %v, want %q untouched", path, got, err, want)
	}
}

const hexKey = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n"

// A lock that is a symbolic link (to a file, or to none yet), or a hard
// link to a file elsewhere, is refused, and what it names is neither
// truncated, written nor made.
func TestLockLinkRefused(t *testing.T) {
	dir := t.TempDir()
	target := outside(t, "root's file\n")
	os.Symlink(target, filepath.Join(dir, lockFile))
	if _, _, err := Lock(dir); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("symlinked lock: %v", err)
	}
	unchanged(t, target, "root's file\n")

	dir = t.TempDir()
	missing := filepath.Join(t.TempDir(), "made")
	os.Symlink(missing, filepath.Join(dir, lockFile))
	if _, _, err := Lock(dir); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("dangling symlinked lock: %v", err)
	}
	if _, err := os.Lstat(missing); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the link's target was made: %v", err)
	}

	dir = t.TempDir()
	if err := os.Link(target, filepath.Join(dir, lockFile)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Lock(dir); err == nil || !strings.Contains(err.Error(), "hard links") {
		t.Errorf("hard-linked lock: %v", err)
	}
	unchanged(t, target, "root's file\n")
}

func TestLockOtherOwnerRefused(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, lockFile)
	os.WriteFile(path, []byte("123\n"), 0o600)
	chownOther(t, path)
	if _, _, err := Lock(dir); err == nil || !strings.Contains(err.Error(), "chown") {
		t.Errorf("another uid's lock: %v", err)
	}
	unchanged(t, path, "123\n")
}

// A key that is a symbolic link is refused, whether it names a key (one
// another user could have written) or nothing yet (the server would make
// its key where the link points).
func TestKeySymlinkRefused(t *testing.T) {
	dir := t.TempDir()
	target := outside(t, hexKey)
	os.Symlink(target, filepath.Join(dir, KeyFile))
	if _, err := LoadKey(dir); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("symlinked key: %v", err)
	}
	unchanged(t, target, hexKey)

	dir = t.TempDir()
	missing := filepath.Join(t.TempDir(), "made")
	os.Symlink(missing, filepath.Join(dir, KeyFile))
	if _, err := LoadKey(dir); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("dangling symlinked key: %v", err)
	}
	if _, err := os.Lstat(missing); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the link's target was made: %v", err)
	}
}

// A key another uid owns is refused even at mode 0600: its owner can sign
// snapshots this server would restore.
func TestKeyOtherOwnerRefused(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, KeyFile)
	os.WriteFile(path, []byte(hexKey), 0o600)
	if _, err := LoadKey(dir); err != nil {
		t.Fatal("the server's own key:", err)
	}
	chownOther(t, path)
	if _, err := LoadKey(dir); err == nil || !strings.Contains(err.Error(), "chown") {
		t.Errorf("another uid's key: %v", err)
	}
	unchanged(t, path, hexKey)
}

// A FIFO in the key's place is refused at once, not waited on.
func TestKeyNotRegularRefused(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mkfifo(filepath.Join(dir, KeyFile), 0o600); err != nil {
		t.Skip(err)
	}
	done := make(chan error, 1)
	go func() { _, err := LoadKey(dir); done <- err }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("FIFO key: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("LoadKey hangs on a FIFO")
	}
	// A directory in the lock's place (EISDIR, opened for writing) is
	// called what it is, as the key's is.
	dir = t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, lockFile), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Lock(dir); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a directory as the lock: %v", err)
	}
}

// The state directory: made 0700 when missing; refused, by LoadKey and
// Lock alike, when another uid owns it or its group or others can write
// it; fine through a symbolic link to a directory of the server's.
func TestStateDirChecked(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "state")
	if _, err := LoadKey(dir); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("made: %v %v", st.Mode(), err)
	}
	unlock, _, err := Lock(dir)
	if err != nil {
		t.Fatal("the server's own directory:", err)
	}
	unlock()

	link := filepath.Join(t.TempDir(), "link")
	os.Symlink(dir, link)
	if _, err := LoadKey(link); err != nil {
		t.Error("through a symlink:", err)
	}

	for _, mode := range []os.FileMode{0o777, 0o770, 0o702, 0o1777} {
		os.Chmod(dir, mode)
		if _, err := LoadKey(dir); err == nil || !strings.Contains(err.Error(), "chmod 700") {
			t.Errorf("mode %v: LoadKey: %v", mode, err)
		}
		if _, _, err := Lock(dir); err == nil || !strings.Contains(err.Error(), "chmod 700") {
			t.Errorf("mode %v: Lock: %v", mode, err)
		}
	}
	os.Chmod(dir, 0o755) // readable by others is fine
	if _, err := LoadKey(dir); err != nil {
		t.Error("mode 0755:", err)
	}

	os.Chmod(dir, 0o700)
	chownOther(t, dir)
	if _, err := LoadKey(dir); err == nil || !strings.Contains(err.Error(), "chown") || !strings.Contains(err.Error(), "--state-dir") {
		t.Errorf("another uid's directory: LoadKey: %v", err)
	}
	if _, _, err := Lock(dir); err == nil || !strings.Contains(err.Error(), "chown") {
		t.Errorf("another uid's directory: Lock: %v", err)
	}
	if _, err := LoadKey(link); err == nil {
		t.Error("another uid's directory through a symlink: accepted")
	}
}

// TestKeyMadeOnceUnderRace: servers starting at once on a fresh state
// directory all get the one key, none an empty or half-written one (a
// reader could open the key between its creation and its write, and
// refused to start: found by an attacker).
func TestKeyMadeOnceUnderRace(t *testing.T) {
	for round := 0; round < 20; round++ {
		dir := t.TempDir()
		keys := make([][]byte, 16)
		errs := make([]error, 16)
		var wg sync.WaitGroup
		for i := range keys {
			wg.Add(1)
			go func() {
				defer wg.Done()
				keys[i], errs[i] = LoadKey(dir)
			}()
		}
		wg.Wait()
		for i := range keys {
			if errs[i] != nil {
				t.Fatalf("round %d, server %d: %v", round, i, errs[i])
			}
			if !bytes.Equal(keys[i], keys[0]) {
				t.Fatalf("round %d: two keys made", round)
			}
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 1 {
			t.Fatalf("round %d: %d entries left in the directory, want the key alone", round, len(ents))
		}
	}
}
