package pydist

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// ent is one entry of a crafted archive.
type ent struct {
	name, link string
	typ        byte
	body       string
	mode       int64
}

func tarGz(t *testing.T, ents ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, e := range ents {
		mode := e.mode
		if mode == 0 {
			mode = 0o644
		}
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: mode, Size: int64(len(e.body))}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if e.typ == tar.TypeChar || e.typ == tar.TypeBlock {
			h.Devmajor, h.Devminor = 1, 3
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	tw.Close()
	zw.Close()
	return buf.Bytes()
}

var (
	top    = ent{name: "python/", typ: tar.TypeDir, mode: 0o755}
	binDir = ent{name: "python/bin/", typ: tar.TypeDir, mode: 0o755}
	exe    = ent{name: "python/bin/python3.11", typ: tar.TypeReg, body: "#!", mode: 0o4755}
)

// unpackInto unpacks data into a fresh python/ under a directory that
// also holds a sentinel outside the tree, and returns the error and the
// tree's path.
func unpackInto(t *testing.T, data []byte, maxBytes int64, charge func(int64) error) (string, error) {
	t.Helper()
	base := t.TempDir()
	if err := os.WriteFile(filepath.Join(base, "outside"), []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, "python")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if charge == nil {
		charge = func(int64) error { return nil }
	}
	err := unpack(context.Background(), bytes.NewReader(data), dir, maxBytes, charge)
	// Whatever the archive did, nothing outside the tree changed.
	ents, _ := os.ReadDir(base)
	if len(ents) != 2 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("the unpack touched the directory around the tree: %v", names)
	}
	if b, _ := os.ReadFile(filepath.Join(base, "outside")); string(b) != "keep" {
		t.Errorf("the file outside the tree changed: %q", b)
	}
	return dir, err
}

func TestUnpackGood(t *testing.T) {
	data := tarGz(t, top, binDir, exe,
		ent{name: "python/bin/python3", typ: tar.TypeSymlink, link: "python3.11"},
		ent{name: "python/lib/python3.11/os.py", typ: tar.TypeReg, body: "x = 1\n"},
		ent{name: "python/lib/python3.11/same.py", typ: tar.TypeLink, link: "python/lib/python3.11/os.py"},
		ent{name: "python/lib/libfoo.so", typ: tar.TypeSymlink, link: "../bin/python3"},
		ent{name: "python/share/dangling", typ: tar.TypeSymlink, link: "nothing/here"},
	)
	dir, err := unpackInto(t, data, 1<<30, nil)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, "bin/python3.11"))
	if err != nil {
		t.Fatal(err)
	}
	// Set-id bits are gone; the execute bits stay.
	if fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 || fi.Mode().Perm() != 0o755 {
		t.Errorf("mode = %v", fi.Mode())
	}
	lib, err := os.Stat(filepath.Join(dir, "lib/python3.11"))
	if err != nil || lib.Mode().Perm() != 0o755 {
		t.Errorf("directory mode = %v %v", lib, err)
	}
	a, _ := os.Stat(filepath.Join(dir, "lib/python3.11/os.py"))
	b, _ := os.Stat(filepath.Join(dir, "lib/python3.11/same.py"))
	if !os.SameFile(a, b) {
		t.Error("the hard link is not one file")
	}
}

