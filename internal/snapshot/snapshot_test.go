package snapshot

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const (
	idA = "s-0123456789abcdef0123456789abcdef"
	idB = "s-fedcba9876543210fedcba9876543210.replica-0.0a1b2c3d"
)

func key(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }

// write stores a snapshot of id for owner with the given sections.
func write(t *testing.T, s *Store, id, owner string, globals, files []byte) int64 {
	t.Helper()
	w, err := s.Create(id, 0)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(globals)
	w.EndGlobals()
	w.Write(files)
	size, err := w.Commit(Meta{ID: id, Owner: owner, PausedAt: time.Now(), Python: "3.11.2", Saved: []string{"x"}})
	if err != nil {
		t.Fatal(err)
	}
	return size
}

func TestRoundTrip(t *testing.T) {
	s, err := Open(t.TempDir(), key(1))
	if err != nil {
		t.Fatal(err)
	}
	globals, files := bytes.Repeat([]byte("g"), 100000), []byte("tar bytes")
	size := write(t, s, idB, "alice", globals, files)
	snap, err := s.Open(idB)
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Close()
	if snap.Size != size || snap.Meta.Owner != "alice" || snap.Meta.ID != idB || snap.Meta.Python != "3.11.2" {
		t.Errorf("meta %+v size %d (wrote %d)", snap.Meta, snap.Size, size)
	}
	g, _ := io.ReadAll(snap.Globals())
	f, _ := io.ReadAll(snap.Files())
	if !bytes.Equal(g, globals) || !bytes.Equal(f, files) {
		t.Errorf("sections: %d %q", len(g), f)
	}
	infos, bad := s.List()
	if len(infos) != 1 || len(bad) != 0 || infos[0].ID != idB {
		t.Errorf("list %+v bad %v", infos, bad)
	}
	if err := s.Remove(idB); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Open(idB); !errors.Is(err, ErrNotFound) {
		t.Errorf("after remove: %v", err)
	}
}

// Every byte is under the HMAC: a flipped bit in any section, a cut
// file, a snapshot under another session's name and one signed with
// another key are all refused.
func TestTamperedRefused(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(dir, key(1))
	write(t, s, idA, "alice", []byte("globals"), []byte("files"))
	path := filepath.Join(dir, idA+suffix)
	orig, _ := os.ReadFile(path)
	for i := range orig {
		data := bytes.Clone(orig)
		data[i] ^= 0x01
		os.WriteFile(path, data, 0o600)
		if _, err := s.Open(idA); err == nil {
			t.Fatalf("byte %d of %d flipped: accepted", i, len(orig))
		}
	}
	for _, n := range []int{0, 10, len(orig) - 1} {
		os.WriteFile(path, orig[:n], 0o600)
		if _, err := s.Open(idA); !errors.Is(err, ErrTampered) {
			t.Errorf("cut to %d bytes: %v", n, err)
		}
	}
	// Transplanted: a genuine snapshot under another id.
	os.WriteFile(path, orig, 0o600)
	other := filepath.Join(dir, "s-11111111111111111111111111111111"+suffix)
	os.WriteFile(other, orig, 0o600)
	if _, err := s.Open("s-11111111111111111111111111111111"); !errors.Is(err, ErrTampered) || !strings.Contains(err.Error(), "another session") {
		t.Errorf("transplanted: %v", err)
	}
	// Another server's key.
	s2, _ := Open(dir, key(2))
	if _, err := s2.Open(idA); !errors.Is(err, ErrTampered) {
		t.Errorf("other key: %v", err)
	}
	if _, err := s.Open(idA); err != nil {
		t.Errorf("the genuine one: %v", err)
	}
	// The listing leaves out what does not verify, and says why.
	infos, bad := s2.List()
	if len(infos) != 0 || len(bad) != 2 {
		t.Errorf("listed with another key: %v %v", infos, bad)
	}
	// Names that are no session id are never opened.
	for _, id := range []string{"../x", "s-1", "s-0123456789abcdef0123456789abcdef/../../etc"} {
		if _, err := s.Open(id); !errors.Is(err, ErrNotFound) {
			t.Errorf("Open(%q): %v", id, err)
		}
	}
}

func TestSizeLimit(t *testing.T) {
	s, _ := Open(t.TempDir(), key(1))
	w, err := s.Create(idA, 100)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(make([]byte, 60)); err != nil {
		t.Fatal(err)
	}
	w.EndGlobals()
	if w.Room() != 40 {
		t.Errorf("room %d", w.Room())
	}
	if _, err := w.Write(make([]byte, 41)); !errors.Is(err, ErrTooBig) {
		t.Errorf("over the limit: %v", err)
	}
	w.Abort()
	ents, _ := os.ReadDir(s.Dir())
	if len(ents) != 0 {
		t.Errorf("left behind: %v", ents)
	}
}

