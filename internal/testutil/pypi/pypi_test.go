package pypi

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/csv"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

const systemPython = "/usr/bin/python3"

var (
	alpha = Package{
		Name:     "pysbx-alpha",
		Version:  "1.0.0",
		Requires: []string{"pysbx-beta>=1.0"},
	}
	beta = Package{
		Name:           "PySbx_Beta",
		Version:        "1.2",
		RequiresPython: ">=3.6",
		Files: map[string]string{
			"pysbx_beta/__init__.py": "from pysbx_beta.sub import VALUE\n",
			"pysbx_beta/sub.py":      "VALUE = 'beta says hi'\n",
			"pysbx_beta_single.py":   "X = 1\n",
		},
	}
)

// needPython skips the test when python cannot run pip.
func needPython(t *testing.T, python string) {
	t.Helper()
	if _, err := os.Stat(python); err != nil {
		t.Skipf("%s not present", python)
	}
	if out, err := exec.Command(python, "-m", "pip", "--version").CombinedOutput(); err != nil {
		t.Skipf("%s has no pip: %v\n%s", python, err, out)
	}
}

// cleanEnv is the environment for Python subprocesses: no proxies (the
// index is on 127.0.0.1), no user pip configuration, no stray PYTHON*
// variables.
func cleanEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch uk := strings.ToUpper(k); {
		case strings.HasSuffix(uk, "_PROXY"), strings.HasPrefix(uk, "PIP_"),
			strings.HasPrefix(uk, "PYTHON"), strings.HasPrefix(uk, "UV_"):
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "PIP_CONFIG_FILE="+os.DevNull, "PIP_NO_INPUT=1",
		"PIP_DISABLE_PIP_VERSION_CHECK=1", "PIP_ROOT_USER_ACTION=ignore", "NO_PROXY=*")
	return append(env, extra...)
}

