package deps

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/testutil/pypi"
)

// The installs here are hostile: their build code (an sdist's in-tree
// backend, with AllowSdist) leaves things in the installer's target
// (/work/site) beside the package it builds, then hands over a wheel.

// hostileSdist is an sdist-only package whose build runs hook.
func hostileSdist(t *testing.T, name, hook string) pypi.Package {
	t.Helper()
	p := pypi.Package{Name: name, Version: "1.0", SdistOnly: true}
	backend, err := pypi.WheelBackend(p, hook)
	if err != nil {
		t.Fatal(err)
	}
	p.Backend = backend
	return p
}

// duBytes is what du(1) says dir takes: the allocated blocks of each
// distinct inode below it, following no symlink.
func duBytes(t *testing.T, dir string) (bytes, inodes int64) {
	t.Helper()
	seen := map[devIno]bool{}
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // a concurrent install or eviction moved it
		}
		var st syscall.Stat_t
		if syscall.Lstat(path, &st) != nil {
			return nil
		}
		k := devIno{st.Dev, st.Ino}
		if seen[k] {
			return nil
		}
		seen[k] = true
		bytes += st.Blocks * 512
		inodes++
		return nil
	})
	return bytes, inodes
}

// envCharge checks that what the cache charges an env is what it takes:
// du's blocks plus InodeCost for each inode.
func envCharge(t *testing.T, c *Cache, env *Env) {
	t.Helper()
	du, inodes := duBytes(t, c.envDir(env.Key))
	if want := du + inodes*InodeCost; env.SizeBytes != want {
		t.Errorf("env %s charged %d bytes; du says %d in %d inodes, so %d", env.Key, env.SizeBytes, du, inodes, want)
	}
}

