package snapshot

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pysandbox/pysandbox/internal/workspace"
)

// newWorkspace opens a workspace over dir (a fresh temporary directory
// when dir is ""), as the engine does over a session's /work.
func newWorkspace(t *testing.T, dir string) (*workspace.Dir, string) {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	ws, err := workspace.Open(f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	return ws, dir
}

// writeRandom writes size bytes of pseudo-random data (seeded by seed) to
// path a chunk at a time, and returns their SHA-256.
func writeRandom(t *testing.T, path string, size int64, seed uint64) [32]byte {
	t.Helper()
	os.MkdirAll(filepath.Dir(path), 0o755)
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	rng := rand.NewChaCha8([32]byte{byte(seed)})
	if _, err := io.CopyN(io.MultiWriter(f, h), rng, size); err != nil {
		t.Fatal(err)
	}
	return [32]byte(h.Sum(nil))
}

func hashFile(t *testing.T, path string) [32]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return [32]byte(h.Sum(nil))
}

// allocated is what a file takes on its file system.
func allocated(t *testing.T, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Sys().(*syscall.Stat_t).Blocks * 512
}

// allocs is how many bytes f allocates on the heap, in all (garbage
// included).
func allocs(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestPackUnpackLarge packs and unpacks a 64 MiB file: it is streamed,
// so the server allocates a small fraction of it, not the file.
func TestPackUnpackLarge(t *testing.T) {
	const size = 64 << 20
	src, dir := newWorkspace(t, "")
	want := writeRandom(t, filepath.Join(dir, "data", "big.bin"), size, 1)
	os.WriteFile(filepath.Join(dir, "small.txt"), []byte("small"), 0o644)

	tarFile, err := os.Create(filepath.Join(t.TempDir(), "files.tar"))
	if err != nil {
		t.Fatal(err)
	}
	defer tarFile.Close()
	var files int
	var skipped []string
	packed := allocs(func() { files, skipped, err = PackFiles(src, tarFile, -1) })
	if err != nil || files != 2 || len(skipped) != 0 {
		t.Fatalf("PackFiles = %d, %q, %v", files, skipped, err)
	}

	dst, out := newWorkspace(t, "")
	var restored int
	unpacked := allocs(func() {
		restored, skipped, err = UnpackFiles(dst, io.NewSectionReader(tarFile, 0, 1<<40), size)
	})
	if err != nil || restored != 2 || len(skipped) != 0 {
		t.Fatalf("UnpackFiles = %d, %q, %v", restored, skipped, err)
	}
	t.Logf("allocated for a %d MiB file: %d KiB to pack, %d KiB to unpack", size>>20, packed>>10, unpacked>>10)
	for what, n := range map[string]uint64{"PackFiles": packed, "UnpackFiles": unpacked} {
		if n > size/16 {
			t.Errorf("%s allocated %d bytes for a file of %d", what, n, size)
		}
	}
	if hashFile(t, filepath.Join(out, "data", "big.bin")) != want {
		t.Error("big.bin differs after the round trip")
	}
	if b, _ := os.ReadFile(filepath.Join(out, "small.txt")); string(b) != "small" {
		t.Errorf("small.txt = %q", b)
	}
}

// TestPackSkips: links, FIFOs, sockets and the packages directory are not
// packed, and a link can lead nothing outside into the tar.
func TestPackSkips(t *testing.T) {
	ws, dir := newWorkspace(t, "")
	outside := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(outside, []byte("SECRET"), 0o644)
	os.WriteFile(filepath.Join(dir, "kept.txt"), []byte("kept"), 0o644)
	os.Symlink(outside, filepath.Join(dir, "abs-link"))
	os.Symlink("kept.txt", filepath.Join(dir, "inside-link"))
	if err := unix.Mkfifo(filepath.Join(dir, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(dir, "sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	os.MkdirAll(filepath.Join(dir, PackagesDir, "pkg"), 0o755)
	os.WriteFile(filepath.Join(dir, PackagesDir, "pkg", "mod.py"), []byte("x = 1"), 0o644)
	os.Mkdir(filepath.Join(dir, "empty"), 0o755)

	var buf bytes.Buffer
	done := make(chan struct{})
	var files int
	var skipped []string
	go func() {
		defer close(done)
		files, skipped, err = PackFiles(ws, &buf, -1)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("PackFiles blocked (on the FIFO?)")
	}
	if err != nil || files != 1 {
		t.Fatalf("PackFiles = %d, %q, %v", files, skipped, err)
	}
	want := []string{
		"abs-link: a symlink (to " + outside + ") is not kept",
		"fifo: a special file is not kept",
		"inside-link: a symlink (to kept.txt) is not kept",
		"sock: a special file is not kept",
	}
	if !slices.Equal(skipped, want) {
		t.Errorf("skipped = %q\nwant %q", skipped, want)
	}
	tr := tar.NewReader(&buf)
	var names []string
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, hdr.Name)
	}
	if !slices.Equal(names, []string{"kept.txt"}) {
		t.Errorf("the tar holds %q", names)
	}
	if bytes.Contains(buf.Bytes(), []byte("SECRET")) {
		t.Error("the tar holds the outside secret")
	}

	// Over the room: an error, not a partial snapshot.
	if _, _, err := PackFiles(ws, io.Discard, 3); !errors.Is(err, ErrTooBig) {
		t.Errorf("PackFiles over the room = %v", err)
	}
}

// entry is one file of a hand-made tar.
type entry struct {
	name string
	typ  byte
	data string
	size int64 // when data is "": that many bytes of 'x'
}

func makeTar(t *testing.T, entries []entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: 0o644, Format: tar.FormatPAX}
		var r io.Reader = strings.NewReader(e.data)
		hdr.Size = int64(len(e.data))
		if e.data == "" && e.size > 0 {
			r, hdr.Size = io.LimitReader(xs{}, e.size), e.size
		}
		if e.typ == tar.TypeSymlink {
			hdr.Linkname, hdr.Size, r = "/etc", 0, strings.NewReader("")
		}
		if e.typ == 0 {
			hdr.Typeflag = tar.TypeReg
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(tw, r); err != nil {
			t.Fatal(err)
		}
	}
	tw.Close()
	return buf.Bytes()
}

// xs reads as endless 'x' bytes.
type xs struct{}

func (xs) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	return len(p), nil
}