func run(t *testing.T, env []string, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// pipInstall runs `python -m pip install --no-cache-dir
// --disable-pip-version-check --target target args...`.
func pipInstall(t *testing.T, python, target string, args ...string) (string, error) {
	t.Helper()
	full := append([]string{"-m", "pip", "install", "--no-cache-dir",
		"--disable-pip-version-check", "--no-warn-script-location", "--target", target}, args...)
	return run(t, cleanEnv(), python, full...)
}

// importValue imports module from target in a fresh interpreter and
// returns repr(module.VALUE).
func importValue(t *testing.T, python, target, module string) string {
	t.Helper()
	out, err := run(t, cleanEnv("PYTHONPATH="+target), python, "-I", "-c",
		"import sys; sys.path.insert(0, "+pyString(target)+")\n"+
			"import "+module+" as m; print(repr(m.VALUE))")
	if err != nil {
		t.Fatalf("import %s from %s: %v\n%s", module, target, err, out)
	}
	return strings.TrimSpace(out)
}

func checkInstalled(t *testing.T, python, target string) {
	t.Helper()
	if got, want := importValue(t, python, target, "pysbx_alpha"), "'pysbx-alpha-1.0.0'"; got != want {
		t.Errorf("pysbx_alpha.VALUE = %s, want %s", got, want)
	}
	if got, want := importValue(t, python, target, "pysbx_beta"), "'beta says hi'"; got != want {
		t.Errorf("pysbx_beta.VALUE = %s, want %s", got, want)
	}
	// The installed metadata is readable by importlib.metadata.
	out, err := run(t, cleanEnv(), python, "-I", "-c",
		"import sys; sys.path.insert(0, "+pyString(target)+")\n"+
			"from importlib import metadata as md\n"+
			"print(md.version('pysbx-alpha'), md.requires('pysbx-alpha'), md.version('pysbx-beta'))")
	if err != nil {
		if strings.Contains(out, "No module named 'importlib.metadata'") {
			return // Python < 3.8
		}
		t.Fatalf("importlib.metadata: %v\n%s", err, out)
	}
	if got, want := strings.TrimSpace(out), "1.0.0 ['pysbx-beta>=1.0'] 1.2"; got != want {
		t.Errorf("importlib.metadata says %q, want %q", got, want)
	}
}

// noRecordComplaints fails if pip's output mentions a problem with a
// wheel's metadata.
func noRecordComplaints(t *testing.T, out string) {
	t.Helper()
	low := strings.ToLower(out)
	for _, bad := range []string{"warning", "deprecat", "invalid", "error", "mismatch", "hash"} {
		if strings.Contains(low, bad) {
			t.Errorf("pip output mentions %q:\n%s", bad, out)
		}
	}
	if strings.Contains(out, "RECORD") {
		t.Errorf("pip output mentions RECORD:\n%s", out)
	}
}

func TestPipInstallFromIndex(t *testing.T) {
	t.Parallel()
	needPython(t, systemPython)
	ix := NewIndex(t, alpha, beta)
	target := t.TempDir()
	out, err := pipInstall(t, systemPython, target, "--index-url", ix.URL, "pysbx-alpha")
	if err != nil {
		t.Fatalf("pip install: %v\n%s", err, out)
	}
	t.Logf("pip:\n%s", out)
	noRecordComplaints(t, out)
	if !strings.Contains(out, "Successfully installed") {
		t.Errorf("pip output lacks \"Successfully installed\":\n%s", out)
	}
	checkInstalled(t, systemPython, target)

	for _, p := range []Package{alpha, beta} {
		if n := ix.Downloads(WheelFilename(p)); n != 1 {
			t.Errorf("%s downloaded %d times, want 1", WheelFilename(p), n)
		}
		if n := ix.Hits("/simple/" + Normalize(p.Name) + "/"); n < 1 {
			t.Errorf("project page of %s never fetched", p.Name)
		}
	}
	if n := ix.TotalFileDownloads(); n != 2 {
		t.Errorf("TotalFileDownloads = %d, want 2", n)
	}
	ix.ResetCounts()
	if ix.TotalHits() != 0 || ix.TotalFileDownloads() != 0 {
		t.Errorf("ResetCounts left hits=%d downloads=%d", ix.TotalHits(), ix.TotalFileDownloads())
	}
}

func TestPipInstallOfflineFindLinks(t *testing.T) {
	t.Parallel()
	needPython(t, systemPython)
	ix := NewIndex(t, alpha, beta)
	ix.Close() // offline: nothing may be fetched over HTTP
	target := t.TempDir()
	out, err := pipInstall(t, systemPython, target, "--no-index", "--find-links", ix.Dir, "pysbx-alpha")
	if err != nil {
		t.Fatalf("pip install: %v\n%s", err, out)
	}
	noRecordComplaints(t, out)
	checkInstalled(t, systemPython, target)
	if n := ix.TotalHits(); n != 0 {
		t.Errorf("offline install made %d requests to the index", n)
	}
}

// uniqueName gives a project name nobody else uses, so the /tmp marker of
// this run cannot collide with a concurrent test run's.
func uniqueName(t *testing.T, prefix string) string {
	name := fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), time.Now().UnixNano())
	marker := SdistMarker(name)
	os.Remove(marker)
	t.Cleanup(func() { os.Remove(marker) })
	return name
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func TestSdistOnlyRefusedWithOnlyBinary(t *testing.T) {
	t.Parallel()
	needPython(t, systemPython)
	sd := Package{Name: uniqueName(t, "pysbx-sdonly"), Version: "0.1"}
	ix := NewIndex(t)
	if _, err := ix.AddSdist(sd); err != nil {
		t.Fatal(err)
	}
	out, err := pipInstall(t, systemPython, t.TempDir(),
		"--index-url", ix.URL, "--only-binary", ":all:", sd.Name)
	if err == nil {
		t.Fatalf("pip install --only-binary :all: of an sdist-only project succeeded:\n%s", out)
	}
	if !strings.Contains(out, "No matching distribution found for "+sd.Name) {
		t.Errorf("want \"No matching distribution found for %s\", got:\n%s", sd.Name, out)
	}
	if exists(SdistMarker(sd.Name)) {
		t.Errorf("sdist's setup.py ran (marker %s exists)", SdistMarker(sd.Name))
	}
	if n := ix.TotalFileDownloads(); n != 0 {
		t.Errorf("the sdist was downloaded %d times", n)
	}
	if n := ix.Hits("/simple/" + Normalize(sd.Name) + "/"); n < 1 {
		t.Errorf("pip never looked at the project page")
	}
}

