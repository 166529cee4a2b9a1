package workspace

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"testing/iotest"

	"golang.org/x/sys/unix"
)

// newWS returns an open Dir on a fresh workspace directory, the
// directory's path, and a separate "outside" directory holding a file
// named secret that no test may ever read or change through the Dir.
func newWS(t *testing.T) (*Dir, string, string) {
	t.Helper()
	ws := t.TempDir()
	out := t.TempDir()
	if err := os.WriteFile(filepath.Join(out, "secret"), []byte("SECRET"), 0o644); err != nil {
		t.Fatal(err)
	}
	return openDir(t, ws), ws, out
}

func openDir(t *testing.T, dir string) *Dir {
	t.Helper()
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	d, err := Open(f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// checkOutside fails the test if out holds anything but the untouched
// secret file.
func checkOutside(t *testing.T, out string) {
	t.Helper()
	var got []string
	filepath.WalkDir(out, func(p string, e fs.DirEntry, err error) error {
		if p != out {
			got = append(got, strings.TrimPrefix(p, out+"/"))
		}
		return nil
	})
	if len(got) != 1 || got[0] != "secret" {
		t.Errorf("outside directory now holds %q, want only [secret]", got)
	}
	if b, err := os.ReadFile(filepath.Join(out, "secret")); err != nil || string(b) != "SECRET" {
		t.Errorf("outside secret is now %q, %v", b, err)
	}
}

func mustWrite(t *testing.T, d *Dir, p string, content string) {
	t.Helper()
	if err := d.Write(p, []byte(content), 1<<20); err != nil {
		t.Fatalf("Write(%q): %v", p, err)
	}
}

func mustRead(t *testing.T, d *Dir, p string) string {
	t.Helper()
	b, _, err := d.Read(p, 1<<20)
	if err != nil {
		t.Fatalf("Read(%q): %v", p, err)
	}
	return string(b)
}

func TestCleanPath(t *testing.T) {
	good := map[string]string{
		"a":                                      "a",
		"a/b.csv":                                "a/b.csv",
		"./a":                                    "a",
		"a//b":                                   "a/b",
		"a/./b/":                                 "a/b",
		"dir\\file.txt":                          "dir\\file.txt",
		"with space/ü":                           "with space/ü",
		"...":                                    "...",
		"..a/b..":                                "..a/b..",
		strings.Repeat("n", 255):                 strings.Repeat("n", 255),
		strings.Repeat("a/", 63) + "b":           strings.Repeat("a/", 63) + "b",
		strings.Repeat("./", 100) + "x/./y/./z/": "x/y/z",
	}
	for in, want := range good {
		got, err := CleanPath(in)
		if err != nil || got != want {
			t.Errorf("CleanPath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	bad := []string{
		"", ".", "./", "//", "/etc/passwd", "/", "../x", "..", "a/../../x", "a/..", "a/../b",
		"x\x00y", "a\nb", "tab\there", "del\x7f", "c1\u0085", "esc\x1b[0m",
		strings.Repeat("n", 256), strings.Repeat("a/", 64) + "b",
		strings.Repeat("a", 4097),
	}
	for _, in := range bad {
		got, err := CleanPath(in)
		if err == nil {
			t.Errorf("CleanPath(%q) = %q, want an error", in, got)
			continue
		}
		if !errors.Is(err, ErrInvalidPath) {
			t.Errorf("CleanPath(%q): %v does not wrap ErrInvalidPath", in, err)
		}
	}
	_, err := CleanPath("/etc/passwd")
	if !strings.Contains(err.Error(), "relative to the workspace, e.g. data/input.csv") {
		t.Errorf("error does not say what to do: %v", err)
	}
	for _, in := range []string{"", ".", "./", ".//."} {
		if c, err := cleanDir(in); err != nil || c != "." {
			t.Errorf("cleanDir(%q) = %q, %v; want .", in, c, err)
		}
	}
}

func TestRoundTrip(t *testing.T) {
	d, ws, _ := newWS(t)
	mustWrite(t, d, "hello.txt", "hello, world\n")
	if got := mustRead(t, d, "./hello.txt"); got != "hello, world\n" {
		t.Errorf("read back %q", got)
	}
	bin := make([]byte, 3*256+7)
	for i := range bin {
		bin[i] = byte(i)
	}
	if err := d.Write("a/b/c/data.bin", bin, int64(len(bin))); err != nil {
		t.Fatal(err)
	}
	got, info, err := d.Read("a//b/c/data.bin", int64(len(bin)))
	if err != nil || !bytes.Equal(got, bin) {
		t.Fatalf("binary round trip: %v, equal=%v", err, bytes.Equal(got, bin))
	}
	if info.Path != "a/b/c/data.bin" || info.Type != "file" || info.Size != int64(len(bin)) || info.ModTime.IsZero() {
		t.Errorf("info = %+v", info)
	}
	// Overwrite with something shorter: no trace of the old content.
	mustWrite(t, d, "a/b/c/data.bin", "short")
	if got := mustRead(t, d, "a/b/c/data.bin"); got != "short" {
		t.Errorf("after overwrite: %q", got)
	}
	// Empty file.
	mustWrite(t, d, "empty", "")
	if b, info, err := d.Read("empty", 0); err != nil || len(b) != 0 || info.Size != 0 {
		t.Errorf("empty: %q %+v %v", b, info, err)
	}
	// Directories were created with the right modes whatever the umask.
	for _, p := range []string{"a", "a/b", "a/b/c"} {
		st, err := os.Lstat(filepath.Join(ws, p))
		if err != nil || !st.IsDir() || st.Mode().Perm() != 0o755 {
			t.Errorf("%s: %v %v", p, st.Mode(), err)
		}
	}
	if st, _ := os.Lstat(filepath.Join(ws, "hello.txt")); st.Mode() != 0o644 {
		t.Errorf("file mode %v", st.Mode())
	}
	// No temporary files are left behind.
	entries, _, err := d.List("", 0)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, e := range entries {
		paths = append(paths, e.Path+":"+e.Type)
	}
	want := "a:dir a/b:dir a/b/c:dir a/b/c/data.bin:file empty:file hello.txt:file"
	if strings.Join(paths, " ") != want {
		t.Errorf("List = %s\nwant   %s", strings.Join(paths, " "), want)
	}
	for _, tc := range []struct{ p, typ string }{{"", "dir"}, {".", "dir"}, {"a/b", "dir"}, {"hello.txt", "file"}} {
		info, err := d.Stat(tc.p)
		if err != nil || info.Type != tc.typ {
			t.Errorf("Stat(%q) = %+v, %v", tc.p, info, err)
		}
	}
	if _, err := d.Stat("nope"); !errors.Is(err, ErrNotFound) || !errors.Is(err, fs.ErrNotExist) || !errors.Is(err, syscall.ENOENT) {
		t.Errorf("Stat(nope) = %v", err)
	}
	if _, _, err := d.Read("a/nope.txt", 10); !errors.Is(err, ErrNotFound) {
		t.Errorf("Read(a/nope.txt) = %v", err)
	}
}

func TestOpenOPath(t *testing.T) {
	ws := t.TempDir()
	fd, err := unix.Open(ws, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	d, err := Open(os.NewFile(uintptr(fd), ws))
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, d, "x/y", "via O_PATH")
	if got := mustRead(t, d, "x/y"); got != "via O_PATH" {
		t.Errorf("got %q", got)
	}
	if e, _, err := d.List(".", 0); err != nil || len(e) != 2 {
		t.Errorf("List: %v %v", e, err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); !errors.Is(err, fs.ErrClosed) {
		t.Errorf("second Close: %v", err)
	}
	if _, _, err := d.Read("x/y", 10); !errors.Is(err, fs.ErrClosed) {
		t.Errorf("Read after Close: %v", err)
	}
	if err := d.Write("z", nil, 10); !errors.Is(err, fs.ErrClosed) {
		t.Errorf("Write after Close: %v", err)
	}
	if f, _, err := d.Open("x/y"); f != nil || !errors.Is(err, fs.ErrClosed) {
		t.Errorf("Open after Close: %v", err)
	}
	if _, err := d.WriteFrom("z", strings.NewReader("z"), 10); !errors.Is(err, fs.ErrClosed) {
		t.Errorf("WriteFrom after Close: %v", err)
	}

	// A file is not a workspace.
	f, _ := os.Create(filepath.Join(ws, "file"))
	if _, err := Open(f); !errors.Is(err, ErrNotDir) {
		t.Errorf("Open(file) = %v", err)
	}
}

func TestLimits(t *testing.T) {
	d, ws, _ := newWS(t)
	data := bytes.Repeat([]byte("x"), 100)
	err := d.Write("big", data, 99)
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "limit is 99") {
		t.Errorf("Write over limit: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(ws, "big")); !os.IsNotExist(err) {
		t.Errorf("refused write left a file: %v", err)
	}
	if err := d.Write("big", data, 100); err != nil {
		t.Fatal(err)
	}
	b, info, err := d.Read("big", 99)
	if !errors.Is(err, ErrTooLarge) || b != nil || info.Size != 100 || info.Type != "file" {
		t.Errorf("Read over limit: %d bytes, %+v, %v", len(b), info, err)
	}
	if b, _, err := d.Read("big", 100); err != nil || len(b) != 100 {
		t.Errorf("Read at limit: %d, %v", len(b), err)
	}
}

// TestReadBounded reads files whose size fstat reports as 0 although they
// have content (procfs): the reader must still stop at the limit.
func TestReadBounded(t *testing.T) {
	d := openDir(t, "/proc/self")
	b, info, err := d.Read("status", 1<<20)
	if err != nil || len(b) < 100 || !bytes.Contains(b, []byte("Pid:")) || info.Size != int64(len(b)) {
		t.Fatalf("Read(status) = %d bytes, %+v, %v", len(b), info, err)
	}
	b, info, err = d.Read("status", 10)
	if !errors.Is(err, ErrTooLarge) || b != nil || info.Size != 11 {
		t.Errorf("Read(status, 10) = %q, %+v, %v", b, info, err)
	}
}

func TestChown(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give files away")
	}
	d, ws, _ := newWS(t)
	const id = 12345
	if err := os.Mkdir(filepath.Join(ws, "pre"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(ws, id, id); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(ws, "pre"), id, id); err != nil {
		t.Fatal(err)
	}
	// A root server writes as the workspace's owner: where the owner may
	// not write (a root-only directory), neither does the server.
	if err := os.Mkdir(filepath.Join(ws, "rootonly"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := d.Write("rootonly/x", []byte("x"), 10); err == nil {
		t.Error("wrote into a directory the workspace owner cannot write")
	}
	old := syscall.Umask(0o077) // modes must not depend on the umask
	defer syscall.Umask(old)
	mustWrite(t, d, "pre/new/deeper/file.csv", "a,b\n")
	mustWrite(t, d, "top.txt", "top")
	mustWrite(t, d, "top.txt", "replaced") // a replacement is a new inode: chowned too
	if err := writeFrom(d, "pre/streamed/s.bin", "streamed", 100); err != nil {
		t.Fatal(err)
	}
	if err := writeFrom(d, "top.txt", "streamed over", 100); err != nil {
		t.Fatal(err)
	}
	if _, err := d.WriteFrom("rootonly/y", strings.NewReader("y"), 10); err == nil {
		t.Error("WriteFrom into a directory the workspace owner cannot write")
	}
	for p, mode := range map[string]os.FileMode{
		"pre/new": fs.ModeDir | 0o755, "pre/new/deeper": fs.ModeDir | 0o755,
		"pre/new/deeper/file.csv": 0o644, "top.txt": 0o644,
		"pre/streamed": fs.ModeDir | 0o755, "pre/streamed/s.bin": 0o644,
	} {
		st, err := os.Lstat(filepath.Join(ws, p))
		if err != nil {
			t.Fatal(err)
		}
		sys := st.Sys().(*syscall.Stat_t)
		if sys.Uid != id || sys.Gid != id || st.Mode() != mode {
			t.Errorf("%s: owner %d:%d mode %v, want %d:%d %v", p, sys.Uid, sys.Gid, st.Mode(), id, id, mode)
		}
	}
	// What existed before keeps its owner and mode.
	st, _ := os.Lstat(filepath.Join(ws, "pre"))
	if sys := st.Sys().(*syscall.Stat_t); sys.Uid != id || st.Mode().Perm() != 0o700 {
		t.Errorf("pre-existing dir changed: %d %v", sys.Uid, st.Mode())
	}
}

// tryMount mounts a tmpfs at dir, or skips the test.
func tryMount(t *testing.T, dir, opts string) {
	t.Helper()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, opts); err != nil {
		t.Skipf("cannot mount a tmpfs here: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
}

func TestFull(t *testing.T) {
	ws := t.TempDir()
	tryMount(t, ws, "size=64k")
	d := openDir(t, ws)
	mustWrite(t, d, "small", "fits")
	err := d.Write("dir/big", make([]byte, 1<<20), 1<<30)
	if !errors.Is(err, ErrFull) || !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "limit 64.0 KiB") {
		t.Fatalf("Write past the size cap = %v", err)
	}
	t.Log(err)
	// The temporary file is gone; the created directory may stay.
	entries, _, _ := d.List("", 0)
	for _, e := range entries {
		if e.Path != "small" && e.Path != "dir" {
			t.Errorf("left behind: %+v", e)
		}
	}
	if got := mustRead(t, d, "small"); got != "fits" {
		t.Errorf("small = %q", got)
	}
	// The same streamed, over a name that has content: it keeps it.
	n, err := d.WriteFrom("small", io.LimitReader(ones{}, 1<<20), 1<<30)
	if !errors.Is(err, ErrFull) || !errors.Is(err, syscall.ENOSPC) || n >= 1<<20 {
		t.Fatalf("WriteFrom past the size cap = %d, %v", n, err)
	}
	if got := mustRead(t, d, "small"); got != "fits" {
		t.Errorf("small = %q", got)
	}
	entries, _, _ = d.List("", 0)
	for _, e := range entries {
		if e.Path != "small" && e.Path != "dir" {
			t.Errorf("left behind: %+v", e)
		}
	}
	// Zeros take no room: 16 MiB of them fit in 64 KiB, as a hole.
	if n, err := d.WriteFrom("zeros", io.LimitReader(zeros{}, 16<<20), 1<<30); err != nil || n != 16<<20 {
		t.Fatalf("WriteFrom of zeros = %d, %v", n, err)
	}
}

// ones and zeros are endless readers of 0xff and 0 bytes.
type ones struct{}

func (ones) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 0xff
	}
	return len(p), nil
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// countReader counts what is read from it.
type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func TestWriteFrom(t *testing.T) {
	d, ws, _ := newWS(t)
	// Round trip of something larger than the copy buffer, not a multiple
	// of it, through a reader that gives odd-sized pieces.
	data := make([]byte, 3*sparseChunk+12345)
	for i := range data {
		data[i] = byte(i * 7)
	}
	n, err := d.WriteFrom("a/b/data.bin", iotest.HalfReader(bytes.NewReader(data)), int64(len(data)))
	if err != nil || n != int64(len(data)) {
		t.Fatalf("WriteFrom = %d, %v", n, err)
	}
	if b, info, err := openRead(d, "a/b/data.bin", 1<<30); err != nil || !bytes.Equal(b, data) || info.Size != int64(len(data)) {
		t.Fatalf("read back: %d bytes, %+v, %v", len(b), info, err)
	}
	if st, _ := os.Lstat(filepath.Join(ws, "a/b/data.bin")); st.Mode() != 0o644 {
		t.Errorf("mode %v", st.Mode())
	}
	// Empty content.
	if n, err := d.WriteFrom("empty", strings.NewReader(""), 0); err != nil || n != 0 {
		t.Errorf("empty: %d, %v", n, err)
	}
	if got := mustRead(t, d, "empty"); got != "" {
		t.Errorf("empty = %q", got)
	}

	// Over the limit: refused, the reader read no further than one byte
	// past the limit, and the old content is kept.
	mustWrite(t, d, "keep", "old")
	for _, limit := range []int64{0, 1, 99, sparseChunk - 1, sparseChunk, 3*sparseChunk + 1} {
		cr := &countReader{r: io.LimitReader(ones{}, 1<<30)}
		n, err := d.WriteFrom("keep", cr, limit)
		if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), fmt.Sprint(limit)) {
			t.Errorf("limit %d: %d, %v", limit, n, err)
		}
		if cr.n != limit+1 {
			t.Errorf("limit %d: read %d bytes from the reader", limit, cr.n)
		}
	}
	if got := mustRead(t, d, "keep"); got != "old" {
		t.Errorf("keep = %q", got)
	}
	// Exactly at the limit is fine.
	if n, err := d.WriteFrom("keep", strings.NewReader("12345"), 5); err != nil || n != 5 {
		t.Errorf("at the limit: %d, %v", n, err)
	}
	// A failing reader: its error comes back as is, nothing is written.
	boom := errors.New("boom")
	n, err = d.WriteFrom("keep", io.MultiReader(strings.NewReader("partial"), iotest.ErrReader(boom)), 100)
	if !errors.Is(err, boom) || n != 7 {
		t.Errorf("failing reader: %d, %v", n, err)
	}
	if got := mustRead(t, d, "keep"); got != "12345" {
		t.Errorf("keep = %q", got)
	}
	n, err = d.WriteFrom("new", iotest.TimeoutReader(strings.NewReader(strings.Repeat("x", 100))), 1000)
	if !errors.Is(err, iotest.ErrTimeout) {
		t.Errorf("timeout reader: %d, %v", n, err)
	}
	// A reader that never makes progress is given up on.
	if _, err := d.WriteFrom("new", stuck{}, 1000); !errors.Is(err, io.ErrNoProgress) {
		t.Errorf("stuck reader: %v", err)
	}
	if _, err := d.WriteFrom("../x", strings.NewReader("x"), 10); !errors.Is(err, ErrInvalidPath) {
		t.Errorf("bad path: %v", err)
	}
	// No temporary files are left behind.
	entries, _, _ := d.List("", 0)
	var paths []string
	for _, e := range entries {
		paths = append(paths, e.Path)
	}
	if got := strings.Join(paths, " "); got != "a a/b a/b/data.bin empty keep" {
		t.Errorf("List = %s", got)
	}
}

// stuck reads nothing, forever.
type stuck struct{}

func (stuck) Read([]byte) (int, error) { return 0, nil }

// TestSparse: WriteFrom writes whole chunks of zeros as holes, read back
// as zeros.
func TestSparse(t *testing.T) {
	d, ws, _ := newWS(t)
	const size = 8 << 20
	data := make([]byte, size)
	copy(data[3*sparseChunk+5:], "middle")
	copy(data[size-sparseChunk:], "last chunk")
	for _, tc := range []struct {
		name string
		r    io.Reader
		size int64
	}{
		{"mixed", bytes.NewReader(data), size},
		{"trailing", io.MultiReader(strings.NewReader("head"), io.LimitReader(zeros{}, size)), size + 4},
		{"all", io.LimitReader(zeros{}, size), size},
	} {
		n, err := d.WriteFrom(tc.name, tc.r, 1<<30)
		if err != nil || n != tc.size {
			t.Fatalf("%s: %d, %v", tc.name, n, err)
		}
		st, err := os.Stat(filepath.Join(ws, tc.name))
		if err != nil || st.Size() != tc.size {
			t.Fatalf("%s: %v %v", tc.name, st.Size(), err)
		}
		if blocks := st.Sys().(*syscall.Stat_t).Blocks * 512; blocks > 1<<20 {
			t.Errorf("%s: %d bytes allocated for %d mostly zero", tc.name, blocks, tc.size)
		}
	}
	if b, _, err := d.Read("mixed", size); err != nil || !bytes.Equal(b, data) {
		t.Errorf("mixed read back: %v", err)
	}
	if b, _, err := d.Read("trailing", size+4); err != nil || len(b) != size+4 || string(b[:4]) != "head" || !bytes.Equal(b[4:], make([]byte, size)) {
		t.Errorf("trailing read back: %d bytes, %v", len(b), err)
	}
}

// TestOpen reads through Open: the FileInfo is from the open file, and
// the file stays usable after the Dir is closed.
func TestOpen(t *testing.T) {
	d, _, _ := newWS(t)
	mustWrite(t, d, "sub/f.txt", "content")
	f, info, err := d.Open("./sub//f.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if info.Path != "sub/f.txt" || info.Type != "file" || info.Size != 7 || info.ModTime.IsZero() {
		t.Errorf("info %+v", info)
	}
	if fl, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0); err != nil || fl&unix.O_NONBLOCK != 0 || fl&unix.O_ACCMODE != unix.O_RDONLY {
		t.Errorf("flags %#x, %v", fl, err)
	}
	d.Close()
	if b, err := io.ReadAll(f); err != nil || string(b) != "content" {
		t.Errorf("read %q, %v", b, err)
	}
	if _, err := f.Write([]byte("x")); err == nil {
		t.Error("the file Open gives is writable")
	}
	d2, _, _ := newWS(t)
	for p, want := range map[string]error{"nope": ErrNotFound, "": ErrInvalidPath, "../x": ErrInvalidPath, ".": ErrInvalidPath} {
		if f, _, err := d2.Open(p); f != nil || !errors.Is(err, want) {
			t.Errorf("Open(%q) = %v, want %v", p, err, want)
		}
	}
}
