package deps

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func openDir(t testing.TB, dir string) int {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	return fd
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// sparseFile makes a file of size bytes with data only at off.
func sparseFile(t testing.TB, path string, size, off int64, data []byte) {
	t.Helper()
	f, err := os.Create(path)
	must(t, err)
	defer f.Close()
	_, err = f.WriteAt(data, off)
	must(t, err)
	must(t, f.Truncate(size))
}

func stat(t testing.TB, path string) *syscall.Stat_t {
	t.Helper()
	fi, err := os.Lstat(path)
	must(t, err)
	return fi.Sys().(*syscall.Stat_t)
}

// TestCopyTree copies a tree with every kind of entry an install may
// leave: what arrives is the same tree, holes and hard links and mtimes
// kept, and what the copy charged is what the copy takes.
func TestCopyTree(t *testing.T) {
	t.Parallel()
	src, dst := t.TempDir(), filepath.Join(t.TempDir(), "site")
	must(t, os.MkdirAll(filepath.Join(src, "pkg", "sub", "empty"), 0o700))
	must(t, os.WriteFile(filepath.Join(src, "pkg", "__init__.py"), []byte("VALUE = 1\n"), 0o600))
	must(t, os.WriteFile(filepath.Join(src, "pkg", "tool"), []byte("#!/bin/sh\n"), 0o700))
	must(t, os.WriteFile(filepath.Join(src, "pkg", "empty"), nil, 0o644))
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	must(t, os.WriteFile(filepath.Join(src, "pkg", "big"), big, 0o644))
	sparseFile(t, filepath.Join(src, "pkg", "sparse"), 64<<20, 8<<20, []byte("data in a hole"))
	sparseFile(t, filepath.Join(src, "pkg", "allhole"), 32<<20, 0, nil)
	must(t, os.Link(filepath.Join(src, "pkg", "big"), filepath.Join(src, "pkg", "sub", "big2")))
	must(t, os.Link(filepath.Join(src, "pkg", "big"), filepath.Join(src, "big3")))
	must(t, os.Symlink("../__init__.py", filepath.Join(src, "pkg", "sub", "init")))
	must(t, os.Symlink(strings.Repeat("x/", 40)+"long", filepath.Join(src, "pkg", "long")))
	old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	must(t, os.Chtimes(filepath.Join(src, "pkg", "__init__.py"), old, old))

	var charged int64
	err := copyTree(openDir(t, src), dst, func(n int64) error { charged += n; return nil })
	must(t, err)

	for name, want := range map[string]string{"pkg/__init__.py": "VALUE = 1\n", "pkg/tool": "#!/bin/sh\n", "pkg/empty": "", "pkg/big": string(big)} {
		got, err := os.ReadFile(filepath.Join(dst, name))
		if err != nil || string(got) != want {
			t.Errorf("%s: %d bytes, %v", name, len(got), err)
		}
	}
	for name, want := range map[string]os.FileMode{"pkg": os.ModeDir | 0o755, "pkg/sub/empty": os.ModeDir | 0o755, "pkg/tool": 0o755, "pkg/__init__.py": 0o644} {
		if fi, err := os.Lstat(filepath.Join(dst, name)); err != nil || fi.Mode()&^0o022 != want&^0o022 {
			t.Errorf("%s: mode %v, want %v (%v)", name, fi.Mode(), want, err)
		}
	}
	if fi, _ := os.Stat(filepath.Join(dst, "pkg", "__init__.py")); !fi.ModTime().Equal(old) {
		t.Errorf("mtime %v, want %v", fi.ModTime(), old)
	}
	// Holes stay holes.
	sp := stat(t, filepath.Join(dst, "pkg", "sparse"))
	if sp.Size != 64<<20 || sp.Blocks*512 > 64<<10 {
		t.Errorf("sparse: %d bytes in %d bytes of blocks", sp.Size, sp.Blocks*512)
	}
	f, err := os.Open(filepath.Join(dst, "pkg", "sparse"))
	must(t, err)
	buf := make([]byte, 14)
	_, err = f.ReadAt(buf, 8<<20)
	f.Close()
	if err != nil || string(buf) != "data in a hole" {
		t.Errorf("sparse data: %q %v", buf, err)
	}
	if ah := stat(t, filepath.Join(dst, "pkg", "allhole")); ah.Size != 32<<20 || ah.Blocks != 0 {
		t.Errorf("allhole: %d bytes in %d blocks", ah.Size, ah.Blocks)
	}
	// One inode, three names.
	b := stat(t, filepath.Join(dst, "pkg", "big"))
	for _, other := range []string{"pkg/sub/big2", "big3"} {
		if o := stat(t, filepath.Join(dst, other)); o.Ino != b.Ino {
			t.Errorf("%s is not a link to pkg/big", other)
		}
	}
	if b.Nlink != 3 {
		t.Errorf("pkg/big has %d names", b.Nlink)
	}
	for name, want := range map[string]string{"pkg/sub/init": "../__init__.py", "pkg/long": strings.Repeat("x/", 40) + "long"} {
		if got, err := os.Readlink(filepath.Join(dst, name)); err != nil || got != want {
			t.Errorf("%s -> %q (%v)", name, got, err)
		}
	}
	if want, _ := diskUsage(dst); charged != want {
		t.Errorf("the copy charged %d bytes; it takes %d", charged, want)
	}
}

// TestEstimateTree: the first pass bounds what the copy is charged, from
// both sides, also for a directory that needs many blocks on the host.
func TestEstimateTree(t *testing.T) {
	t.Parallel()
	src, dst := t.TempDir(), filepath.Join(t.TempDir(), "site")
	must(t, os.MkdirAll(filepath.Join(src, "wide"), 0o755))
	for i := range 1500 {
		must(t, os.WriteFile(filepath.Join(src, "wide", fmt.Sprintf("a_rather_long_module_name_%05d.py", i)), []byte("x"), 0o644))
	}
	sparseFile(t, filepath.Join(src, "sparse"), 1<<30, 512<<20, bytes.Repeat([]byte{1}, 1<<20))
	must(t, os.WriteFile(filepath.Join(src, "f"), bytes.Repeat([]byte{2}, 3<<20), 0o644))
	for i := range 5 {
		must(t, os.Link(filepath.Join(src, "f"), filepath.Join(src, fmt.Sprintf("f%d", i))))
	}
	est, err := estimateTree(openDir(t, src))
	must(t, err)
	must(t, copyTree(openDir(t, src), dst, func(int64) error { return nil }))
	got, err := diskUsage(dst)
	must(t, err)
	t.Logf("estimate %d..%d, charge %d", est.low, est.high, got)
	if got < est.low || got > est.high || est.entries != 1500+1+1+1+5 {
		t.Errorf("charge %d outside the estimate %d..%d (%d entries)", got, est.low, est.high, est.entries)
	}
}

// TestCopyRefuses: what no environment may hold refuses the install, as
// an InstallError saying what and where.
func TestCopyRefuses(t *testing.T) {
	t.Parallel()
	for name, make := range map[string]func(t *testing.T, dir string) string{
		"fifo": func(t *testing.T, dir string) string {
			must(t, syscall.Mkfifo(filepath.Join(dir, "pkg", "fifo"), 0o644))
			return `a FIFO at "pkg/fifo": refused`
		},
		"socket": func(t *testing.T, dir string) string {
			l, err := net.Listen("unix", filepath.Join(dir, "pkg", "sock"))
			must(t, err)
			t.Cleanup(func() { l.Close() })
			return `a socket at "pkg/sock": refused`
		},
		"deep": func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "pkg")
			for range maxScratchDepth {
				p = filepath.Join(p, "d")
			}
			must(t, os.MkdirAll(p, 0o755))
			return "more than 32 levels deep"
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			src := t.TempDir()
			must(t, os.Mkdir(filepath.Join(src, "pkg"), 0o755))
			must(t, os.WriteFile(filepath.Join(src, "pkg", "a.py"), []byte("A = 1\n"), 0o644))
			want := make(t, src)
			var ie *InstallError
			_, err := estimateTree(openDir(t, src))
			if !errors.As(err, &ie) || !strings.Contains(err.Error(), want) {
				t.Errorf("estimate: %v, want an InstallError saying %s", err, want)
			}
			err = copyTree(openDir(t, src), filepath.Join(t.TempDir(), "site"), func(int64) error { return nil })
			if !errors.As(err, &ie) || !strings.Contains(err.Error(), want) {
				t.Errorf("copy: %v, want an InstallError saying %s", err, want)
			}
		})
	}
}

