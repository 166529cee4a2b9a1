// Package pypi builds tiny pure-Python distributions (wheels and sdists)
// and serves them from a PEP 503 "simple" package index on 127.0.0.1, so
// tests can install packages with a real pip or uv without the internet.
//
// Everything here is deterministic: building the same Package twice gives
// byte-identical archives.
package pypi

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/base64"
	"encoding/csv"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Package describes a tiny pure-Python distribution to build.
type Package struct {
	// Name is the project name as written, e.g. "pysbx-alpha".
	Name string
	// Version is the version string, e.g. "1.0.0".
	Version string
	// Requires holds Requires-Dist lines, e.g. "pysbx-beta>=1.0".
	Requires []string
	// RequiresPython is the optional Requires-Python specifier, e.g. ">=3.8".
	RequiresPython string
	// Files maps slash-separated paths relative to site-packages to their
	// contents, e.g. {"pysbx_alpha/__init__.py": "VALUE = 42\n"}. When
	// empty, the distribution holds one package named after the
	// normalized project name (ModuleName) whose __init__.py sets
	// VALUE = "<name>-<version>" (DefaultValue).
	Files map[string]string
	// Sdist asks NewIndex to publish a source distribution of this package
	// next to its wheel. BuildWheel and BuildSdist ignore it.
	Sdist bool
	// Backend, when set, is the source of an in-tree PEP 517 build
	// backend (pysbx_backend.py, with no build requirements) that the
	// sdist is built with instead of setup.py: code the installer runs
	// without needing setuptools from the index.
	Backend string
	// SdistOnly publishes the sdist alone, so an installer has to build it.
	SdistOnly bool
}

// Epoch is the modification time stamped on every archive member.
var Epoch = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)