func TestUnpackHostile(t *testing.T) {
	for _, tc := range []struct {
		name string
		ents []ent
		want string
	}{
		{"dotdot", []ent{top, binDir, {name: "python/../escape", typ: tar.TypeReg, body: "x"}}, "leaves its directory"},
		{"dotdot deep", []ent{top, binDir, {name: "python/bin/../../escape", typ: tar.TypeReg, body: "x"}}, "leaves its directory"},
		{"absolute", []ent{top, binDir, {name: "/etc/evil", typ: tar.TypeReg, body: "x"}}, "absolute path"},
		{"outside python", []ent{top, binDir, {name: "other/file", typ: tar.TypeReg, body: "x"}}, "outside python/"},
		{"absolute symlink", []ent{top, binDir, {name: "python/lib", typ: tar.TypeSymlink, link: "/etc"}}, "symlink out of the tree"},
		{"relative symlink out", []ent{top, binDir, {name: "python/bin/up", typ: tar.TypeSymlink, link: "../../.."}}, "symlink out of the tree"},
		// Each link stays inside on paper; followed, the second leaves.
		{"symlink chain", []ent{top, binDir,
			{name: "python/a/b/c/", typ: tar.TypeDir},
			{name: "python/s", typ: tar.TypeSymlink, link: "."},
			{name: "python/a/b/t", typ: tar.TypeSymlink, link: "../../s/.."},
		}, "leads out of the tree"},
		{"write through symlink", []ent{top, binDir,
			{name: "python/lib", typ: tar.TypeSymlink, link: "bin"},
			{name: "python/lib/x.py", typ: tar.TypeReg, body: "x"},
		}, "through a symlink"},
		{"char device", []ent{top, binDir, {name: "python/dev/mem", typ: tar.TypeChar}}, "device file"},
		{"block device", []ent{top, binDir, {name: "python/sda", typ: tar.TypeBlock}}, "device file"},
		{"fifo", []ent{top, binDir, {name: "python/fifo", typ: tar.TypeFifo}}, "named pipe"},
		{"hard link out", []ent{top, binDir, {name: "python/passwd", typ: tar.TypeLink, link: "/etc/passwd"}}, "hard link to something outside"},
		{"hard link up", []ent{top, binDir, {name: "python/passwd", typ: tar.TypeLink, link: "python/../../outside"}}, "hard link to something outside"},
		{"hard link to a dir", []ent{top, binDir, {name: "python/l", typ: tar.TypeLink, link: "python/bin"}}, "not a file unpacked before it"},
		{"twice", []ent{top, binDir, exe, exe}, "twice"},
		{"twice, spelled otherwise", []ent{top, binDir, exe, {name: "./python/./bin//python3.11", typ: tar.TypeReg, body: "y"}}, "twice"},
		{"symlink loop", []ent{top, binDir, {name: "python/a", typ: tar.TypeSymlink, link: "b"}, {name: "python/b", typ: tar.TypeSymlink, link: "a"}}, "loop"},
		{"hard link through a symlink", []ent{top, binDir, exe, {name: "python/s", typ: tar.TypeSymlink, link: "bin"}, {name: "python/h", typ: tar.TypeLink, link: "python/s/python3.11"}}, "through a symlink"},
		{"hard link to a symlink", []ent{top, binDir, {name: "python/s", typ: tar.TypeSymlink, link: "bin"}, {name: "python/h", typ: tar.TypeLink, link: "python/s"}}, "not a file unpacked before it"},
		{"hard link to itself", []ent{top, binDir, {name: "python/h", typ: tar.TypeLink, link: "python/h"}}, "not a file unpacked before it"},
		{"directory over a symlink", []ent{top, binDir, {name: "python/lib", typ: tar.TypeSymlink, link: "bin"}, {name: "python/lib/", typ: tar.TypeDir}}, "through a symlink"},
		{"file under a file", []ent{top, binDir, {name: "python/f", typ: tar.TypeReg, body: "x"}, {name: "python/f/g", typ: tar.TypeReg, body: "x"}}, "through a symlink or a file"},
		{"symlink up through a link", []ent{top, binDir, {name: "python/a/b/", typ: tar.TypeDir}, {name: "python/a/b/s", typ: tar.TypeSymlink, link: ".."}, {name: "python/a/b/L", typ: tar.TypeSymlink, link: "s/../../../x"}}, "leads out of the tree"},
		{"symlink past a missing name", []ent{top, binDir, {name: "python/L", typ: tar.TypeSymlink, link: "missing/../../x"}}, "symlink out of the tree"},
		{"name longer than a file system takes", []ent{top, binDir, exe, {name: "python/lib/" + strings.Repeat("x", 300), typ: tar.TypeReg, body: "x"}}, "longer than 255 bytes"},
		{"no bin", []ent{top, {name: "python/lib/os.py", typ: tar.TypeReg, body: "x"}}, "no python/bin"},
		{"empty", nil, "is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := unpackInto(t, tarGz(t, tc.ents...), 1<<30, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
			if _, ok := err.(*ArchiveError); !ok {
				t.Errorf("err is a %T, not an *ArchiveError", err)
			}
		})
	}
}

