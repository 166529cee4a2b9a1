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

func TestKeys(t *testing.T) {
	t.Parallel()
	py := &interp.Interpreter{Path: "/usr/bin/python3.11", Version: "3.11.2", Major: 3, Minor: 11, Prefix: "/usr"}
	py12 := &interp.Interpreter{Path: "/root/.pyenv/versions/3.12.1/bin/python3.12", Version: "3.12.1", Major: 3, Minor: 12, Prefix: "/root/.pyenv/versions/3.12.1"}
	samePathOtherVersion := &interp.Interpreter{Path: py.Path, Version: "3.11.9", Major: 3, Minor: 11, Prefix: "/usr"}
	online := newCache(t, IndexConfig{IndexURL: "http://127.0.0.1:1/simple/"})
	other := newCache(t, IndexConfig{IndexURL: "http://127.0.0.1:2/simple/"})
	sdist := newCache(t, IndexConfig{IndexURL: "http://127.0.0.1:1/simple/", AllowSdist: true})

	key := func(c *Cache, py *interp.Interpreter, reqs ...string) string {
		t.Helper()
		k, err := c.Key(py, reqs)
		if err != nil {
			t.Fatal(err)
		}
		if len(k) != 32 {
			t.Fatalf("key %q is not 32 hex chars", k)
		}
		return k
	}
	base := key(online, py, "pysbx-alpha", "pysbx-beta>=1.0,<2")
	for _, same := range [][]string{
		{"pysbx-beta>=1.0,<2", "pysbx-alpha"},
		{"Pysbx_Alpha", "PYSBX.beta <2, >=1.0"},
		{"pysbx-alpha", "pysbx-beta>=1.0,<2", "pysbx_alpha"},
	} {
		if k := key(online, py, same...); k != base {
			t.Errorf("%q: key %s, want %s", same, k, base)
		}
	}
	for name, k := range map[string]string{
		"other set":         key(online, py, "pysbx-alpha"),
		"other specifier":   key(online, py, "pysbx-alpha", "pysbx-beta>=1.0"),
		"other interpreter": key(online, py12, "pysbx-alpha", "pysbx-beta>=1.0,<2"),
		"other version":     key(online, samePathOtherVersion, "pysbx-alpha", "pysbx-beta>=1.0,<2"),
		"other index":       key(other, py, "pysbx-alpha", "pysbx-beta>=1.0,<2"),
		"sdists allowed":    key(sdist, py, "pysbx-alpha", "pysbx-beta>=1.0,<2"),
	} {
		if k == base {
			t.Errorf("%s: same key as the base", name)
		}
	}
	// Extras are normalised and sorted too.
	if key(online, py, "x[B_b,a]") != key(online, py, "X[a,b-b]") {
		t.Error("extras spelling changed the key")
	}
	canon, err := Canonicalize([]string{" PYSBX.beta <2, >=1.0 ", "x[B_b,a]; python_version >= '3'"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"pysbx-beta<2,>=1.0", `x[a,b-b]; python_version >= "3"`}; !slices.Equal(canon, want) {
		t.Errorf("canonical = %q, want %q", canon, want)
	}
}

func TestInvalidAndURLRequirements(t *testing.T) {
	t.Parallel()
	py := &interp.Interpreter{Path: "/usr/bin/python3", Version: "3.11.2", Major: 3, Minor: 11, Prefix: "/usr"}
	c := newCache(t, IndexConfig{IndexURL: "http://127.0.0.1:1/simple/"})
	for _, tc := range []struct {
		reqs []string
		want string
	}{
		{[]string{"pysbx-alpha", "not a requirement!"}, "invalid requirement"},
		{[]string{"--index-url=http://evil/"}, "invalid requirement"},
		{[]string{"pkg @ https://example.com/pkg-1.0-py3-none-any.whl"}, "direct URL requirements"},
		{[]string{"pkg @ file:///etc/shadow"}, "direct URL requirements"},
		{nil, "no requirements"},
	} {
		_, _, err := c.Ensure(context.Background(), py, tc.reqs, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err = %v, want %q", tc.reqs, err, tc.want)
		}
		var ie *InstallError
		if errors.As(err, &ie) {
			t.Errorf("%q: got an InstallError: nothing should have run", tc.reqs)
		}
		if _, err := c.Key(py, tc.reqs); err == nil {
			t.Errorf("%q: Key accepted it", tc.reqs)
		}
	}
	if c.Installs() != 0 {
		t.Errorf("installer ran %d times", c.Installs())
	}
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

func TestInstallSpec(t *testing.T) {
	t.Parallel()
	py := &interp.Interpreter{Path: "/usr/bin/python3.11", Version: "3.11.2", Major: 3, Minor: 11, Prefix: "/usr"}
	wheels := t.TempDir()
	os.Chmod(wheels, 0o755)
	bdir := t.TempDir()
	reqs := []string{"pysbx-alpha"}
	for _, tc := range []struct {
		name    string
		ix      IndexConfig
		network bool
		flags   []string
		absent  []string
	}{
		{"offline", IndexConfig{NoIndex: true, FindLinks: []string{wheels}}, false,
			[]string{"--no-index", "--find-links " + findLinksMount + "/0", "--only-binary :all:"}, []string{"--index-url"}},
		{"default index", IndexConfig{}, true, []string{"--only-binary :all:"}, []string{"--index-url", "--no-index"}},
		{"custom index", IndexConfig{IndexURL: "https://example.org/simple/", ExtraIndexURLs: []string{"https://a/simple/", "https://b/simple/"}}, true,
			[]string{"--index-url https://example.org/simple/", "--extra-index-url https://a/simple/", "--extra-index-url https://b/simple/"}, nil},
		{"find-links and index", IndexConfig{IndexURL: "https://example.org/simple/", FindLinks: []string{wheels}}, true, []string{"--find-links " + findLinksMount + "/0"}, nil},
		{"offline with a URL find-links", IndexConfig{NoIndex: true, FindLinks: []string{"https://example.org/wheels/"}}, true, []string{"--find-links https://example.org/wheels/"}, nil},
		{"sdists", IndexConfig{AllowSdist: true}, true, nil, []string{"--only-binary"}},
	} {
		c := newCache(t, tc.ix)
		c.uv = "" // the pip form, whatever this host has
		spec, err := c.installSpec(py, reqs, bdir)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if spec.Proxy != tc.network {
			t.Errorf("%s: Proxy = %v, want %v", tc.name, spec.Proxy, tc.network)
		}
		args := strings.Join(spec.Args, " ")
		wrapped := "-I -S -c " + scratchWrapper + " " + py.Path + " -I -m pip install --target " + scratchSite + " "
		if spec.Python != py.Path || spec.Prefix != py.Prefix || !strings.HasPrefix(args, wrapped) || !strings.HasSuffix(args, " -- pysbx-alpha") {
			t.Errorf("%s: %s %s", tc.name, spec.Python, args)
		}
		for _, f := range tc.flags {
			if !strings.Contains(args, " "+f+" ") {
				t.Errorf("%s: args lack %q: %s", tc.name, f, args)
			}
		}
		for _, f := range tc.absent {
			if strings.Contains(args, f) {
				t.Errorf("%s: args have %q: %s", tc.name, f, args)
			}
		}
		// Nothing of the host is writable: the install goes to scratch.
		for _, b := range spec.Binds {
			if b.Writable || b.Source != wheels || b.Target != findLinksMount+"/0" {
				t.Errorf("%s: find-links bind %+v", tc.name, b)
			}
		}
		if !slices.Contains(spec.Env, "HOME=/tmp") || spec.Limits != c.cfg.Limits {
			t.Errorf("%s: env %q limits %+v", tc.name, spec.Env, spec.Limits)
		}
	}

	// uv, when the host has it under /usr.
	c := newCache(t, IndexConfig{NoIndex: true, FindLinks: []string{wheels}})
	c.uv = "/usr/bin/uv"
	spec, err := c.installSpec(py, reqs, bdir)
	if err != nil {
		t.Fatal(err)
	}
	if args := strings.Join(spec.Args, " "); spec.Python != py.Path || !strings.HasPrefix(args, "-I -S -c "+scratchWrapper+" /usr/bin/uv pip install --target "+scratchSite+" --python "+py.Path+" --no-cache ") {
		t.Errorf("uv: %s %s", spec.Python, args)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	private := t.TempDir()
	if err := os.Chmod(private, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, ix := range []IndexConfig{
		{IndexURL: "ftp://example.org/"},
		{ExtraIndexURLs: []string{"file:///etc"}},
		{FindLinks: []string{"relative/dir"}},
		{FindLinks: []string{"/nonexistent/wheels"}},
		{NoIndex: true},
	} {
		if _, err := New(Config{Dir: t.TempDir(), Backend: sandbox.None{}, Index: ix}); err == nil {
			t.Errorf("%+v accepted", ix)
		}
	}
	if os.Geteuid() == 0 {
		_, err := New(Config{Dir: t.TempDir(), Backend: sandbox.None{}, Index: IndexConfig{NoIndex: true, FindLinks: []string{private}}})
		if err == nil || !strings.Contains(err.Error(), "readable") {
			t.Errorf("private wheelhouse: %v", err)
		}
	}
	dir := filepath.Join(t.TempDir(), "c")
	if _, err := New(Config{Dir: dir, Backend: sandbox.None{}}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("cache dir mode: %v %v", fi.Mode(), err)
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

func TestConcurrentEnsureBuildsOnce(t *testing.T) {
	t.Parallel()
	py := systemPython(t)
	ix := newIndex(t)
	c := newCache(t, IndexConfig{IndexURL: ix.URL})
	const n = 5
	var wg sync.WaitGroup
	envs := make([]*Env, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var release func()
			envs[i], release, errs[i] = c.Ensure(context.Background(), py, []string{"pysbx-gamma"}, nil)
			if release != nil {
				release()
			}
		}()
	}
	wg.Wait()
	for i := range n {
		if errors.Is(errs[i], sandbox.ErrUnavailable) {
			t.Skip(errs[i])
		}
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		if envs[i].Key != envs[0].Key {
			t.Errorf("caller %d got key %s, caller 0 %s", i, envs[i].Key, envs[0].Key)
		}
	}
	if got := ix.Downloads(pypi.WheelFilename(gamma)); got != 1 {
		t.Errorf("wheel downloaded %d times, want 1", got)
	}
	if got := c.Installs(); got != 1 {
		t.Errorf("installer ran %d times, want 1", got)
	}
}

func TestCancelKillsAbandonedBuild(t *testing.T) {
	t.Parallel()
	py := systemPython(t)
	ix := newIndex(t)
	c := newCache(t, IndexConfig{IndexURL: ix.URL})
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{}, 1)
	go func() {
		<-started
		cancel()
	}()
	_, _, err := c.Ensure(ctx, py, []string{"pysbx-alpha"}, func(string) {
		select {
		case started <- struct{}{}:
		default:
		}
	})
	if errors.Is(err, sandbox.ErrUnavailable) {
		t.Skip(err)
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	// The build is killed and cleaned up in the background.
	deadline := time.Now().Add(20 * time.Second)
	for {
		ents, _ := os.ReadDir(c.buildDir)
		c.mu.Lock()
		pending := len(c.builds)
		c.mu.Unlock()
		if len(ents) == 0 && pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("build not cleaned up: %v", ents)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A later call builds afresh and succeeds.
	env, release, err := c.Ensure(context.Background(), py, []string{"pysbx-alpha"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	release()
	if n := c.Installs(); n != 2 {
		t.Errorf("installer ran %d times, want 2 (the killed one and the rebuild)", n)
	}
	if got := importValues(t, py.Path, env.Site, "pysbx_alpha"); got != "pysbx-alpha-1.0.0" {
		t.Errorf("VALUE = %q", got)
	}
}

func TestPruneLRU(t *testing.T) {
	t.Parallel()
	py := systemPython(t)
	ix := newIndex(t)
	c := newCache(t, IndexConfig{NoIndex: true, FindLinks: []string{ix.Dir}})
	older, relOlder, err := ensure(t, c, py, []string{"pysbx-beta"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	newer, relNewer, err := ensure(t, c, py, []string{"pysbx-gamma"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Make the order unambiguous: meta.json's mtime is the LRU clock.
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(filepath.Join(c.envDir(older.Key), metaName), old, old); err != nil {
		t.Fatal(err)
	}
	relOlder()
	relNewer()

	// Room for one: the older goes.
	evicted, err := c.Prune(newer.SizeBytes)
	if err != nil {
		t.Fatal(err)
	}
	if len(evicted) != 1 || evicted[0].Key != older.Key {
		t.Fatalf("evicted %+v, want only %s", evicted, older.Key)
	}
	if _, err := os.Stat(filepath.Dir(older.Site)); !os.IsNotExist(err) {
		t.Errorf("evicted env still on disk: %v", err)
	}
	if _, err := os.Stat(newer.Site); err != nil {
		t.Errorf("kept env gone: %v", err)
	}

	// In use: never evicted, even by Prune(0).
	again, relAgain, err := c.Ensure(context.Background(), py, []string{"pysbx-gamma"}, nil)
	if err != nil || again.Key != newer.Key {
		t.Fatalf("re-ensure: %v %+v", err, again)
	}
	if evicted, err := c.Prune(0); err != nil || len(evicted) != 0 {
		t.Errorf("Prune(0) with the env in use evicted %+v, %v", evicted, err)
	}
	relAgain()
	relAgain() // idempotent
	if evicted, err := c.Prune(0); err != nil || len(evicted) != 1 {
		t.Errorf("Prune(0) after release evicted %+v, %v", evicted, err)
	}
	if list, _ := c.List(); len(list) != 0 {
		t.Errorf("envs left: %+v", list)
	}
	if ents, _ := os.ReadDir(c.trashDir); len(ents) != 0 {
		t.Errorf("trash left: %v", ents)
	}

	// An env bigger than the whole cache is refused, and nothing is left.
	c.cfg.MaxBytes = 1
	_, _, err = c.Ensure(context.Background(), py, []string{"pysbx-beta"}, nil)
	var ie *InstallError
	if !errors.As(err, &ie) || !strings.Contains(err.Error(), "more than the whole cache") {
		t.Errorf("oversized env: %v", err)
	}
	assertNoBuilds(t, c)

	// Ensure prunes to MaxBytes after a build, sparing what it returns:
	// room for either env, not both.
	c.cfg.MaxBytes = max(older.SizeBytes, newer.SizeBytes)
	a, relA, err := c.Ensure(context.Background(), py, []string{"pysbx-beta"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	relA()
	b, relB, err := c.Ensure(context.Background(), py, []string{"pysbx-gamma"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer relB()
	list, _ := c.List()
	if len(list) != 1 || list[0].Key != b.Key {
		t.Errorf("after building %s, envs = %+v (want only it; %s evicted)", b.Key, list, a.Key)
	}
}

func TestSymlinkInside(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "sub", "x"), 0o755))
	must(os.WriteFile(filepath.Join(root, "sub", "f"), nil, 0o644))
	for name, target := range map[string]string{
		"ok-rel":    "sub/f",
		"ok-up":     "sub/x/../f",
		"ok-dangle": "nothing/../../..", // stops at "nothing", as the kernel would
		"abs":       "/etc/passwd",
		"up":        "../outside",
		"d":         "sub/x",
		"trick":     "d/../../..", // lexically "..", really root/sub/x/../../.. = ..
		"trick2":    "d/../..",    // lexically "..", really root/sub: inside
		"loop":      "loop",
	} {
		must(os.Symlink(target, filepath.Join(root, name)))
	}
	must(os.Symlink("../../sub/f", filepath.Join(root, "sub", "x", "deep")))
	must(os.Symlink("../../../f", filepath.Join(root, "sub", "x", "deepout")))
	for name, want := range map[string]bool{
		"ok-rel": true, "ok-up": true, "ok-dangle": true, "d": true, "trick2": true, "sub/x/deep": true,
		"abs": false, "up": false, "trick": false, "loop": false, "sub/x/deepout": false,
	} {
		if got := symlinkInside(root, filepath.Join(root, name)); got != want {
			t.Errorf("%s: inside = %v, want %v", name, got, want)
		}
	}
}

func TestSanitize(t *testing.T) {
	t.Parallel()
	bdir := t.TempDir()
	site := filepath.Join(bdir, "site")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(site, "pkg", "locked"), 0o777))
	must(os.WriteFile(filepath.Join(site, "pkg", "__init__.py"), []byte("VALUE = 1\n"), 0o666))
	must(os.WriteFile(filepath.Join(site, "pkg", "tool"), []byte("#!/bin/sh\n"), 0o4777))
	must(os.WriteFile(filepath.Join(site, "pkg", "locked", "f"), []byte("x"), 0o600))
	must(os.Chmod(filepath.Join(site, "pkg", "locked"), 0o000))
	must(os.Symlink("/etc/passwd", filepath.Join(site, "pkg", "passwd")))
	must(os.Symlink("__init__.py", filepath.Join(site, "pkg", "alias.py")))
	must(os.Link(filepath.Join(site, "pkg", "__init__.py"), filepath.Join(site, "pkg", "same.py")))
	must(os.WriteFile(filepath.Join(bdir, "meta.json"), []byte("{}"), 0o666))
	must(os.Symlink("/etc", filepath.Join(bdir, "junk")))
	log := slog.New(slog.NewTextHandler(&testLog{t: t, ok: true}, nil))
	size, err := sanitize(bdir, os.Getuid(), os.Getgid(), log)
	if err != nil {
		t.Fatal(err)
	}
	// Three directories, three files (one with two names, charged once)
	// and a symlink: seven inodes, each charged with its blocks.
	if want, _ := diskUsage(site); size != want || size < 7*InodeCost {
		t.Errorf("size = %d, want %d (7 inodes and their blocks)", size, want)
	}
	modes := map[string]fs.FileMode{
		"site":                 0o755 | fs.ModeDir,
		"site/pkg":             0o755 | fs.ModeDir,
		"site/pkg/locked":      0o755 | fs.ModeDir,
		"site/pkg/locked/f":    0o644,
		"site/pkg/__init__.py": 0o644,
		"site/pkg/tool":        0o755,
	}
	for p, want := range modes {
		fi, err := os.Lstat(filepath.Join(bdir, p))
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		if fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v", p, fi.Mode(), want)
		}
	}
	for _, gone := range []string{"site/pkg/passwd", "meta.json", "junk"} {
		if _, err := os.Lstat(filepath.Join(bdir, gone)); !os.IsNotExist(err) {
			t.Errorf("%s survived: %v", gone, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(site, "pkg", "alias.py")); err != nil {
		t.Errorf("inside symlink removed: %v", err)
	}

	// A FIFO (or socket, or device) is refused: no package needs one.
	must(syscall.Mkfifo(filepath.Join(site, "pkg", "fifo"), 0o666))
	_, err = sanitize(bdir, os.Getuid(), os.Getgid(), log)
	var ie *InstallError
	if !errors.As(err, &ie) || !strings.Contains(err.Error(), `a FIFO at "pkg/fifo": refused`) {
		t.Errorf("a FIFO: %v", err)
	}
}

// TestPruneSparesOtherProcesses: an env one cache (one process: a running
// server) uses is not evicted by another cache over the same directory
// (`pysandbox cache prune`), and is once it is released.
func TestPruneSparesOtherProcesses(t *testing.T) {
	t.Parallel()
	py := systemPython(t)
	ix := newIndex(t)
	server := newCache(t, IndexConfig{NoIndex: true, FindLinks: []string{ix.Dir}})
	env, release, err := ensure(t, server, py, []string{"pysbx-beta"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	prune, err := New(server.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if evicted, err := prune.Prune(0); err != nil || len(evicted) != 0 {
		t.Fatalf("another process's Prune(0) evicted an env in use: %+v %v", evicted, err)
	}
	if _, err := os.Stat(env.Site); err != nil {
		t.Fatalf("the env in use is gone: %v", err)
	}
	// The other process can use it too (shared locks), then let it go.
	_, release2, err := prune.Ensure(context.Background(), py, []string{"pysbx-beta"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	release2()
	release()
	if evicted, err := prune.Prune(0); err != nil || len(evicted) != 1 {
		t.Fatalf("Prune(0) after release: %+v %v", evicted, err)
	}
	// The server finds it gone and builds it again.
	env2, release3, err := server.Ensure(context.Background(), py, []string{"pysbx-beta"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer release3()
	if _, err := os.Stat(env2.Site); err != nil {
		t.Errorf("rebuilt env: %v", err)
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