// TestCopyStopsWhenChargeFails: the copy stops at the first charge that
// does not fit, before writing what it was for.
func TestCopyStopsWhenChargeFails(t *testing.T) {
	t.Parallel()
	src, dst := t.TempDir(), filepath.Join(t.TempDir(), "site")
	for i := range 4 {
		must(t, os.WriteFile(filepath.Join(src, fmt.Sprint(i)), bytes.Repeat([]byte{1}, 1<<20), 0o644))
	}
	full := errors.New("full")
	var charged int64
	err := copyTree(openDir(t, src), dst, func(n int64) error {
		if charged+n > 2<<20 {
			return full
		}
		charged += n
		return nil
	})
	if !errors.Is(err, full) {
		t.Fatalf("err = %v", err)
	}
	if du, _ := duBytes(t, dst); du > 2<<20 {
		t.Errorf("%d bytes written under a 2 MiB charge", du)
	}
}

// TestCopyOutRefusesLinkedTarget: the installer's target must be a
// directory, not a symlink to one elsewhere.
func TestCopyOutRefusesLinkedTarget(t *testing.T) {
	t.Parallel()
	c := newTestCache(t, 1<<30)
	work := t.TempDir()
	must(t, os.Mkdir(filepath.Join(work, "elsewhere"), 0o755))
	must(t, os.Symlink("elsewhere", filepath.Join(work, "site")))
	res := c.newReservation()
	defer res.release()
	err := c.copyOut(openDir(t, work), "site", filepath.Join(t.TempDir(), "site"), res)
	var ie *InstallError
	if !errors.As(err, &ie) || !strings.Contains(err.Error(), "not a directory the server can read") {
		t.Errorf("err = %v", err)
	}
}