// A directory's entry may come after what it holds (tar does not order
// them).
func TestUnpackDirectoryAfterItsContents(t *testing.T) {
	if _, err := unpackInto(t, tarGz(t, top, exe, binDir), 1<<30, nil); err != nil {
		t.Fatal(err)
	}
}

// The gzip stream after the tar's end is read only as far as a tar's
// padding goes: a trailer of zeros (a 1000:1 bomb) is refused, not
// decompressed.
func TestUnpackTrailerBomb(t *testing.T) {
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	tw := tar.NewWriter(zw)
	for _, e := range []ent{top, binDir, exe} {
		tw.WriteHeader(&tar.Header{Name: e.name, Typeflag: e.typ, Mode: 0o755, Size: int64(len(e.body))})
		tw.Write([]byte(e.body))
	}
	tw.Close()
	zw.Write(make([]byte, 8<<20))
	zw.Close()
	_, err := unpackInto(t, buf.Bytes(), 1<<30, nil)
	if err == nil || !strings.Contains(err.Error(), "data after its end") {
		t.Fatalf("err = %v", err)
	}
}

// An unpack stops when its context ends.
func TestUnpackCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := unpack(ctx, bytes.NewReader(tarGz(t, top, binDir, exe)), t.TempDir(), 1<<30, func(int64) error { return nil })
	if err != context.Canceled {
		t.Fatalf("err = %v", err)
	}
}

func TestUnpackTruncated(t *testing.T) {
	data := tarGz(t, top, binDir, exe, ent{name: "python/lib/big.py", typ: tar.TypeReg, body: strings.Repeat("x = 1\n", 50_000)})
	for _, cut := range []int{len(data) / 2, len(data) - 4, 30} {
		_, err := unpackInto(t, data[:cut], 1<<30, nil)
		if err == nil || !strings.Contains(err.Error(), "truncated") {
			t.Errorf("cut at %d of %d: err = %v", cut, len(data), err)
		}
	}
	if _, err := unpackInto(t, []byte("not gzip at all"), 1<<30, nil); err == nil || !strings.Contains(err.Error(), "not gzip") {
		t.Errorf("not gzip: %v", err)
	}
}

func TestUnpackBounds(t *testing.T) {
	data := tarGz(t, top, binDir, exe, ent{name: "python/lib/big.bin", typ: tar.TypeReg, body: strings.Repeat("\x00", 1<<20)})
	// The tree's own cap.
	if _, err := unpackInto(t, data, 512<<10, nil); err == nil || !strings.Contains(err.Error(), "unpacks to more than") {
		t.Errorf("tree cap: %v", err)
	}
	// The cache's cap, through charge: the unpack stops at the refusal.
	var charged int64
	full := &ArchiveError{Msg: "(cache full)"}
	_, err := unpackInto(t, data, 1<<30, func(n int64) error {
		if charged+n > 256<<10 {
			return full
		}
		charged += n
		return nil
	})
	if err != full {
		t.Errorf("cache cap: %v", err)
	}
}

// BenchmarkUnpack unpacks the system interpreter's archive, beside tar
// -xzf of the same archive.
func BenchmarkUnpack(b *testing.B) {
	a := systemArchive(b)
	b.Run("pydist", func(b *testing.B) {
		for range b.N {
			dir := filepath.Join(b.TempDir(), "python")
			os.Mkdir(dir, 0o700)
			f, err := os.Open(a.Path)
			if err != nil {
				b.Fatal(err)
			}
			if err := unpack(context.Background(), bufio.NewReaderSize(f, 256<<10), dir, 1<<30, func(int64) error { return nil }); err != nil {
				b.Fatal(err)
			}
			f.Close()
		}
	})
	b.Run("tar", func(b *testing.B) {
		for range b.N {
			if out, err := exec.Command("tar", "-xzf", a.Path, "-C", b.TempDir()).CombinedOutput(); err != nil {
				b.Fatalf("%v: %s", err, out)
			}
		}
	})
}