// TestUnpackSkips: what cannot be restored is skipped and said, the rest
// is restored, and nothing is written outside the workspace.
func TestUnpackSkips(t *testing.T) {
	ws, dir := newWorkspace(t, "")
	outDir := t.TempDir()
	os.Symlink(outDir, filepath.Join(dir, "link"))
	os.Mkdir(filepath.Join(dir, "adir"), 0o755)
	tarball := makeTar(t, []entry{
		{name: "first.txt", data: "first"},
		{name: "too-big.bin", size: 2000},
		{name: "../escape", data: "PWNED"},
		{name: "/abs", data: "PWNED"},
		{name: "link/x", data: "PWNED"},
		{name: "sym", typ: tar.TypeSymlink},
		{name: "adir", data: "PWNED"},
		{name: "sub/last.txt", data: "last"},
	})
	restored, skipped, err := UnpackFiles(ws, bytes.NewReader(tarball), 1000)
	if err != nil || restored != 2 {
		t.Fatalf("UnpackFiles = %d, %q, %v", restored, skipped, err)
	}
	for _, b := range []struct{ path, why string }{
		{"too-big.bin", "is 2000 bytes, more than the workspace holds (1000)"},
		{`"../escape"`, "invalid path"},
		{`"/abs"`, "invalid path"},
		{"link/x", "symbolic link"},
		{"sym", "not a regular file"},
		{"adir", "not a regular file"},
	} {
		if !slices.ContainsFunc(skipped, func(s string) bool {
			return strings.HasPrefix(s, b.path+": ") && strings.Contains(s, b.why)
		}) {
			t.Errorf("skipped %q does not say %s: ...%s...", skipped, b.path, b.why)
		}
	}
	if len(skipped) != 6 {
		t.Errorf("skipped = %q", skipped)
	}
	t.Logf("skipped: %q", skipped)
	for p, want := range map[string]string{"first.txt": "first", "sub/last.txt": "last"} {
		if b, err := os.ReadFile(filepath.Join(dir, p)); err != nil || string(b) != want {
			t.Errorf("%s = %q, %v", p, b, err)
		}
	}
	if e, _ := os.ReadDir(outDir); len(e) != 0 {
		t.Errorf("written outside: %v", e)
	}
	if _, err := os.Lstat(filepath.Join(filepath.Dir(dir), "escape")); err == nil {
		t.Error("../escape was written")
	}

	// A truncated tar is an error, after what came before it.
	ws2, dir2 := newWorkspace(t, "")
	good := makeTar(t, []entry{{name: "a", data: "aaa"}, {name: "b", size: 5000}})
	restored, _, err = UnpackFiles(ws2, bytes.NewReader(good[:len(good)-1024-2000]), 1<<20)
	if err == nil || restored != 1 {
		t.Errorf("truncated tar: %d, %v", restored, err)
	}
	t.Log(err)
	if _, err := os.Stat(filepath.Join(dir2, "b")); err == nil {
		t.Error("the truncated file was written")
	}
}