// Import takes a snapshot another server with the key wrote, verified
// whole; anything else is refused and leaves nothing.
func TestImport(t *testing.T) {
	src, _ := Open(t.TempDir(), key(1))
	write(t, src, idB, "bob", []byte("g"), []byte("f"))
	f, size, err := src.Export(idB)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(f)
	f.Close()
	dst, _ := Open(t.TempDir(), key(1))
	if _, err := dst.Import(idB, bytes.NewReader(data), size-1); err == nil {
		t.Error("over the limit: accepted")
	}
	bad := bytes.Clone(data)
	bad[12] ^= 1
	if _, err := dst.Import(idB, bytes.NewReader(bad), size); !errors.Is(err, ErrTampered) {
		t.Errorf("tampered import: %v", err)
	}
	if _, err := dst.Import(idA, bytes.NewReader(data), size); !errors.Is(err, ErrTampered) {
		t.Errorf("import under another id: %v", err)
	}
	info, err := dst.Import(idB, bytes.NewReader(data), size)
	if err != nil || info.Owner != "bob" {
		t.Fatalf("import: %+v %v", info, err)
	}
	ents, _ := os.ReadDir(dst.Dir())
	if len(ents) != 1 {
		t.Errorf("files: %v", ents)
	}
}

// The snapshot directory, like the state directory, is made 0700 and must
// be the server's own.
func TestOpenDirChecked(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "sessions")
	if _, err := Open(dir, key(1)); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("made: %v %v", st.Mode(), err)
	}
	if _, err := Open(dir, key(1)); err != nil {
		t.Error("again:", err)
	}
	for _, mode := range []os.FileMode{0o777, 0o770, 0o1777} {
		os.Chmod(dir, mode)
		if _, err := Open(dir, key(1)); err == nil || !strings.Contains(err.Error(), "chmod 700") {
			t.Errorf("mode %v: %v", mode, err)
		}
	}
	os.Chmod(dir, 0o700)
	file := filepath.Join(t.TempDir(), "file")
	os.WriteFile(file, nil, 0o600)
	if _, err := Open(file, key(1)); err == nil {
		t.Error("a file: accepted")
	}
	chownOther(t, dir)
	if _, err := Open(dir, key(1)); err == nil || !strings.Contains(err.Error(), "chown") {
		t.Errorf("another uid's: %v", err)
	}
}

// TestPlantedFilesRefused: a FIFO, a symbolic link or a second name of a
// genuine snapshot under a snapshot's name is refused at once (a FIFO
// would otherwise block the open, and the server's start with it).
func TestPlantedFilesRefused(t *testing.T) {
	s, err := Open(t.TempDir(), key(1))
	if err != nil {
		t.Fatal(err)
	}
	write(t, s, idA, "alice", []byte("g"), nil)
	if err := unix.Mkfifo(s.path(idB), 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := s.Stat(idB); done <- err }()
	select {
	case err := <-done:
		if !errors.Is(err, ErrTampered) {
			t.Errorf("a FIFO: %v", err)
		}
	case <-time.After(time.Minute): // guards a hang only
		t.Fatal("Stat of a FIFO blocked")
	}
	const idC = "s-00000000000000000000000000000000"
	os.Symlink(s.path(idA), s.path(idC))
	if _, err := s.Open(idC); !errors.Is(err, ErrTampered) {
		t.Errorf("a symbolic link: %v", err)
	}
	os.Remove(s.path(idC))
	os.Link(s.path(idA), s.path(idC))
	if _, err := s.Stat(idA); !errors.Is(err, ErrTampered) {
		t.Errorf("a file with two names: %v", err)
	}
	os.Remove(s.path(idC))
	// A socket at the name (ENXIO on open).
	sock := s.path(idC)
	if l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"}); err == nil {
		l.SetUnlinkOnClose(false)
		l.Close()
		if _, err := s.Open(idC); !errors.Is(err, ErrTampered) {
			t.Errorf("a socket: %v", err)
		}
		os.Remove(sock)
	}
}

// TestPassingOpenErrorKeepsTheSnapshot: a snapshot that cannot be opened
// for a reason that may pass, here too many open files, is not called
// tampered with, which would have a resume delete it (an attacker ran a
// server out of descriptors and lost a genuine session that way).
func TestPassingOpenErrorKeepsTheSnapshot(t *testing.T) {
	s, err := Open(t.TempDir(), key(1))
	if err != nil {
		t.Fatal(err)
	}
	write(t, s, idA, "alice", []byte("g"), nil)
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	// The lowest free descriptor becomes the limit: no open can succeed.
	free, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(free)
	low := lim
	low.Cur = uint64(free)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Skipf("cannot lower the descriptor limit: %v", err)
	}
	_, openErr := s.Open(idA)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if openErr == nil || errors.Is(openErr, ErrTampered) || !errors.Is(openErr, unix.EMFILE) {
		t.Errorf("out of descriptors: %v, want EMFILE and not tampered", openErr)
	}
	snap, err := s.Open(idA)
	if err != nil {
		t.Fatalf("the snapshot after the limit came back: %v", err)
	}
	snap.Close()
}