// BenchmarkCopyEnv copies a 200 MB environment-like tree (3 000 files of
// 8 KiB, 600 of 64 KiB, 10 of 14 MiB, in 60 directories) from a tmpfs,
// where installs are, to the cache's file system with copyTree and with
// `cp -a`, in the same run, and reports both and their ratio.
func BenchmarkCopyEnv(b *testing.B) {
	root := "/dev/shm"
	if fi, err := os.Stat(root); err != nil || !fi.IsDir() {
		root = ""
	}
	src, err := os.MkdirTemp(root, "pysbx-bench-")
	must(b, err)
	defer os.RemoveAll(src)
	rng := rand.New(rand.NewPCG(1, 2))
	var total int64
	write := func(name string, size int) {
		data := make([]byte, size)
		for i := 0; i < size; i += 8 {
			v := rng.Uint64()
			for j := 0; j < 8 && i+j < size; j++ {
				data[i+j] = byte(v >> (8 * j))
			}
		}
		p := filepath.Join(src, name)
		must(b, os.MkdirAll(filepath.Dir(p), 0o755))
		must(b, os.WriteFile(p, data, 0o644))
		total += int64(size)
	}
	for i := range 3000 {
		write(fmt.Sprintf("pkg%02d/mod%04d.py", i%60, i), 8<<10)
	}
	for i := range 600 {
		write(fmt.Sprintf("pkg%02d/data/blob%03d.bin", i%60, i), 64<<10)
	}
	for i := range 10 {
		write(fmt.Sprintf("pkg%02d/_ext%d.so", i, i), 14<<20)
	}
	dstRoot := b.TempDir()
	// Each copy is timed to its return (the data in the page cache) and to
	// the end of a sync of the file system (the data on the disk); the
	// sync also keeps one copy's writeback out of the next one's time.
	var ours, cp [2]time.Duration
	run := func(into *[2]time.Duration, copyFn func(dst string) error) {
		dst := filepath.Join(dstRoot, "site")
		start := time.Now()
		must(b, copyFn(dst))
		into[0] += time.Since(start)
		must(b, exec.Command("sync", "-f", dstRoot).Run())
		into[1] += time.Since(start)
		must(b, os.RemoveAll(dst))
		must(b, exec.Command("sync", "-f", dstRoot).Run())
	}
	copyEnv := func(dst string) error {
		return copyTree(openDir(b, src), dst, func(int64) error { return nil })
	}
	cpA := func(dst string) error { return exec.Command("cp", "-a", src, dst).Run() }
	for i := 0; b.Loop(); i++ {
		// Alternate which goes first.
		if i%2 == 0 {
			run(&ours, copyEnv)
			run(&cp, cpA)
		} else {
			run(&cp, cpA)
			run(&ours, copyEnv)
		}
	}
	ms := func(d time.Duration) float64 { return float64(d.Milliseconds()) / float64(b.N) }
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(total)/1e6, "MB")
	b.ReportMetric(ms(ours[0]), "copyTree-ms/op")
	b.ReportMetric(ms(cp[0]), "cp-a-ms/op")
	b.ReportMetric(float64(ours[0])/float64(cp[0]), "ratio")
	b.ReportMetric(ms(ours[1]), "copyTree+sync-ms/op")
	b.ReportMetric(ms(cp[1]), "cp-a+sync-ms/op")
	b.ReportMetric(float64(ours[1])/float64(cp[1]), "ratio+sync")
}

// TestCopyChargesUnexpectedData: data a file did not have when it was
// charged (it changed after it was looked at) is charged before it is
// written.
func TestCopyChargesUnexpectedData(t *testing.T) {
	t.Parallel()
	src := filepath.Join(t.TempDir(), "f")
	must(t, os.WriteFile(src, bytes.Repeat([]byte{1}, 1<<20+1), 0o644))
	sfd, err := unix.Open(src, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	must(t, err)
	defer unix.Close(sfd)
	dfd, err := unix.Open(filepath.Join(t.TempDir(), "g"), unix.O_WRONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
	must(t, err)
	defer unix.Close(dfd)
	var charged int64
	c := &copier{charge: func(n int64) error { charged += n; return nil }}
	extra, err := c.data(sfd, dfd, 1<<20+1, 4096)
	if err != nil || extra != 1<<20 || charged != extra {
		t.Errorf("extra %d, charged %d, %v; want 1 MiB", extra, charged, err)
	}
	full := errors.New("full")
	c.charge = func(int64) error { return full }
	if _, err := c.data(sfd, dfd, 1<<20+1, 4096); !errors.Is(err, full) {
		t.Errorf("a refused charge: %v", err)
	}
}