func TestSdistBuiltWithoutOnlyBinary(t *testing.T) {
	t.Parallel()
	needPython(t, systemPython)
	// The index carries no setuptools, so pip's isolated build could not
	// fetch the build backend: build with the interpreter's own.
	if out, err := exec.Command(systemPython, "-c", "import setuptools, wheel").CombinedOutput(); err != nil {
		t.Skipf("%s lacks setuptools/wheel, cannot build sdists: %v\n%s", systemPython, err, out)
	}
	sd := Package{Name: uniqueName(t, "pysbx-sdbuild"), Version: "0.1",
		Requires: []string{"pysbx-beta"}}
	ix := NewIndex(t, beta)
	if _, err := ix.AddSdist(sd); err != nil {
		t.Fatal(err)
	}
	target := t.TempDir()
	out, err := pipInstall(t, systemPython, target, "--index-url", ix.URL, "--no-build-isolation", sd.Name)
	if err != nil {
		t.Fatalf("pip install of sdist: %v\n%s", err, out)
	}
	if !exists(SdistMarker(sd.Name)) {
		t.Errorf("sdist built but marker %s missing:\n%s", SdistMarker(sd.Name), out)
	}
	if got, want := importValue(t, systemPython, target, ModuleName(sd.Name)), "'"+DefaultValue(sd)+"'"; got != want {
		t.Errorf("VALUE = %s, want %s", got, want)
	}
	if got := importValue(t, systemPython, target, "pysbx_beta"); got != "'beta says hi'" {
		t.Errorf("dependency of the sdist: pysbx_beta.VALUE = %s", got)
	}
	if n := ix.Downloads(SdistFilename(sd)); n != 1 {
		t.Errorf("sdist downloaded %d times, want 1", n)
	}
}

func TestRequiresPythonHonored(t *testing.T) {
	t.Parallel()
	needPython(t, systemPython)
	old := Package{Name: "pysbx-gamma", Version: "1.0"}
	future := Package{Name: "pysbx-gamma", Version: "2.0", RequiresPython: ">=99"}
	ix := NewIndex(t, old, future)

	page := httpGet(t, ix.URL+"pysbx-gamma/")
	if !strings.Contains(page, `data-requires-python="&gt;=99"`) {
		t.Errorf("project page lacks escaped data-requires-python:\n%s", page)
	}
	target := t.TempDir()
	out, err := pipInstall(t, systemPython, target, "--index-url", ix.URL, "pysbx-gamma")
	if err != nil {
		t.Fatalf("pip install: %v\n%s", err, out)
	}
	if got := importValue(t, systemPython, target, "pysbx_gamma"); got != "'pysbx-gamma-1.0'" {
		t.Errorf("installed %s, want the 1.0 that supports this Python", got)
	}
	if n := ix.Downloads(WheelFilename(future)); n != 0 {
		t.Errorf("wheel requiring Python >=99 downloaded %d times", n)
	}
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s\n%s", url, resp.Status, b)
	}
	return string(b)
}

func TestIndexPages(t *testing.T) {
	t.Parallel()
	ix := NewIndex(t, alpha, beta)

	root := httpGet(t, ix.URL)
	for _, n := range []string{"pysbx-alpha", "pysbx-beta"} {
		if !strings.Contains(root, `href="/simple/`+n+`/"`) {
			t.Errorf("root page lacks %s:\n%s", n, root)
		}
	}
	if strings.Contains(root, "PySbx_Beta") {
		t.Errorf("root page lists a non-normalized name:\n%s", root)
	}

	// A non-normalized name redirects; http.Get follows it.
	page := httpGet(t, ix.URL+"PySbx_Beta")
	data, err := os.ReadFile(filepath.Join(ix.Dir, WheelFilename(beta)))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	want := `href="/files/` + WheelFilename(beta) + `#sha256=` + hex.EncodeToString(sum[:]) + `"`
	if !strings.Contains(page, want) {
		t.Errorf("project page lacks %s:\n%s", want, page)
	}
	if !strings.Contains(page, `data-requires-python="&gt;=3.6"`) {
		t.Errorf("project page lacks data-requires-python:\n%s", page)
	}
	if n := ix.Hits("/simple/PySbx_Beta"); n != 1 {
		t.Errorf("Hits(/simple/PySbx_Beta) = %d, want 1", n)
	}

	got := httpGet(t, ix.FileURL(WheelFilename(beta)))
	if got != string(data) {
		t.Errorf("served wheel differs from the wheelhouse's")
	}
	if n := ix.TotalFileDownloads(); n != 1 {
		t.Errorf("TotalFileDownloads = %d, want 1", n)
	}

	for _, path := range []string{"/simple/nope/", "/files/nope.whl", "/files/../pypi.go", "/other"} {
		resp, err := http.Get(strings.TrimSuffix(ix.URL, "/simple/") + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: %s, want 404", path, resp.Status)
		}
	}
}