// TestUnpackFull restores into a workspace too small for one of the
// files: that one is skipped, the others (a sparse one too: its holes
// take no room) are restored.
func TestUnpackFull(t *testing.T) {
	src, dir := newWorkspace(t, "")
	os.WriteFile(filepath.Join(dir, "a.txt"), []byte("before"), 0o644)
	writeRandom(t, filepath.Join(dir, "big.bin"), 4<<20, 2)
	sparse, err := os.Create(filepath.Join(dir, "sparse.bin"))
	if err != nil {
		t.Fatal(err)
	}
	sparse.WriteAt([]byte("start"), 0)
	sparse.WriteAt([]byte("end"), 64<<20-3)
	sparse.Close()
	wantSparse := hashFile(t, filepath.Join(dir, "sparse.bin"))
	os.WriteFile(filepath.Join(dir, "z.txt"), []byte("after"), 0o644)
	var buf bytes.Buffer
	if files, skipped, err := PackFiles(src, &buf, -1); err != nil || files != 4 || len(skipped) != 0 {
		t.Fatalf("PackFiles = %d, %q, %v", files, skipped, err)
	}

	small := t.TempDir()
	if err := unix.Mount("tmpfs", small, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("cannot mount a tmpfs here: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(small, unix.MNT_DETACH) })
	dst, _ := newWorkspace(t, small)
	restored, skipped, err := UnpackFiles(dst, bytes.NewReader(buf.Bytes()), 1<<30)
	if err != nil || restored != 3 || len(skipped) != 1 || !strings.HasPrefix(skipped[0], "big.bin: workspace is full") {
		t.Fatalf("UnpackFiles = %d, %q, %v", restored, skipped, err)
	}
	t.Logf("skipped: %q", skipped)
	for p, want := range map[string]string{"a.txt": "before", "z.txt": "after"} {
		if b, err := os.ReadFile(filepath.Join(small, p)); err != nil || string(b) != want {
			t.Errorf("%s = %q, %v", p, b, err)
		}
	}
	if hashFile(t, filepath.Join(small, "sparse.bin")) != wantSparse {
		t.Error("sparse.bin differs")
	}
	if n := allocated(t, filepath.Join(small, "sparse.bin")); n > 256<<10 {
		t.Errorf("sparse.bin takes %d bytes", n)
	}
	entries, _ := os.ReadDir(small)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"a.txt", "sparse.bin", "z.txt"}) {
		t.Errorf("the workspace holds %q", names)
	}
}

// TestPackFileChanged: a file that shrinks or grows while it is copied
// gives exactly the size in its header all the same, so the tar stays
// readable.
func TestPackFileChanged(t *testing.T) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if n, err := packFile(tw, "shrank", strings.NewReader("abc"), 6, time.Now()); err != nil || n != 3 {
		t.Fatalf("shrank: %d, %v", n, err)
	}
	if n, err := packFile(tw, "grew", strings.NewReader("abcdefgh"), 4, time.Now()); err != nil || n != 4 {
		t.Fatalf("grew: %d, %v", n, err)
	}
	boom := errors.New("boom")
	if _, err := packFile(tw, "failed", io.MultiReader(strings.NewReader("ab"), iotestErr{boom}), 4, time.Now()); !errors.Is(err, boom) {
		t.Errorf("read error: %v", err)
	}
	tw2 := tar.NewWriter(&buf)
	tw2.Close()
	tr := tar.NewReader(bytes.NewReader(buf.Bytes()))
	for _, want := range []struct{ name, data string }{{"shrank", "abc\x00\x00\x00"}, {"grew", "abcd"}} {
		hdr, err := tr.Next()
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		if hdr.Name != want.name || string(b) != want.data {
			t.Errorf("%s: %q", hdr.Name, b)
		}
	}
}

type iotestErr struct{ err error }

func (e iotestErr) Read([]byte) (int, error) { return 0, e.err }

// TestPackTooManyFiles: of a workspace with more entries than a snapshot
// keeps, the first MaxFiles are kept and the rest said, rather than the
// whole snapshot (variables included) refused.
func TestPackTooManyFiles(t *testing.T) {
	ws, root := newWorkspace(t, "")
	for i := range MaxFiles + 10 {
		if err := os.WriteFile(filepath.Join(root, fmt.Sprintf("f%05d", i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	files, skipped, err := PackFiles(ws, &buf, -1)
	if err != nil {
		t.Fatal(err)
	}
	if files != MaxFiles || len(skipped) != 1 || !strings.Contains(skipped[0], "the rest are not") {
		t.Errorf("%d files, skipped %q", files, skipped)
	}
}
