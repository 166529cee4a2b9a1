// Package interp finds Python interpreters on the host and asks each one
// what it is. Nothing here trusts a path's name: every interpreter reports
// its own version and prefix.
package interp

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"
)

// MinVersion is the oldest Python the worker supports (top-level await
// needs ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, new in 3.8).
var MinVersion = [2]int{3, 8}

// Arch is this machine's architecture as uv and python-build-standalone
// name it in their download metadata and archives (x86_64, aarch64).
func Arch() string {
	switch runtime.GOARCH {
	case "amd64":
		return "x86_64"
	case "arm64":
		return "aarch64"
	}
	return runtime.GOARCH
}

// Interpreter is one Python installation.
type Interpreter struct {
	Path    string `json:"path"`    // absolute, symlinks resolved
	Version string `json:"version"` // e.g. "3.11.2"
	Major   int    `json:"-"`
	Minor   int    `json:"-"`
	// Prefix is sys.base_prefix: the tree the sandbox must make visible.
	Prefix    string `json:"prefix"`
	Supported bool   `json:"supported"`
	Source    string `json:"source"` // "system", "path", "pyenv", "uv", "flag"
}

// MajorMinor is "3.11".
func (i *Interpreter) MajorMinor() string { return fmt.Sprintf("%d.%d", i.Major, i.Minor) }

const probeCode = `import sys, json; print(json.dumps([list(sys.version_info[:3]), sys.base_prefix]))`

// Inspect runs path and asks it what it is.
func Inspect(ctx context.Context, path string) (*Interpreter, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("interp: %w", err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return nil, fmt.Errorf("interp: %s: %w", path, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, real, "-I", "-S", "-c", probeCode)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8"}
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("interp: %s does not run as Python: %w", path, err)
	}
	var info struct {
		V      []int
		Prefix string
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(out, &raw); err != nil || len(raw) != 2 {
		return nil, fmt.Errorf("interp: %s: unexpected answer %q", path, out)
	}
	if json.Unmarshal(raw[0], &info.V) != nil || json.Unmarshal(raw[1], &info.Prefix) != nil || len(info.V) != 3 {
		return nil, fmt.Errorf("interp: %s: unexpected answer %q", path, out)
	}
	it := &Interpreter{
		Path:    real,
		Version: fmt.Sprintf("%d.%d.%d", info.V[0], info.V[1], info.V[2]),
		Major:   info.V[0],
		Minor:   info.V[1],
		Prefix:  filepath.Clean(info.Prefix),
	}
	it.Supported = it.Major == MinVersion[0] && it.Minor >= MinVersion[1]
	return it, nil
}

var versionRE = regexp.MustCompile(`^3\.[0-9]{1,2}(\.[0-9]{1,3})?$`)

// Find resolves a --python value: a path, a version such as "3.12", or ""
// for the system's python3.
func Find(ctx context.Context, spec string) (*Interpreter, error) {
	switch {
	case spec == "":
		for _, p := range []string{"/usr/bin/python3", "/usr/local/bin/python3"} {
			if it, err := Inspect(ctx, p); err == nil {
				it.Source = "system"
				return checkSupported(it)
			}
		}
		p, err := exec.LookPath("python3")
		if err != nil {
			return nil, fmt.Errorf("interp: no python3 found (install python3 or pass --python PATH)")
		}
		it, err := Inspect(ctx, p)
		if err != nil {
			return nil, err
		}
		it.Source = "path"
		return checkSupported(it)
	case strings.ContainsRune(spec, '/'):
		it, err := Inspect(ctx, spec)
		if err != nil {
			return nil, err
		}
		it.Source = "flag"
		return checkSupported(it)
	case versionRE.MatchString(spec):
		all := Discover(ctx)
		for _, it := range all {
			if it.MajorMinor() == spec || it.Version == spec {
				return checkSupported(it)
			}
		}
		return nil, fmt.Errorf("interp: Python %s not found; available: %s", spec, versionList(all))
	}
	return nil, fmt.Errorf("interp: --python %q is neither a path nor a version like 3.12", spec)
}

func checkSupported(it *Interpreter) (*Interpreter, error) {
	if !it.Supported {
		return nil, fmt.Errorf("interp: %s is Python %s; pysandbox needs %d.%d or newer", it.Path, it.Version, MinVersion[0], MinVersion[1])
	}
	return it, nil
}

func versionList(all []*Interpreter) string {
	var vs []string
	for _, it := range all {
		if it.Supported {
			vs = append(vs, it.Version)
		}
	}
	if len(vs) == 0 {
		return "none"
	}
	return strings.Join(vs, ", ")
}

// Discover lists the interpreters on this machine: /usr/bin/python3.X,
// python3.X on PATH, pyenv versions and uv-managed Pythons. Each distinct real path appears
// once, newest version first.
func Discover(ctx context.Context) []*Interpreter {
	type cand struct{ path, source string }
	var cands []cand
	for _, pat := range []string{"/usr/bin/python3.*", "/usr/local/bin/python3.*"} {
		m, _ := filepath.Glob(pat)
		for _, p := range m {
			cands = append(cands, cand{p, "system"})
		}
	}
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		if dir == "" || strings.Contains(dir, "/shims") {
			continue // pyenv shims are shell scripts that pick a version by cwd
		}
		m, _ := filepath.Glob(filepath.Join(dir, "python3.*"))
		for _, p := range m {
			cands = append(cands, cand{p, "path"})
		}
	}
	pyenv := os.Getenv("PYENV_ROOT")
	if pyenv == "" {
		if home, err := os.UserHomeDir(); err == nil {
			pyenv = filepath.Join(home, ".pyenv")
		}
	}
	if pyenv != "" {
		m, _ := filepath.Glob(filepath.Join(pyenv, "versions", "*", "bin", "python3"))
		for _, p := range m {
			cands = append(cands, cand{p, "pyenv"})
		}
	}
	// uv-managed interpreters (`uv python install`).
	uvDirs := []string{os.Getenv("UV_PYTHON_INSTALL_DIR")}
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		uvDirs = append(uvDirs, filepath.Join(d, "uv", "python"))
	}
	if home, err := os.UserHomeDir(); err == nil {
		uvDirs = append(uvDirs, filepath.Join(home, ".local", "share", "uv", "python"))
	}
	for _, d := range uvDirs {
		if d == "" {
			continue
		}
		m, _ := filepath.Glob(filepath.Join(d, "cpython-3*", "bin", "python3"))
		for _, p := range m {
			cands = append(cands, cand{p, "uv"})
		}
	}
	nameRE := regexp.MustCompile(`python3(\.[0-9]+)?$`)
	seen := map[string]bool{}
	var out []*Interpreter
	for _, c := range cands {
		if !nameRE.MatchString(c.path) {
			continue // python3.11-config and friends
		}
		real, err := filepath.EvalSymlinks(c.path)
		if err != nil || seen[real] {
			continue
		}
		seen[real] = true
		it, err := Inspect(ctx, real)
		if err != nil {
			continue
		}
		it.Source = c.source
		out = append(out, it)
	}
	sort.SliceStable(out, func(a, b int) bool { return versionLess(out[b].Version, out[a].Version) })
	return out
}

func versionLess(a, b string) bool {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(pa) && i < len(pb); i++ {
		x, _ := strconv.Atoi(pa[i])
		y, _ := strconv.Atoi(pb[i])
		if x != y {
			return x < y
		}
	}
	return len(pa) < len(pb)
}