func TestWheelRecordVerifies(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	weird := Package{
		Name:    "Pysbx.Weird_Name",
		Version: "3.0.post1",
		Files: map[string]string{
			"pysbx_weird/__init__.py":     "VALUE = 'w'\n",
			"pysbx_weird/da,ta.txt":       "comma in the name\n",
			"pysbx_weird/empty.py":        "",
			"pysbx_weird_mod.py":          "VALUE = 'mod'\n",
			"pysbx_weird/sub/deep.py":     "VALUE = 'deep'\n",
			"pysbx_weird/sub/__init__.py": "",
		},
	}
	for _, p := range []Package{alpha, beta, weird} {
		path, err := BuildWheel(dir, p)
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Base(path) != WheelFilename(p) {
			t.Errorf("BuildWheel returned %s, want %s", path, WheelFilename(p))
		}
		verifyWheel(t, path, p)
	}
	if got, want := WheelFilename(weird), "pysbx_weird_name-3.0.post1-py3-none-any.whl"; got != want {
		t.Errorf("WheelFilename = %s, want %s", got, want)
	}

	// An independent check by Python's own zipfile/hashlib/csv.
	needPython(t, systemPython)
	script := `
import base64, csv, hashlib, io, sys, zipfile
for path in sys.argv[1:]:
    z = zipfile.ZipFile(path)
    assert z.testzip() is None, path
    rec = [n for n in z.namelist() if n.endswith(".dist-info/RECORD")]
    assert len(rec) == 1, rec
    rows = list(csv.reader(io.StringIO(z.read(rec[0]).decode())))
    listed = set()
    for name, h, size in rows:
        listed.add(name)
        if name == rec[0]:
            assert h == "" and size == "", (name, h, size)
            continue
        data = z.read(name)
        algo, _, digest = h.partition("=")
        want = base64.urlsafe_b64encode(hashlib.new(algo, data).digest()).rstrip(b"=").decode()
        assert digest == want, (name, digest, want)
        assert int(size) == len(data), (name, size, len(data))
    assert listed == set(z.namelist()), (listed ^ set(z.namelist()))
print("ok")
`
	args := []string{"-I", "-c", script}
	for _, p := range []Package{alpha, beta, weird} {
		args = append(args, filepath.Join(dir, WheelFilename(p)))
	}
	out, err := run(t, cleanEnv(), systemPython, args...)
	if err != nil || strings.TrimSpace(out) != "ok" {
		t.Fatalf("python RECORD check: %v\n%s", err, out)
	}

	// pip installs the odd one without complaint, sub-packages and all.
	target := t.TempDir()
	out, err = pipInstall(t, systemPython, target, "--no-index", filepath.Join(dir, WheelFilename(weird)))
	if err != nil {
		t.Fatalf("pip install: %v\n%s", err, out)
	}
	noRecordComplaints(t, out)
	if got := importValue(t, systemPython, target, "pysbx_weird.sub.deep"); got != "'deep'" {
		t.Errorf("pysbx_weird.sub.deep.VALUE = %s", got)
	}
	if got := importValue(t, systemPython, target, "pysbx_weird_mod"); got != "'mod'" {
		t.Errorf("pysbx_weird_mod.VALUE = %s", got)
	}
}

