package deps

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/egress"

	"github.com/pysandbox/pysandbox/internal/interp"
	"github.com/pysandbox/pysandbox/internal/sandbox"
	"github.com/pysandbox/pysandbox/internal/testutil/pypi"
)

func TestMain(m *testing.M) {
	// The native backend re-executes this test binary as the sandbox init.
	sandbox.InitMain()
	os.Exit(m.Run())
}

var (
	alpha = pypi.Package{Name: "pysbx-alpha", Version: "1.0.0", Requires: []string{"pysbx-beta>=1.0"}}
	beta  = pypi.Package{Name: "pysbx-beta", Version: "1.0.0"}
	gamma = pypi.Package{Name: "pysbx-gamma", Version: "2.0.0"}
	// srcOnly is published as an sdist only: installing it means running
	// its setup.py.
	srcOnly = pypi.Package{Name: "pysbx-src", Version: "1.0.0"}
)

// newIndex serves alpha, beta, gamma (wheels) and srcOnly (an sdist), with
// a wheelhouse the sandbox user can read (mode 0755; t.TempDir's parent
// is 0700, which a bind mount does not care about).
func newIndex(t *testing.T) *pypi.Index {
	t.Helper()
	ix := pypi.NewIndex(t, alpha, beta, gamma)
	if _, err := ix.AddSdist(srcOnly); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(ix.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return ix
}

type testLog struct {
	t  *testing.T
	mu sync.Mutex
	ok bool
}

func (w *testLog) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ok {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func newCache(t *testing.T, ix IndexConfig) *Cache {
	t.Helper()
	lw := &testLog{t: t, ok: true}
	t.Cleanup(func() { lw.mu.Lock(); lw.ok = false; lw.mu.Unlock() })
	c, err := New(Config{
		Dir:     filepath.Join(t.TempDir(), "cache"),
		Index:   ix,
		Backend: sandbox.NewNative(),
		Limits:  sandbox.Limits{MemoryBytes: 1 << 30, MaxProcs: 128, TmpBytes: 256 << 20},
		Timeout: 2 * time.Minute,
		Network: egress.New(egress.Config{}).Installer,
		Logger:  slog.New(slog.NewTextHandler(lw, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

var (
	pipOnce sync.Once
	pipErr  error
	sysPy   *interp.Interpreter
)

// systemPython is /usr/bin/python3, which must have pip (Debian's
// python3-pip) for the install tests.
func systemPython(t *testing.T) *interp.Interpreter {
	t.Helper()
	pipOnce.Do(func() {
		sysPy, pipErr = interp.Find(context.Background(), "")
		if pipErr == nil {
			pipErr = exec.Command(sysPy.Path, "-I", "-m", "pip", "--version").Run()
		}
	})
	if pipErr != nil {
		t.Skipf("no python3 with pip: %v", pipErr)
	}
	return sysPy
}

// ensure is Ensure that skips when this machine cannot run sandboxes.
func ensure(t *testing.T, c *Cache, py *interp.Interpreter, reqs []string, progress func(string)) (*Env, func(), error) {
	t.Helper()
	env, release, err := c.Ensure(context.Background(), py, reqs, progress)
	if errors.Is(err, sandbox.ErrUnavailable) {
		t.Skipf("native sandbox unavailable: %v", err)
	}
	return env, release, err
}

// importValues imports modules from site with py on the host and returns
// their VALUEs, space-separated. -B: never write bytecode into the env.
func importValues(t *testing.T, py, site string, mods ...string) string {
	t.Helper()
	code := "import sys, importlib; sys.path.insert(0, sys.argv[1]); print(' '.join(importlib.import_module(m).VALUE for m in sys.argv[2:]))"
	out, err := exec.Command(py, append([]string{"-I", "-B", "-c", code, site}, mods...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("import from %s: %v\n%s", site, err, out)
	}
	return strings.TrimSpace(string(out))
}

// assertNoBuilds checks that no build directory was left behind.
func assertNoBuilds(t *testing.T, c *Cache) {
	t.Helper()
	ents, err := os.ReadDir(c.buildDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 0 {
		t.Errorf("build dirs left behind: %v", ents)
	}
}

func TestTransitiveInstallAndCacheHit(t *testing.T) {
	t.Parallel()
	py := systemPython(t)
	ix := newIndex(t)
	c := newCache(t, IndexConfig{IndexURL: ix.URL})

	var mu sync.Mutex
	var lines []string
	env, release, err := ensure(t, c, py, []string{"pysbx-alpha"}, func(l string) {
		mu.Lock()
		lines = append(lines, l)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	t.Logf("env %+v", env)
	mu.Lock()
	t.Logf("progress: %q", lines)
	if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, "Collecting pysbx-alpha") }) ||
		!slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, "Installing collected packages:") }) {
		t.Errorf("progress lacks Collecting/Installing lines: %q", lines)
	}
	mu.Unlock()
	if got, want := importValues(t, py.Path, env.Site, "pysbx_alpha", "pysbx_beta"), "pysbx-alpha-1.0.0 pysbx-beta-1.0.0"; got != want {
		t.Errorf("VALUEs = %q, want %q", got, want)
	}
	if !slices.Equal(env.Requirements, []string{"pysbx-alpha"}) || env.Python != py.Version || env.SizeBytes <= 0 {
		t.Errorf("env = %+v", env)
	}
	if want := filepath.Join(c.cfg.Dir, "envs", env.Key, "site"); env.Site != want {
		t.Errorf("Site = %s, want %s", env.Site, want)
	}
	if ix.TotalFileDownloads() != 2 {
		t.Errorf("downloads = %d, want 2 (alpha and beta)", ix.TotalFileDownloads())
	}
	assertNoBuilds(t, c)

	// The hit: same key and site, no request to the index, no installer.
	before, hits, installs := ix.TotalFileDownloads(), ix.TotalHits(), c.Installs()
	time.Sleep(20 * time.Millisecond) // so the touch is visible in LastUsed
	start := time.Now()
	env2, release2, err := c.Ensure(context.Background(), py, []string{"Pysbx_Alpha"}, nil)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	defer release2()
	t.Logf("cache hit took %s", took)
	if env2.Key != env.Key || env2.Site != env.Site {
		t.Errorf("hit gave %s %s, want %s %s", env2.Key, env2.Site, env.Key, env.Site)
	}
	if ix.TotalFileDownloads() != before || ix.TotalHits() != hits || c.Installs() != installs {
		t.Errorf("cache hit reached the index or ran the installer")
	}
	if !env2.LastUsed.After(env.LastUsed) {
		t.Errorf("LastUsed not updated: %v then %v", env.LastUsed, env2.LastUsed)
	}
	list, err := c.List()
	if err != nil || len(list) != 1 || list[0].Key != env.Key {
		t.Errorf("List = %+v, %v", list, err)
	}
}

func TestOwnershipAndModes(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("the installer writes as another uid only when the server is root")
	}
	py := systemPython(t)
	ix := newIndex(t)
	c := newCache(t, IndexConfig{IndexURL: ix.URL})
	env, release, err := ensure(t, c, py, []string{"pysbx-beta"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	root := filepath.Dir(env.Site)
	n := 0
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid != 0 || st.Gid != 0 {
			t.Errorf("%s owned by %d:%d", p, st.Uid, st.Gid)
		}
		if fi.Mode()&fs.ModeSymlink == 0 && fi.Mode().Perm()&0o022 != 0 {
			t.Errorf("%s is group/other-writable (%v)", p, fi.Mode())
		}
		if fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) != 0 {
			t.Errorf("%s has special bits (%v)", p, fi.Mode())
		}
		n++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("checked %d entries", n)
}

func TestUnknownPackage(t *testing.T) {
	t.Parallel()
	py := systemPython(t)
	ix := newIndex(t)
	c := newCache(t, IndexConfig{IndexURL: ix.URL})
	_, _, err := ensure(t, c, py, []string{"pysbx-beta", "nosuchpkg"}, nil)
	var ie *InstallError
	if !errors.As(err, &ie) {
		t.Fatalf("err = %v, want an InstallError", err)
	}
	t.Logf("error: %v", err)
	msg := err.Error()
	if ie.Requirement != "nosuchpkg" || !strings.Contains(msg, "nosuchpkg") || !strings.Contains(msg, "No matching distribution") {
		t.Errorf("error does not name the package and the reason: %q (requirement %q)", msg, ie.Requirement)
	}
	if n := strings.Count(msg, "\n"); n > 1 {
		t.Errorf("error has %d lines", n+1)
	}
	if !strings.Contains(ie.Output, "nosuchpkg") {
		t.Errorf("Output lacks the installer's output: %q", ie.Output)
	}
	assertNoBuilds(t, c)
	if list, _ := c.List(); len(list) != 0 {
		t.Errorf("envs after a failure: %+v", list)
	}
}

func TestSdistRefusedByDefault(t *testing.T) {
	t.Parallel()
	py := systemPython(t)
	ix := newIndex(t)
	marker := pypi.SdistMarker(srcOnly.Name)
	os.Remove(marker)
	sdistFile := pypi.SdistFilename(srcOnly)

	c := newCache(t, IndexConfig{IndexURL: ix.URL})
	_, _, err := ensure(t, c, py, []string{"pysbx-src"}, nil)
	var ie *InstallError
	if !errors.As(err, &ie) {
		t.Fatalf("err = %v, want an InstallError", err)
	}
	t.Logf("default: %v", err)
	if ie.Requirement != "pysbx-src" || !strings.Contains(err.Error(), "only wheels") {
		t.Errorf("error = %q", err)
	}
	// The proof that setup.py never ran: pip never even fetched the sdist.
	// (The marker would be written in the sandbox's private /tmp, so its
	// absence on the host is checked too but proves less.)
	if n := ix.Downloads(sdistFile); n != 0 {
		t.Errorf("the sdist was downloaded %d times", n)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Errorf("setup.py ran: %s exists", marker)
	}
	assertNoBuilds(t, c)

	// Allowed: pip fetches the sdist and tries to build it. The index has
	// no setuptools for pip's isolated build environment, so the build
	// fails differently (and when it runs, it runs inside the sandbox).
	c2 := newCache(t, IndexConfig{IndexURL: ix.URL, AllowSdist: true})
	_, _, err = ensure(t, c2, py, []string{"pysbx-src"}, nil)
	if err == nil {
		t.Logf("the sdist built (setuptools was reachable)")
	} else {
		t.Logf("AllowSdist: %v", err)
		if strings.Contains(err.Error(), "only wheels") {
			t.Errorf("AllowSdist still refused sdists: %v", err)
		}
	}
	if n := ix.Downloads(sdistFile); n == 0 {
		t.Errorf("with AllowSdist the sdist was not fetched")
	}
	if _, err := os.Stat(marker); err == nil {
		t.Errorf("setup.py wrote its marker on the host")
	}
	assertNoBuilds(t, c2)
}

func TestNothingToInstall(t *testing.T) {
	t.Parallel()
	py := systemPython(t)
	ix := newIndex(t)
	c := newCache(t, IndexConfig{NoIndex: true, FindLinks: []string{ix.Dir}})
	env, release, err := ensure(t, c, py, []string{`pysbx-beta; python_version < "3"`}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if ents, err := os.ReadDir(env.Site); err != nil || len(ents) != 0 {
		t.Errorf("site = %v, %v; want an empty directory", ents, err)
	}
}

func TestOfflineFindLinks(t *testing.T) {
	t.Parallel()
	py := systemPython(t)
	ix := newIndex(t)
	c := newCache(t, IndexConfig{NoIndex: true, FindLinks: []string{ix.Dir}})
	env, release, err := ensure(t, c, py, []string{"pysbx-alpha"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if got := importValues(t, py.Path, env.Site, "pysbx_alpha", "pysbx_beta"); got != "pysbx-alpha-1.0.0 pysbx-beta-1.0.0" {
		t.Errorf("VALUEs = %q", got)
	}
	if n := ix.TotalHits(); n != 0 {
		t.Errorf("an offline install made %d requests to the index", n)
	}
}

func TestOtherInterpreter(t *testing.T) {
	t.Parallel()
	sys := systemPython(t)
	var py12 *interp.Interpreter
	matches, _ := filepath.Glob("/root/.pyenv/versions/3.12*/bin/python3")
	for _, m := range matches {
		if it, err := interp.Inspect(context.Background(), m); err == nil && exec.Command(it.Path, "-I", "-m", "pip", "--version").Run() == nil {
			py12 = it
			break
		}
	}
	if py12 == nil {
		t.Skip("no pyenv Python 3.12 with pip")
	}
	ix := newIndex(t)
	c := newCache(t, IndexConfig{IndexURL: ix.URL})
	env, release, err := ensure(t, c, py12, []string{"pysbx-alpha"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if env.Python != py12.Version {
		t.Errorf("Python = %s, want %s", env.Python, py12.Version)
	}
	if got := importValues(t, py12.Path, env.Site, "pysbx_alpha", "pysbx_beta"); got != "pysbx-alpha-1.0.0 pysbx-beta-1.0.0" {
		t.Errorf("VALUEs = %q", got)
	}
	// pip byte-compiled the modules for the interpreter it ran on.
	pyc, _ := filepath.Glob(filepath.Join(env.Site, "pysbx_alpha", "__pycache__", "*.cpython-312.pyc"))
	if len(pyc) == 0 {
		t.Errorf("no cpython-312 bytecode in the env")
	}
	if k, _ := c.Key(sys, []string{"pysbx-alpha"}); k == env.Key {
		t.Errorf("3.12 and %s share the key %s", sys.Version, k)
	}
}

// TestInstallerHasNoHostNetwork: a wheel whose metadata names a URL on the
// host's loopback (another service than the index) cannot make the
// installer fetch it. The installer reaches the index through the proxy,
// and nothing else.
func TestInstallerHasNoHostNetwork(t *testing.T) {
	t.Parallel()
	py := systemPython(t)
	var hits atomic.Int64
	victim := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		http.Error(w, "secret", http.StatusTeapot)
	}))
	defer victim.Close()
	ix := pypi.NewIndex(t, pypi.Package{Name: "pysbx-ssrf", Version: "1.0", Requires: []string{"pysbx-victim @ " + victim.URL + "/pysbx_victim-1.0-py3-none-any.whl"}})
	c := newCache(t, IndexConfig{IndexURL: ix.URL})
	_, _, err := ensure(t, c, py, []string{"pysbx-ssrf"}, nil)
	if err == nil {
		t.Fatal("the install reached the host's loopback service")
	}
	t.Logf("refused: %v", err)
	if n := hits.Load(); n != 0 {
		t.Errorf("the host's loopback service got %d requests from the installer", n)
	}
	if strings.Contains(err.Error(), "418") {
		t.Errorf("the service's answer came back: %v", err)
	}
	if n := ix.Downloads("pysbx_ssrf-1.0-py3-none-any.whl"); n == 0 {
		t.Errorf("the index itself was not reached through the proxy")
	}
}

// TestSdistBuildCannotFillTheDisk: build code (an sdist's in-tree backend,
// with AllowSdist) tries to write 600 MiB wherever it can. The installer's
// scratch space is capped like a run's (64 MiB here), nothing of the host
// is writable, and the install fails without the host's disk growing.
func TestSdistBuildCannotFillTheDisk(t *testing.T) {
	t.Parallel()
	py := systemPython(t)
	backend := `
import os
def _fill():
    chunk = b"x" * (1 << 20)
    for d in ("/work", "/tmp", "/.pysandbox", "/dev/shm", "/"):
        try:
            with open(os.path.join(d, "fill"), "wb") as f:
                for _ in range(600):
                    f.write(chunk)
        except OSError as e:
            print("pysbx-fill:", d, e.strerror)
def get_requires_for_build_wheel(config_settings=None):
    return []
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _fill()
    raise RuntimeError("pysbx-fill: done")
`
	ix := pypi.NewIndex(t, pypi.Package{Name: "pysbx-fill", Version: "1.0", SdistOnly: true, Backend: backend})
	c := newCache(t, IndexConfig{IndexURL: ix.URL, AllowSdist: true})
	c.cfg.Limits.TmpBytes = 64 << 20
	before := diskUsed(t, c.cfg.Dir)
	_, _, err := ensure(t, c, py, []string{"pysbx-fill"}, nil)
	if err == nil {
		t.Fatal("the install succeeded")
	}
	var ie *InstallError
	if !errors.As(err, &ie) || !strings.Contains(ie.Output, "pysbx-fill") {
		t.Fatalf("the build code did not run: %v", err)
	}
	t.Logf("output: %s", ie.Output)
	if !strings.Contains(ie.Output, "No space left on device") {
		t.Errorf("the scratch space did not fill up: %s", ie.Output)
	}
	if grew := diskUsed(t, c.cfg.Dir) - before; grew > 16<<20 {
		t.Errorf("the cache directory grew by %d bytes", grew)
	}
	assertNoBuilds(t, c)
}

// diskUsed is the space the tree at dir takes (its files' blocks): what
// an install could make grow. The whole filesystem's use would also count
// every other test writing beside it, as the suite runs in parallel.
func diskUsed(t *testing.T, dir string) int64 {
	var total int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // a file removed meanwhile
		}
		var st syscall.Stat_t
		if syscall.Lstat(p, &st) == nil {
			total += st.Blocks * 512
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return total
}