var (
	nameRE    = regexp.MustCompile(`(?i)^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$`)
	versionRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9.+!_-]*$`)
	separator = regexp.MustCompile(`[-_.]+`)
	moduleRE  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// Normalize returns the PEP 503 normalized form of a project name:
// lower case, with runs of "-", "_" and "." replaced by a single "-".
func Normalize(name string) string {
	return strings.ToLower(separator.ReplaceAllString(name, "-"))
}

// ModuleName is the Python package name used by default for a project:
// the normalized name with "-" replaced by "_" ("pysbx-alpha" ->
// "pysbx_alpha").
func ModuleName(name string) string {
	return strings.ReplaceAll(Normalize(name), "-", "_")
}

// DefaultValue is what the default module's VALUE is set to.
func DefaultValue(p Package) string { return p.Name + "-" + p.Version }

// SdistMarker is the file that an sdist built by BuildSdist creates when
// its setup.py runs, i.e. when something builds or installs it from
// source: /tmp/pysbx-sdist-ran-<normalized name>.
func SdistMarker(name string) string {
	return "/tmp/pysbx-sdist-ran-" + Normalize(name)
}

// WheelFilename is the PEP 427 file name BuildWheel gives p's wheel.
func WheelFilename(p Package) string {
	return distStem(p) + "-py3-none-any.whl"
}

// SdistFilename is the (PEP 625) file name BuildSdist gives p's sdist.
func SdistFilename(p Package) string {
	return distStem(p) + ".tar.gz"
}

// distStem is "<escaped name>-<escaped version>".
func distStem(p Package) string {
	return ModuleName(p.Name) + "-" + strings.ReplaceAll(p.Version, "-", "_")
}

func (p Package) validate() error {
	if !nameRE.MatchString(p.Name) {
		return fmt.Errorf("pypi: invalid project name %q", p.Name)
	}
	if !versionRE.MatchString(p.Version) {
		return fmt.Errorf("pypi: invalid version %q for %s", p.Version, p.Name)
	}
	for _, line := range append(append([]string{}, p.Requires...), p.RequiresPython) {
		if strings.ContainsAny(line, "\r\n") {
			return fmt.Errorf("pypi: %s: metadata value %q contains a newline", p.Name, line)
		}
	}
	for name := range p.Files {
		if name == "" || strings.HasPrefix(name, "/") || strings.Contains(name, "\\") ||
			path.Clean(name) != name || name == "." || name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Errorf("pypi: %s: bad file path %q", p.Name, name)
		}
		top := strings.SplitN(name, "/", 2)[0]
		if strings.HasSuffix(top, ".dist-info") || strings.HasSuffix(top, ".data") ||
			strings.HasSuffix(top, ".egg-info") {
			return fmt.Errorf("pypi: %s: file path %q collides with generated metadata", p.Name, name)
		}
	}
	return nil
}

// files returns p's module files, sorted by path, filling in the default.
func (p Package) files() []file {
	m := p.Files
	if len(m) == 0 {
		m = map[string]string{
			ModuleName(p.Name) + "/__init__.py": "VALUE = " + pyString(DefaultValue(p)) + "\n",
		}
	}
	out := make([]file, 0, len(m))
	for name, data := range m {
		out = append(out, file{name, []byte(data)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

type file struct {
	name string
	data []byte
}

// pyString quotes s as a Python string literal. Go's quoting of printable
// ASCII and its \n, \t, \", \\, \xNN and \uNNNN escapes mean the same in
// Python.
func pyString(s string) string { return strconv.QuoteToASCII(s) }

// topLevel lists the importable top-level names of files, as in
// top_level.txt.
func topLevel(files []file) []string {
	seen := map[string]bool{}
	var out []string
	for _, f := range files {
		parts := strings.SplitN(f.name, "/", 2)
		var name string
		if len(parts) == 2 {
			name = parts[0]
		} else if strings.HasSuffix(parts[0], ".py") {
			name = strings.TrimSuffix(parts[0], ".py")
		} else {
			continue
		}
		if !seen[name] {
			seen[name] = true
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// metadata renders core metadata 2.1 (METADATA in a wheel, PKG-INFO in an
// sdist).
func metadata(p Package) []byte {
	var b strings.Builder
	b.WriteString("Metadata-Version: 2.1\n")
	fmt.Fprintf(&b, "Name: %s\n", p.Name)
	fmt.Fprintf(&b, "Version: %s\n", p.Version)
	fmt.Fprintf(&b, "Summary: pysandbox test fixture %s\n", p.Name)
	if p.RequiresPython != "" {
		fmt.Fprintf(&b, "Requires-Python: %s\n", p.RequiresPython)
	}
	for _, r := range p.Requires {
		fmt.Fprintf(&b, "Requires-Dist: %s\n", r)
	}
	return []byte(b.String())
}

// Generator is the WHEEL file's Generator value.
const Generator = "pysandbox-testutil-pypi (1.0)"

// WheelBytes returns the bytes of p's wheel (see BuildWheel).
func WheelBytes(p Package) ([]byte, error) {
	if err := p.validate(); err != nil {
		return nil, err
	}
	files := p.files()
	distInfo := distStem(p) + ".dist-info"

	wheel := "Wheel-Version: 1.0\n" +
		"Generator: " + Generator + "\n" +
		"Root-Is-Purelib: true\n" +
		"Tag: py3-none-any\n"
	top := strings.Join(topLevel(files), "\n")
	if top != "" {
		top += "\n"
	}
	files = append(files,
		file{distInfo + "/METADATA", metadata(p)},
		file{distInfo + "/WHEEL", []byte(wheel)},
		file{distInfo + "/top_level.txt", []byte(top)},
	)

	var record bytes.Buffer
	cw := csv.NewWriter(&record)
	for _, f := range files {
		sum := sha256.Sum256(f.data)
		if err := cw.Write([]string{
			f.name,
			"sha256=" + base64.RawURLEncoding.EncodeToString(sum[:]),
			strconv.Itoa(len(f.data)),
		}); err != nil {
			return nil, err
		}
	}
	if err := cw.Write([]string{distInfo + "/RECORD", "", ""}); err != nil {
		return nil, err
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return nil, err
	}
	files = append(files, file{distInfo + "/RECORD", record.Bytes()})

	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, f := range files {
		h := &zip.FileHeader{Name: f.name, Method: zip.Deflate, Modified: Epoch}
		h.SetMode(0o644)
		w, err := zw.CreateHeader(h)
		if err != nil {
			return nil, err
		}
		if _, err := w.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// BuildWheel writes a py3-none-any wheel of p into dir (created if
// missing) and returns its path. The wheel has the PEP 427 file name, the
// module files, and a dist-info directory with METADATA (core metadata
// 2.1), WHEEL, top_level.txt and RECORD (sha256 digests and sizes, with an
// empty hash on RECORD's own line). Member timestamps are fixed at Epoch,
// so the same Package always gives the same bytes.
func BuildWheel(dir string, p Package) (string, error) {
	data, err := WheelBytes(p)
	if err != nil {
		return "", err
	}
	return writeFile(dir, WheelFilename(p), data)
}

// setupPy renders the sdist's setup.py: it records that it ran by creating
// SdistMarker(p.Name) before calling setuptools.setup.
func setupPy(p Package, files []file) string {
	var pkgs, mods []string
	for _, f := range files {
		dir, base := path.Split(f.name)
		if dir == "" {
			if m, ok := strings.CutSuffix(base, ".py"); ok && moduleRE.MatchString(m) {
				mods = append(mods, m)
			}
			continue
		}
		if base == "__init__.py" {
			pkgs = append(pkgs, strings.ReplaceAll(strings.TrimSuffix(dir, "/"), "/", "."))
		}
	}
	list := func(xs []string) string {
		q := make([]string, len(xs))
		for i, x := range xs {
			q[i] = pyString(x)
		}
		return "[" + strings.Join(q, ", ") + "]"
	}
	var b strings.Builder
	b.WriteString("# Generated by pysandbox internal/testutil/pypi.\n")
	b.WriteString("# Running this file is running arbitrary code: it leaves a marker behind.\n")
	b.WriteString("import os\n")
	b.WriteString("from setuptools import setup\n\n")
	fmt.Fprintf(&b, "with open(%s, \"w\") as f:\n", pyString(SdistMarker(p.Name)))
	b.WriteString("    f.write(\"setup.py ran in pid %d\\n\" % os.getpid())\n\n")
	b.WriteString("setup(\n")
	fmt.Fprintf(&b, "    name=%s,\n", pyString(p.Name))
	fmt.Fprintf(&b, "    version=%s,\n", pyString(p.Version))
	fmt.Fprintf(&b, "    description=%s,\n", pyString("pysandbox test fixture "+p.Name))
	fmt.Fprintf(&b, "    packages=%s,\n", list(pkgs))
	fmt.Fprintf(&b, "    py_modules=%s,\n", list(mods))
	b.WriteString("    include_package_data=True,\n")
	fmt.Fprintf(&b, "    install_requires=%s,\n", list(p.Requires))
	if p.RequiresPython != "" {
		fmt.Fprintf(&b, "    python_requires=%s,\n", pyString(p.RequiresPython))
	}
	b.WriteString(")\n")
	return b.String()
}

const pyprojectToml = `[build-system]
requires = ["setuptools>=40.8.0", "wheel"]
build-backend = "setuptools.build_meta"
`

// WheelBackend returns the source of an in-tree build backend, for
// Package.Backend, whose build_wheel runs hook (Python statements, with os
// imported) and then hands over p's wheel (WheelBytes): an sdist whose
// build does something of its own and still installs. Installers may call
// build_wheel more than once (for the metadata, then for the wheel), so
// the hook should not mind running twice.
func WheelBackend(p Package, hook string) (string, error) {
	whl, err := WheelBytes(p)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("# Generated by pysandbox internal/testutil/pypi.\n")
	b.WriteString("import base64, os\n\n")
	fmt.Fprintf(&b, "_NAME = %s\n", pyString(WheelFilename(p)))
	fmt.Fprintf(&b, "_WHEEL = %s\n\n", pyString(base64.StdEncoding.EncodeToString(whl)))
	b.WriteString("def _hook():\n")
	for _, l := range strings.Split(hook, "\n") {
		b.WriteString("    " + l + "\n")
	}
	b.WriteString("    pass\n\n")
	b.WriteString("def get_requires_for_build_wheel(config_settings=None):\n    return []\n\n")
	b.WriteString("def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):\n")
	b.WriteString("    _hook()\n")
	b.WriteString("    with open(os.path.join(wheel_directory, _NAME), \"wb\") as f:\n")
	b.WriteString("        f.write(base64.b64decode(_WHEEL))\n")
	b.WriteString("    return _NAME\n")
	return b.String(), nil
}

// SdistBytes returns the bytes of p's sdist (see BuildSdist).
func SdistBytes(p Package) ([]byte, error) {
	if err := p.validate(); err != nil {
		return nil, err
	}
	files := p.files()
	root := distStem(p)
	members := append([]file{
		{"PKG-INFO", metadata(p)},
		{"pyproject.toml", []byte(pyprojectToml)},
		{"setup.py", []byte(setupPy(p, files))},
	}, files...)
	if p.Backend != "" {
		members[1].data = []byte("[build-system]\nrequires = []\nbuild-backend = \"pysbx_backend\"\nbackend-path = [\".\"]\n")
		members = append(members, file{"pysbx_backend.py", []byte(p.Backend)})
	}
	sort.Slice(members, func(i, j int) bool { return members[i].name < members[j].name })

	var buf bytes.Buffer
	gz, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	gz.ModTime = time.Time{} // no timestamp in the gzip header
	gz.OS = 255              // "unknown", independent of the host
	tw := tar.NewWriter(gz)
	dirs := map[string]bool{}
	addDir := func(name string) error {
		if dirs[name] {
			return nil
		}
		dirs[name] = true
		return tw.WriteHeader(&tar.Header{
			Typeflag: tar.TypeDir, Name: name + "/", Mode: 0o755,
			ModTime: Epoch, Format: tar.FormatPAX,
		})
	}
	if err := addDir(root); err != nil {
		return nil, err
	}
	for _, f := range members {
		full := root + "/" + f.name
		// Parent directories, outermost first.
		parts := strings.Split(f.name, "/")
		for i := 1; i < len(parts); i++ {
			if err := addDir(root + "/" + strings.Join(parts[:i], "/")); err != nil {
				return nil, err
			}
		}
		if err := tw.WriteHeader(&tar.Header{
			Typeflag: tar.TypeReg, Name: full, Mode: 0o644, Size: int64(len(f.data)),
			ModTime: Epoch, Format: tar.FormatPAX,
		}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := gz.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// BuildSdist writes a .tar.gz source distribution of p into dir (created
// if missing) and returns its path. It holds <name>-<version>/ with
// PKG-INFO, pyproject.toml (setuptools.build_meta backend), the module
// files and a setup.py that, when run, creates SdistMarker(p.Name) — so a
// test can tell whether anything built the sdist. Deterministic like
// BuildWheel.
//
// Building it needs setuptools and wheel: pip's default isolated build
// fetches them from the index, so against an Index (which does not carry
// them) use --no-build-isolation with an interpreter that has them.
func BuildSdist(dir string, p Package) (string, error) {
	data, err := SdistBytes(p)
	if err != nil {
		return "", err
	}
	return writeFile(dir, SdistFilename(p), data)
}

func writeFile(dir, name string, data []byte) (string, error) {
	if dir == "" {
		return "", errors.New("pypi: empty output directory")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	p := filepath.Join(dir, name)
	// Write then rename, so a concurrent reader (the index) never sees a
	// partial file.
	tmp, err := os.CreateTemp(dir, "."+name+".tmp*")
	if err != nil {
		return "", err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return "", err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return "", err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return "", err
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		os.Remove(tmp.Name())
		return "", err
	}
	return p, nil
}