// verifyWheel checks a wheel's layout, metadata and RECORD in Go.
func verifyWheel(t *testing.T, path string, p Package) {
	t.Helper()
	zr, err := zip.OpenReader(path)
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	distInfo := strings.TrimSuffix(filepath.Base(path), "-py3-none-any.whl") + ".dist-info/"
	contents := map[string][]byte{}
	var order []string
	for _, f := range zr.File {
		rc, err := f.Open()
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		if _, dup := contents[f.Name]; dup {
			t.Errorf("%s: duplicate member %s", path, f.Name)
		}
		contents[f.Name] = b
		order = append(order, f.Name)
		if !f.Modified.Equal(Epoch) && !f.Modified.UTC().Equal(Epoch) {
			t.Errorf("%s: %s modified %v, want %v", path, f.Name, f.Modified, Epoch)
		}
	}
	if last := order[len(order)-1]; last != distInfo+"RECORD" {
		t.Errorf("%s: last member is %s, want RECORD", path, last)
	}

	wheel := string(contents[distInfo+"WHEEL"])
	for _, line := range []string{"Wheel-Version: 1.0", "Generator: ", "Root-Is-Purelib: true", "Tag: py3-none-any"} {
		if !strings.Contains(wheel, line) {
			t.Errorf("%s: WHEEL lacks %q:\n%s", path, line, wheel)
		}
	}
	meta := string(contents[distInfo+"METADATA"])
	wantMeta := []string{"Metadata-Version: 2.1\n", "Name: " + p.Name + "\n", "Version: " + p.Version + "\n"}
	for _, r := range p.Requires {
		wantMeta = append(wantMeta, "Requires-Dist: "+r+"\n")
	}
	if p.RequiresPython != "" {
		wantMeta = append(wantMeta, "Requires-Python: "+p.RequiresPython+"\n")
	}
	for _, line := range wantMeta {
		if !strings.Contains(meta, line) {
			t.Errorf("%s: METADATA lacks %q:\n%s", path, line, meta)
		}
	}
	if _, ok := contents[distInfo+"top_level.txt"]; !ok {
		t.Errorf("%s: no top_level.txt", path)
	}

	rows, err := csv.NewReader(bytes.NewReader(contents[distInfo+"RECORD"])).ReadAll()
	if err != nil {
		t.Fatalf("%s: RECORD: %v", path, err)
	}
	listed := map[string]bool{}
	for _, row := range rows {
		if len(row) != 3 {
			t.Errorf("%s: RECORD row %q has %d fields", path, row, len(row))
			continue
		}
		name, hash, size := row[0], row[1], row[2]
		if listed[name] {
			t.Errorf("%s: RECORD lists %s twice", path, name)
		}
		listed[name] = true
		data, ok := contents[name]
		if !ok {
			t.Errorf("%s: RECORD lists missing %s", path, name)
			continue
		}
		if name == distInfo+"RECORD" {
			if hash != "" || size != "" {
				t.Errorf("%s: RECORD's own row is %q, want empty hash and size", path, row)
			}
			continue
		}
		sum := sha256.Sum256(data)
		if want := "sha256=" + base64.RawURLEncoding.EncodeToString(sum[:]); hash != want {
			t.Errorf("%s: %s hash %s, want %s", path, name, hash, want)
		}
		if want := strconv.Itoa(len(data)); size != want {
			t.Errorf("%s: %s size %s, want %s", path, name, size, want)
		}
	}
	for name := range contents {
		if !listed[name] {
			t.Errorf("%s: %s not in RECORD", path, name)
		}
	}
}

func TestPyenvInterpreters(t *testing.T) {
	t.Parallel()
	pythons, _ := filepath.Glob("/root/.pyenv/versions/3.1[23]*/bin/python3")
	if len(pythons) == 0 {
		t.Skip("no pyenv Python 3.12/3.13 present")
	}
	ix := NewIndex(t, alpha, beta)
	for _, py := range pythons {
		t.Run(filepath.Base(filepath.Dir(filepath.Dir(py))), func(t *testing.T) {
			t.Parallel()
			needPython(t, py)
			target := t.TempDir()
			out, err := pipInstall(t, py, target, "--index-url", ix.URL, "pysbx-alpha")
			if err != nil {
				t.Fatalf("pip install: %v\n%s", err, out)
			}
			noRecordComplaints(t, out)
			checkInstalled(t, py, target)
		})
	}
}

func TestDeterministic(t *testing.T) {
	t.Parallel()
	pkgs := []Package{alpha, beta}
	build := func() (out [][]byte) {
		dir := t.TempDir()
		for _, p := range pkgs {
			for _, b := range []func(string, Package) (string, error){BuildWheel, BuildSdist} {
				path, err := b(dir, p)
				if err != nil {
					t.Fatal(err)
				}
				data, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, data)
			}
		}
		return out
	}
	first := build()
	time.Sleep(1100 * time.Millisecond) // a different wall-clock second
	second := build()
	for i := range first {
		if !bytes.Equal(first[i], second[i]) {
			t.Errorf("%s: two builds of archive %d differ", pkgs[i/2].Name, i%2)
		}
	}
	// A different input gives a different wheel.
	a, _ := WheelBytes(alpha)
	other := alpha
	other.Version = "1.0.1"
	b, _ := WheelBytes(other)
	if bytes.Equal(a, b) {
		t.Error("different versions built identical wheels")
	}
}

