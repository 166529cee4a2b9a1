package pydist

import (
	"archive/tar"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pysandbox/pysandbox/internal/deps"
	"github.com/pysandbox/pysandbox/internal/egress"
	"github.com/pysandbox/pysandbox/internal/sandbox"
)

func TestInstallFromMirror(t *testing.T) {
	f := newFixture(t)
	var lines []string
	var mu sync.Mutex
	it, err := f.m.Find(ctxFor(t), Request{Version: f.archive.MajorMinor(), Who: Who{Identity: "alice", Tool: "run"}, Progress: func(s string) {
		mu.Lock()
		lines = append(lines, s)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	if it.Version != f.archive.Version() || it.Source != SourceManaged || !strings.HasPrefix(it.Path, it.Prefix+"/bin/") {
		t.Fatalf("interpreter = %+v", it)
	}
	if f.mirror.Hits(f.path) != 1 {
		t.Errorf("mirror hits = %d, want 1", f.mirror.Hits(f.path))
	}
	mu.Lock()
	joined := strings.Join(lines, "\n")
	mu.Unlock()
	for _, want := range []string{"downloading " + f.mirror.URL + f.path, "SHA-256 verified", "checking that it runs"} {
		if !strings.Contains(joined, want) {
			t.Errorf("progress lacks %q:\n%s", want, joined)
		}
	}
	// The tree is read-only for everyone but the server, and has no
	// archive left beside it.
	fi, err := os.Stat(it.Path)
	if err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("interpreter mode: %v %v", fi, err)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(it.Prefix), "archive.tar.gz")); !os.IsNotExist(err) {
		t.Errorf("the archive was left in the cache: %v", err)
	}
	e := <-f.events
	if e.Action != "install" || e.Outcome != "installed" || e.Who.Identity != "alice" || e.SHA256 != f.archive.SHA256 || e.Bytes != f.archive.Size {
		t.Errorf("event = %+v", e)
	}
	// The connection went through the proxy, recorded for the caller.
	rec := <-f.records
	if rec.Tool != "python-download" || rec.Identity != "alice" || rec.Decision != egress.Allowed || rec.BytesIn < f.archive.Size {
		t.Errorf("egress record = %+v", rec)
	}
	// A second request finds it installed: no download.
	it2, err := f.m.Find(ctxFor(t), Request{Version: f.archive.Version()})
	if err != nil || it2.Path != it.Path {
		t.Fatalf("second find: %v %v", it2, err)
	}
	if f.mirror.Hits(f.path) != 1 {
		t.Errorf("mirror hits after a second find = %d", f.mirror.Hits(f.path))
	}
	// In use: not removable, not evicted.
	if _, err := f.m.Remove(f.archive.MajorMinor(), Who{}); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Errorf("remove of an interpreter in use: %v", err)
	}
	f.m.Close()
	removed, err := f.m.Remove(f.archive.MajorMinor(), Who{Identity: "cli"})
	if err != nil || len(removed) != 1 {
		t.Fatalf("remove: %v %v", removed, err)
	}
	if _, err := os.Stat(it.Path); !os.IsNotExist(err) {
		t.Errorf("removed interpreter still there: %v", err)
	}
}

func TestConcurrentFirstRequestsDownloadOnce(t *testing.T) {
	f := newFixture(t)
	f.mirror.Delay = 200 * time.Millisecond
	var wg sync.WaitGroup
	paths := make([]string, 4)
	errs := make([]error, 4)
	for i := range paths {
		wg.Add(1)
		go func() {
			defer wg.Done()
			it, err := f.m.Find(ctxFor(t), Request{Version: f.archive.MajorMinor()})
			errs[i] = err
			if it != nil {
				paths[i] = it.Path
			}
		}()
	}
	wg.Wait()
	for i := range paths {
		if errs[i] != nil || paths[i] != paths[0] {
			t.Fatalf("caller %d: %q %v (first: %q)", i, paths[i], errs[i], paths[0])
		}
	}
	if n := f.mirror.Hits(f.path); n != 1 {
		t.Errorf("mirror hits = %d, want 1", n)
	}
}

