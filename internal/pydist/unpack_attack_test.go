package pydist

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// ATTACK: a gzip member that goes on after the tar's end-of-archive
// marker. unpack drains the rest of the member to check its CRC
// (io.Copy(io.Discard, zr)), with no bound and no context: an archive of
// the 512 MiB the download allows holds ~0.5 TB of zeros there, hours of
// one CPU per install that no timeout stops (unpack takes no ctx).
func TestAttackGzipTrailerBomb(t *testing.T) {
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	tw := tar.NewWriter(zw)
	for _, e := range []ent{top, binDir, exe} {
		tw.WriteHeader(&tar.Header{Name: e.name, Typeflag: e.typ, Mode: 0o755, Size: int64(len(e.body))})
		tw.Write([]byte(e.body))
	}
	tw.Close()
	zeros := make([]byte, 1<<20)
	const trailer = 2 << 30 // 2 GiB of zeros after the end-of-archive marker
	for i := 0; i < trailer>>20; i++ {
		zw.Write(zeros)
	}
	zw.Close()
	t.Logf("archive: %d bytes (%.0f:1)", buf.Len(), float64(trailer)/float64(buf.Len()))
	start := time.Now()
	_, err := unpackInto(t, buf.Bytes(), 1<<30, nil)
	took := time.Since(start)
	perByte := took.Seconds() / float64(buf.Len())
	t.Logf("unpack: err=%v, took %v; at this rate a 512 MiB archive takes %.0f minutes of CPU", err, took, perByte*float64(512<<20)/60)
	if err == nil && took > time.Second {
		t.Errorf("BOMB: the unpacker decompressed %d GiB of trailer the tar never uses (%v)", trailer>>30, took)
	}
}

// ATTACK: the unpacker remembers every entry's name (u.files) for the
// whole unpack; names may be 4 KiB and entries 200 000: ~0.8 GB of server
// heap from an archive of a few MB. Measured here at 1/4 scale.
func TestAttackNameMemory(t *testing.T) {
	const n = 50_000
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	long := "python/" + strings.Repeat(strings.Repeat("d", 250)+"/", 15)
	tw.WriteHeader(&tar.Header{Name: "python/bin/", Typeflag: tar.TypeDir, Mode: 0o755})
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("%s%0120d", long, i) // 3892 bytes each
		tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: 0o755})
	}
	tw.Close()
	zw.Close()
	t.Logf("archive: %d bytes for %d entries", buf.Len(), n)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	var peak uint64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
				var m runtime.MemStats
				runtime.ReadMemStats(&m)
				peak = max(peak, m.HeapInuse)
			}
		}
	}()
	start := time.Now()
	_, err := unpackInto(t, buf.Bytes(), 1<<30, nil)
	close(stop)
	<-done
	runtime.ReadMemStats(&after)
	t.Logf("unpack: err=%v in %v; heap in use before %d MiB, peak %d MiB (x4 for 200 000 entries)", err, time.Since(start), before.HeapInuse>>20, peak>>20)
}

// A directory entry that comes after entries inside it (GNU tar with
// --no-recursion lists, or an archive re-ordered by a mirror's repacker)
// is refused as a duplicate: "python/bin" was recorded by its contents.
func TestAttackDirAfterContents(t *testing.T) {
	data := tarGz(t, top, exe, binDir)
	_, err := unpackInto(t, data, 1<<30, nil)
	t.Logf("err = %v", err)
	if err != nil && strings.Contains(err.Error(), "twice") {
		t.Errorf("MISLEADING: a well-formed archive whose directory entry follows its contents is refused: %v", err)
	}
}

// A name the file system refuses (a 300-byte element) fails as "failed",
// not "refused", and not as an *ArchiveError: the audit outcome and the
// agent's message blame the server's disk rather than the archive.
func TestAttackLongElement(t *testing.T) {
	data := tarGz(t, top, binDir, exe, ent{name: "python/lib/" + strings.Repeat("x", 300), typ: tar.TypeReg, body: "x"})
	_, err := unpackInto(t, data, 1<<30, nil)
	var ae *ArchiveError
	t.Logf("err = %v (ArchiveError: %v)", err, errors.As(err, &ae))
	if err != nil && !errors.As(err, &ae) {
		t.Errorf("MISCLASSIFIED: %v", err)
	}
}

// Extra hostile shapes that should all be refused or contained.
func TestAttackUnpackMore(t *testing.T) {
	for _, tc := range []struct {
		name string
		ents []ent
	}{
		{"loop", []ent{top, binDir, {name: "python/a", typ: tar.TypeSymlink, link: "b"}, {name: "python/b", typ: tar.TypeSymlink, link: "a"}}},
		{"hardlink through symlink", []ent{top, binDir, exe, {name: "python/s", typ: tar.TypeSymlink, link: "bin"}, {name: "python/h", typ: tar.TypeLink, link: "python/s/python3.11"}}},
		{"hardlink to symlink", []ent{top, binDir, {name: "python/s", typ: tar.TypeSymlink, link: "bin"}, {name: "python/h", typ: tar.TypeLink, link: "python/s"}}},
		{"hardlink to self", []ent{top, binDir, {name: "python/h", typ: tar.TypeLink, link: "python/h"}}},
		{"symlink then dir same name", []ent{top, binDir, {name: "python/lib", typ: tar.TypeSymlink, link: "bin"}, {name: "python/lib/", typ: tar.TypeDir}}},
		{"file then dir under it", []ent{top, binDir, {name: "python/f", typ: tar.TypeReg, body: "x"}, {name: "python/f/g", typ: tar.TypeReg, body: "x"}}},
		{"dot path dup", []ent{top, binDir, exe, {name: "./python/./bin//python3.11", typ: tar.TypeReg, body: "y"}}},
		{"symlink up via link", []ent{top, binDir, {name: "python/a/b/", typ: tar.TypeDir}, {name: "python/a/b/s", typ: tar.TypeSymlink, link: ".."}, {name: "python/a/b/L", typ: tar.TypeSymlink, link: "s/../../../x"}}},
		{"dangling via missing", []ent{top, binDir, {name: "python/L", typ: tar.TypeSymlink, link: "missing/../../x"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, err := unpackInto(t, tarGz(t, tc.ents...), 1<<30, nil)
			t.Logf("err = %v", err)
			if err == nil {
				filepath.Walk(dir, func(p string, fi os.FileInfo, _ error) error {
					if fi != nil && fi.Mode()&os.ModeSymlink != 0 {
						l, _ := os.Readlink(p)
						r, _ := filepath.EvalSymlinks(p)
						t.Logf("  %s -> %s (%s)", p, l, r)
						if r != "" && !strings.HasPrefix(r, dir) {
							t.Errorf("ESCAPE: %s resolves to %s", p, r)
						}
					}
					return nil
				})
			}
		})
	}
	_ = io.EOF
}