func TestSdistLayout(t *testing.T) {
	t.Parallel()
	p := beta
	p.Requires = []string{"pysbx-alpha; python_version >= '3'"}
	data, err := SdistBytes(p)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := SdistFilename(p), "pysbx_beta-1.2.tar.gz"; got != want {
		t.Errorf("SdistFilename = %s, want %s", got, want)
	}
	gz, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	got := map[string]string{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		got[h.Name] = string(b)
	}
	for _, name := range []string{"pysbx_beta-1.2/", "pysbx_beta-1.2/PKG-INFO", "pysbx_beta-1.2/setup.py",
		"pysbx_beta-1.2/pyproject.toml", "pysbx_beta-1.2/pysbx_beta/sub.py", "pysbx_beta-1.2/pysbx_beta_single.py"} {
		if _, ok := got[name]; !ok {
			t.Errorf("sdist lacks %s; has %v", name, got)
		}
	}
	setup := got["pysbx_beta-1.2/setup.py"]
	for _, s := range []string{SdistMarker(p.Name), `packages=["pysbx_beta"]`, `py_modules=["pysbx_beta_single"]`,
		`python_requires=">=3.6"`, `install_requires=["pysbx-alpha; python_version >= '3'"]`} {
		if !strings.Contains(setup, s) {
			t.Errorf("setup.py lacks %q:\n%s", s, setup)
		}
	}
	if !strings.Contains(got["pysbx_beta-1.2/pyproject.toml"], `build-backend = "setuptools.build_meta"`) {
		t.Errorf("pyproject.toml: %s", got["pysbx_beta-1.2/pyproject.toml"])
	}
	// setup.py is valid Python.
	if _, err := os.Stat(systemPython); err == nil {
		cmd := exec.Command(systemPython, "-I", "-c", "import ast, sys; ast.parse(sys.stdin.read())")
		cmd.Stdin = strings.NewReader(setup)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("setup.py does not parse: %v\n%s\n%s", err, out, setup)
		}
	}
}

func TestInvalidPackages(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, p := range []Package{
		{Name: "", Version: "1"},
		{Name: "-bad", Version: "1"},
		{Name: "ok", Version: ""},
		{Name: "ok", Version: "1 2"},
		{Name: "ok", Version: "1", Requires: []string{"x\nName: evil"}},
		{Name: "ok", Version: "1", Files: map[string]string{"../escape.py": ""}},
		{Name: "ok", Version: "1", Files: map[string]string{"/abs.py": ""}},
		{Name: "ok", Version: "1", Files: map[string]string{"ok-1.dist-info/RECORD": ""}},
	} {
		if _, err := BuildWheel(dir, p); err == nil {
			t.Errorf("BuildWheel(%+v) succeeded", p)
		}
		if _, err := BuildSdist(dir, p); err == nil {
			t.Errorf("BuildSdist(%+v) succeeded", p)
		}
	}
}

// TestWheelBackend: an sdist built by WheelBackend's backend runs its hook
// and installs the wheel it hands over, with no build requirement from
// the index.
func TestWheelBackend(t *testing.T) {
	t.Parallel()
	needPython(t, systemPython)
	marker := filepath.Join(t.TempDir(), "hook-ran")
	p := Package{Name: uniqueName(t, "pysbx-hooked"), Version: "0.1", SdistOnly: true}
	backend, err := WheelBackend(p, "with open("+pyString(marker)+", 'a') as f:\n    f.write('ran\\n')")
	if err != nil {
		t.Fatal(err)
	}
	p.Backend = backend
	ix := NewIndex(t, p)
	target := t.TempDir()
	out, err := pipInstall(t, systemPython, target, "--index-url", ix.URL, p.Name)
	if err != nil {
		t.Fatalf("pip install: %v\n%s", err, out)
	}
	if got, want := importValue(t, systemPython, target, ModuleName(p.Name)), "'"+DefaultValue(p)+"'"; got != want {
		t.Errorf("VALUE = %s, want %s", got, want)
	}
	if data, err := os.ReadFile(marker); err != nil || !strings.HasPrefix(string(data), "ran\n") {
		t.Errorf("the hook did not run: %q %v", data, err)
	}
	if _, err := WheelBackend(Package{Name: "bad name", Version: "1"}, ""); err == nil {
		t.Errorf("an invalid package gave a backend")
	}
}