func TestHostileArchives(t *testing.T) {
	a := systemArchive(t)
	good := mustRead(t, a.Path)
	for _, tc := range []struct {
		name     string
		data     []byte
		sum      string // "" = the data's own
		patch    int    // -1 = the archive's
		outcome  string
		want     string
		cacheCap int64
	}{
		{name: "digest mismatch", data: good, sum: strings.Repeat("ab", 32), patch: -1, outcome: "refused", want: "it was deleted unread"},
		{name: "truncated", data: good[:len(good)/2], patch: -1, outcome: "refused", want: "is truncated"},
		{name: "wrong version inside", data: good, patch: 99, outcome: "refused", want: "not the 3." + strconv.Itoa(a.Minor) + ".99"},
		{name: "does not run", data: tarGz(t, top, binDir, ent{name: fmt.Sprintf("python/bin/python3.%d", a.Minor), typ: tar.TypeReg, body: "\x7fELF garbage", mode: 0o755}), patch: -1, outcome: "refused", want: "does not run here"},
		{name: "escaping symlink", data: tarGz(t, top, binDir, ent{name: "python/lib", typ: tar.TypeSymlink, link: "/"}), patch: -1, outcome: "refused", want: "symlink out of the tree"},
		{name: "cache too small", data: good, patch: -1, outcome: "failed", want: "more than the whole cache may hold", cacheCap: 8 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sum := tc.sum
			if sum == "" {
				sum = sha(tc.data)
			}
			patch := tc.patch
			if patch < 0 {
				patch = a.Patch
			}
			var mods []func(*Config)
			f, ver := hostileFixture(t, tc.data, sum, 3, a.Minor, patch, mods...)
			if tc.cacheCap > 0 {
				f.dir = cacheDir(t)
				cache, err := deps.New(deps.Config{Dir: f.dir, Backend: sandbox.NewNative(), MaxBytes: tc.cacheCap})
				if err != nil {
					t.Fatal(err)
				}
				f.cache, f.m.cfg.Cache = cache, cache
			}
			_, err := f.m.Find(ctxFor(t), Request{Version: ver})
			var ie *InstallError
			if !errors.As(err, &ie) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want an InstallError saying %q", err, tc.want)
			}
			e := <-f.events
			if e.Outcome != tc.outcome {
				t.Errorf("event outcome = %q (%s), want %q", e.Outcome, e.Error, tc.outcome)
			}
			assertNothingLeft(t, f)
			// Nothing of the build is left either: the build directory is
			// empty again.
			builds, _ := os.ReadDir(filepath.Join(f.dir, "build"))
			if len(builds) != 0 {
				t.Errorf("build directory not cleaned: %v", builds)
			}
		})
	}
}

// A disk that fills while the archive is saved or unpacked: a plain
// answer, and nothing left behind.
func TestDiskFull(t *testing.T) {
	a := systemArchive(t)
	for _, size := range []string{"8m", "24m"} { // the download fills it; the unpack does
		t.Run(size, func(t *testing.T) {
			dir := cacheDir(t)
			if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
				t.Skipf("cannot mount a small tmpfs here (%v): needs root", err)
			}
			t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
			f := newFixture(t)
			cache, err := deps.New(deps.Config{Dir: dir, Backend: sandbox.NewNative()})
			if err != nil {
				t.Fatal(err)
			}
			f.dir, f.cache, f.m.cfg.Cache = dir, cache, cache
			_, err = f.m.Find(ctxFor(t), Request{Version: a.MajorMinor()})
			if err == nil || !strings.Contains(err.Error(), "the disk holding the cache is full") {
				t.Fatalf("err = %v", err)
			}
			assertNothingLeft(t, f)
			builds, _ := os.ReadDir(filepath.Join(dir, "build"))
			if len(builds) != 0 {
				t.Errorf("build directory not cleaned: %v", builds)
			}
		})
	}
}

// A failed install is remembered for a while: the same request gets the
// same answer at once, without another download.
func TestFailureRemembered(t *testing.T) {
	a := systemArchive(t)
	f, ver := hostileFixture(t, mustRead(t, a.Path), strings.Repeat("ab", 32), 3, a.Minor, a.Patch)
	for i := range 2 {
		_, err := f.m.Find(ctxFor(t), Request{Version: ver})
		if err == nil || !strings.Contains(err.Error(), "deleted unread") {
			t.Fatalf("try %d: %v", i, err)
		}
	}
	if n := f.mirror.Hits(f.path); n != 1 {
		t.Errorf("mirror hits = %d, want 1", n)
	}
}