// TestSparseFilesStaySparse: build code leaves eight sparse files of 255
// MiB (2 GiB apparent, 64 KiB of data) in the target. They take nothing in
// the scratch tmpfs, and take nothing more on the host: the copy keeps the
// holes, and the env is charged what it takes.
func TestSparseFilesStaySparse(t *testing.T) {
	t.Parallel()
	py := systemPython(t)
	p := hostileSdist(t, "pysbx-sparse", `
d = "/work/site/pysbx_sparse_junk"
os.makedirs(d, exist_ok=True)
for i in range(8):
    with open(os.path.join(d, "hole%d" % i), "wb") as f:
        if i == 0:
            f.seek(100 << 20)
            f.write(b"x" * (64 << 10))
        f.truncate(255 << 20)`)
	ix := pypi.NewIndex(t, p)
	c := newCache(t, IndexConfig{IndexURL: ix.URL, AllowSdist: true})
	c.cfg.MaxBytes = 64 << 20
	env, release, err := ensure(t, c, py, []string{"pysbx-sparse"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if got := importValues(t, py.Path, env.Site, "pysbx_sparse"); got != "pysbx-sparse-1.0" {
		t.Errorf("VALUE = %q", got)
	}
	for i := range 8 {
		fi, err := os.Lstat(filepath.Join(env.Site, "pysbx_sparse_junk", "hole"+strconv.Itoa(i)))
		if err != nil {
			t.Fatal(err)
		}
		blocks := fi.Sys().(*syscall.Stat_t).Blocks * 512
		if fi.Size() != 255<<20 || (i == 0 && blocks > 1<<20) || (i > 0 && blocks > 0) {
			t.Errorf("hole%d: %d bytes in %d bytes of blocks", i, fi.Size(), blocks)
		}
	}
	f, err := os.Open(filepath.Join(env.Site, "pysbx_sparse_junk", "hole0"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	if _, err := f.ReadAt(buf, 100<<20); err != nil || strings.Trim(string(buf), "x") != "" {
		t.Errorf("the data in hole0 was not copied: %v", err)
	}
	if _, err := f.ReadAt(buf, 200<<20); err != nil || strings.Trim(string(buf), "\x00") != "" {
		t.Errorf("hole0's hole reads %q..., %v", buf[:8], err)
	}
	envCharge(t, c, env)
	if env.SizeBytes > 1<<20 {
		t.Errorf("charged %d bytes for 64 KiB of data", env.SizeBytes)
	}
	if du, _ := duBytes(t, c.cfg.Dir); du > c.cfg.MaxBytes {
		t.Errorf("the cache takes %d bytes, over its cap of %d", du, c.cfg.MaxBytes)
	}
}

// TestHardLinksCopiedOnce: build code leaves one 16 MiB file under ten
// names. It is copied once, the other names are linked to it, and it is
// charged once: 16 MiB, not the 160 MiB a copy per name would take (more
// than the cap).
func TestHardLinksCopiedOnce(t *testing.T) {
	// Not parallel: TestSdistBuildCannotFillTheDisk watches the host's
	// free space.
	py := systemPython(t)
	p := hostileSdist(t, "pysbx-links", `
d = "/work/site/pysbx_links_junk"
os.makedirs(d, exist_ok=True)
big = os.path.join(d, "big")
if not os.path.exists(big):
    with open(big, "wb") as f:
        for _ in range(16):
            f.write(b"x" * (1 << 20))
    for i in range(9):
        os.link(big, os.path.join(d, "name%d" % i))`)
	ix := pypi.NewIndex(t, p)
	c := newCache(t, IndexConfig{IndexURL: ix.URL, AllowSdist: true})
	c.cfg.MaxBytes = 64 << 20
	env, release, err := ensure(t, c, py, []string{"pysbx-links"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	junk := filepath.Join(env.Site, "pysbx_links_junk")
	big, err := os.Lstat(filepath.Join(junk, "big"))
	if err != nil {
		t.Fatal(err)
	}
	if n := big.Sys().(*syscall.Stat_t).Nlink; n != 10 || big.Size() != 16<<20 {
		t.Errorf("big: %d names, %d bytes; want 10 names, 16 MiB", n, big.Size())
	}
	for i := range 9 {
		fi, err := os.Lstat(filepath.Join(junk, "name"+strconv.Itoa(i)))
		if err != nil || !os.SameFile(fi, big) {
			t.Errorf("name%d is not big: %v", i, err)
		}
	}
	envCharge(t, c, env)
	if env.SizeBytes > 17<<20 {
		t.Errorf("charged %d bytes for one 16 MiB file", env.SizeBytes)
	}
	if du, _ := duBytes(t, c.cfg.Dir); du > c.cfg.MaxBytes {
		t.Errorf("the cache takes %d bytes, over its cap of %d", du, c.cfg.MaxBytes)
	}
}

// TestSpecialFilesRefused: a FIFO or a socket in the install refuses it,
// and nothing is left.
func TestSpecialFilesRefused(t *testing.T) {
	t.Parallel()
	py := systemPython(t)
	ix := pypi.NewIndex(t,
		hostileSdist(t, "pysbx-fifo", `
os.makedirs("/work/site", exist_ok=True)
try:
    os.mkfifo("/work/site/pysbx_fifo_junk")
except FileExistsError:
    pass`),
		hostileSdist(t, "pysbx-sock", `
import socket
os.makedirs("/work/site", exist_ok=True)
try:
    socket.socket(socket.AF_UNIX).bind("/work/site/pysbx_sock_junk")
except OSError as e:
    print("pysbx-sock:", e)`))
	for req, want := range map[string]string{
		"pysbx-fifo": `a FIFO at "pysbx_fifo_junk": refused`,
		"pysbx-sock": `a socket at "pysbx_sock_junk": refused`,
	} {
		t.Run(req, func(t *testing.T) {
			t.Parallel()
			c := newCache(t, IndexConfig{IndexURL: ix.URL, AllowSdist: true})
			_, _, err := ensure(t, c, py, []string{req}, nil)
			var ie *InstallError
			if !errors.As(err, &ie) || !strings.Contains(err.Error(), want) {
				out := ""
				if ie != nil {
					out = ie.Output
				}
				t.Fatalf("err = %v, want an InstallError saying %s\n%s", err, want, out)
			}
			assertNoBuilds(t, c)
			if list, _ := c.List(); len(list) != 0 {
				t.Errorf("envs: %+v", list)
			}
		})
	}
}

// TestManySmallFiles: a plain wheel of 20 000 one-byte files. Its apparent
// size is 20 KB; on the host it takes a block and an inode per file. Under
// a cap of 64 MiB it is refused before anything is copied; under 256 MiB
// it is charged what it takes.
func TestManySmallFiles(t *testing.T) {
	// Not parallel: TestSdistBuildCannotFillTheDisk watches the host's
	// free space.
	py := systemPython(t)
	files := map[string]string{"pysbx_many/__init__.py": "VALUE = 'many'\n"}
	for i := range 20_000 {
		files[fmt.Sprintf("pysbx_many/d%02d/f%05d", i/1000, i)] = "x"
	}
	ix := pypi.NewIndex(t, pypi.Package{Name: "pysbx-many", Version: "1.0", Files: files})
	c := newCache(t, IndexConfig{IndexURL: ix.URL})
	c.cfg.MaxBytes = 64 << 20
	_, _, err := ensure(t, c, py, []string{"pysbx-many"}, nil)
	var ie *InstallError
	if !errors.As(err, &ie) || !strings.Contains(err.Error(), "more than the whole cache may hold (64.0 MiB)") {
		t.Fatalf("under a 64 MiB cap: %v", err)
	}
	t.Logf("refused: %v", err)
	assertNoBuilds(t, c)
	if du, _ := duBytes(t, c.cfg.Dir); du > 1<<20 {
		t.Errorf("a refused install left %d bytes in the cache", du)
	}

	c.cfg.MaxBytes = 256 << 20
	env, release, err := ensure(t, c, py, []string{"pysbx-many"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	envCharge(t, c, env)
	if env.SizeBytes < 20_000*InodeCost {
		t.Errorf("20 000 files charged %d bytes", env.SizeBytes)
	}
	du, inodes := duBytes(t, c.cfg.Dir)
	t.Logf("env charged %s; the cache takes %s in %d inodes (du)", mib(env.SizeBytes), mib(du), inodes)
	if du > c.cfg.MaxBytes {
		t.Errorf("the cache takes %d bytes, over its cap of %d", du, c.cfg.MaxBytes)
	}
}

// TestConcurrentSpellingsKeepTheCap: six spellings of one requirement (five
// keys) installed at once, each env 2 GiB apparent (eight sparse files)
// with 24 MiB of data, against a cap of 64 MiB, every caller holding its
// env until all have returned. Two fit; the others are refused, saying the
// cache is full, before they copy anything. What the cache directory
// takes (du) never goes over the cap, and the server's memory does not
// grow with what it copies.
func TestConcurrentSpellingsKeepTheCap(t *testing.T) {
	// Not parallel: it measures the process's peak memory.
	py := systemPython(t)
	p := hostileSdist(t, "pysbx-conc", `
d = "/work/site/pysbx_conc_junk"
os.makedirs(d, exist_ok=True)
for i in range(8):
    with open(os.path.join(d, "hole%d" % i), "wb") as f:
        f.truncate(255 << 20)
with open(os.path.join(d, "dense"), "wb") as f:
    for _ in range(24):
        f.write(b"x" * (1 << 20))`)
	ix := pypi.NewIndex(t, p)
	c := newCache(t, IndexConfig{IndexURL: ix.URL, AllowSdist: true})
	c.cfg.MaxBytes = 64 << 20
	spellings := []string{"pysbx-conc", "Pysbx_Conc", "PYSBX.CONC==1.0", "pysbx-conc>=0.1", "pysbx-conc<2", "pysbx-conc!=0.5"}

	// Sample what the cache takes while the installs run.
	stop := make(chan struct{})
	sampled := make(chan int64)
	go func() {
		var peak int64
		for {
			du, _ := duBytes(t, c.cfg.Dir)
			peak = max(peak, du)
			select {
			case <-stop:
				sampled <- peak
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	rss := startPeakRSS(t)

	var wg, returned sync.WaitGroup
	envs := make([]*Env, len(spellings))
	errs := make([]error, len(spellings))
	all := make(chan struct{})
	for i, req := range spellings {
		wg.Add(1)
		returned.Add(1)
		go func() {
			defer wg.Done()
			env, release, err := c.Ensure(context.Background(), py, []string{req}, nil)
			envs[i], errs[i] = env, err
			returned.Done()
			if release != nil {
				<-all // in use until every call has returned
				release()
			}
		}()
	}
	returned.Wait()
	close(all)
	wg.Wait()
	grew := rss()
	close(stop)
	peak := <-sampled

	ok := map[string]int64{}
	for i, err := range errs {
		var ie *InstallError
		switch {
		case err == nil:
			t.Logf("%-18s ok, env %s charged %s", spellings[i], envs[i].Key[:8], mib(envs[i].SizeBytes))
			ok[envs[i].Key] = envs[i].SizeBytes
		case errors.As(err, &ie) && strings.Contains(err.Error(), "the dependency cache is full"):
			t.Logf("%-18s refused: %v", spellings[i], err)
		default:
			t.Errorf("%s: %v", spellings[i], err)
		}
	}
	var held int64
	for _, n := range ok {
		held += n
	}
	if len(ok) == 0 || held > c.cfg.MaxBytes {
		t.Errorf("%d envs held %d bytes together (cap %d)", len(ok), held, c.cfg.MaxBytes)
	}
	t.Logf("the cache took at most %s (du) under a cap of %s; the test process's peak RSS grew by %s", mib(peak), mib(c.cfg.MaxBytes), mib(grew))
	if peak > c.cfg.MaxBytes {
		t.Errorf("the cache took %d bytes, over its cap of %d", peak, c.cfg.MaxBytes)
	}
	if grew > 32<<20 {
		t.Errorf("the peak RSS grew by %d bytes copying %d bytes", grew, held)
	}

	// All released: what List charges is what is on disk, within the cap.
	list, err := c.List()
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for i := range list {
		envCharge(t, c, &list[i])
		total += list[i].SizeBytes
	}
	if total > c.cfg.MaxBytes {
		t.Errorf("List: %d bytes in %d envs, over the cap", total, len(list))
	}
	// Now there is room: the least recently used env makes way.
	for i, err := range errs {
		if err == nil {
			continue
		}
		env, release, err := c.Ensure(context.Background(), py, []string{spellings[i]}, nil)
		if err != nil {
			t.Fatalf("%s after the others were released: %v", spellings[i], err)
		}
		release()
		envCharge(t, c, env)
		break
	}
	if du, _ := duBytes(t, c.cfg.Dir); du > c.cfg.MaxBytes {
		t.Errorf("the cache takes %d bytes, over its cap of %d", du, c.cfg.MaxBytes)
	}
	assertNoBuilds(t, c)
}

// startPeakRSS resets the process's peak RSS (VmHWM) and returns a func
// that says how far it rose above the RSS at the start. Where the reset is
// not allowed, the peak since the process started stands in, and the
// figure is only an upper bound of the growth.
func startPeakRSS(t *testing.T) func() int64 {
	t.Helper()
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		t.Logf("cannot reset the peak RSS: %v", err)
	}
	before := procStatus(t, "VmRSS")
	return func() int64 { return procStatus(t, "VmHWM") - before }
}

// procStatus reads a kB field of /proc/self/status, in bytes.
func procStatus(t *testing.T, field string) int64 {
	t.Helper()
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n << 10
		}
	}
	t.Fatalf("no %s in /proc/self/status", field)
	return 0
}
