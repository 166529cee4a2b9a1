package engine

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/interp"
	"github.com/pysandbox/pysandbox/internal/testutil/pypi"
)

var (
	alpha = pypi.Package{Name: "pysbx-alpha", Version: "1.0.0", Requires: []string{"pysbx-beta>=1.0"},
		Files: map[string]string{"pysbx_alpha/__init__.py": "import pysbx_beta\nVALUE = 'alpha+' + pysbx_beta.VALUE\n"}}
	beta = pypi.Package{Name: "pysbx-beta", Version: "1.2.0"}
)

// depsEngine is an engine with a dependency cache over a test index.
func depsEngine(t *testing.T, idx *pypi.Index) *Engine {
	t.Helper()
	return newEngine(t, func(c *Config) {
		c.MaxTimeout = time.Minute
		c.Interpreters = interp.Discover(context.Background())
		c.Deps = testDeps(t, idx, c.Limits)
		if escPooled {
			poolize(t, c)
		}
	})
}

func TestRunWithDependencies(t *testing.T) {
	idx := pypi.NewIndex(t, alpha, beta)
	e := depsEngine(t, idx)
	ctx := context.Background()
	code := "import pysbx_alpha\npysbx_alpha.VALUE"
	r, err := e.Run(ctx, RunRequest{Code: code, Dependencies: []string{"pysbx-alpha"}})
	if err != nil || r.Status != StatusSuccess || r.ReturnValue != "alpha+pysbx-beta-1.2.0" {
		t.Fatalf("%v %+v", err, r)
	}
	downloads := idx.TotalFileDownloads()
	// The same set again: a cache hit, the index untouched.
	r, err = e.Run(ctx, RunRequest{Code: code, Dependencies: []string{"PySbx_Alpha"}})
	if err != nil || r.Status != StatusSuccess || idx.TotalFileDownloads() != downloads {
		t.Fatalf("cache hit: %v %+v, downloads %d → %d", err, r, downloads, idx.TotalFileDownloads())
	}
	// A run that did not ask for them cannot see them.
	r, _ = e.Run(ctx, RunRequest{Code: code})
	if r.Status != StatusError || r.Error == nil || r.Error.Type != "ModuleNotFoundError" {
		t.Fatalf("a run without dependencies imported them: %+v", r)
	}
	// The inline block works the same.
	inline := "# /// script\n# dependencies = [\"pysbx-alpha\"]\n# ///\n" + code
	if r, err = e.Run(ctx, RunRequest{Code: inline}); err != nil || r.ReturnValue != "alpha+pysbx-beta-1.2.0" {
		t.Fatalf("inline block: %v %+v", err, r)
	}
	// The environment is read-only inside.
	r, _ = e.Run(ctx, RunRequest{Code: "import pysbx_alpha, os\nopen(os.path.dirname(pysbx_alpha.__file__) + '/x', 'w')", Dependencies: []string{"pysbx-alpha"}})
	if r.Status != StatusError || !strings.Contains(r.Stderr, "Read-only file system") {
		t.Fatalf("environment writable from a run: %+v", r)
	}
}

func TestUnknownPackageIsInstallError(t *testing.T) {
	idx := pypi.NewIndex(t, beta)
	e := depsEngine(t, idx)
	r, err := e.Run(context.Background(), RunRequest{Code: "1", Dependencies: []string{"pysbx-nosuch"}})
	if err != nil || r.Status != StatusInstallError || !strings.Contains(r.Message, "pysbx-nosuch") {
		t.Fatalf("%v %+v", err, r)
	}
}

func TestPythonVersionSelection(t *testing.T) {
	e := newEngine(t, func(c *Config) { c.Interpreters = interp.Discover(context.Background()) })
	var other *interp.Interpreter
	for _, it := range e.cfg.Interpreters {
		if it.Supported && it.MajorMinor() != e.cfg.Python.MajorMinor() {
			other = it
			break
		}
	}
	if other == nil {
		t.Skip("only one supported interpreter on this machine")
	}
	ctx := context.Background()
	r, err := e.Run(ctx, RunRequest{Code: "import sys\n'%d.%d' % sys.version_info[:2]", PythonVersion: other.MajorMinor()})
	if err != nil || r.ReturnValue != other.MajorMinor() {
		t.Fatalf("python_version %s: %v %+v", other.MajorMinor(), err, r)
	}
	// requires-python picks an interpreter that satisfies it.
	code := fmt.Sprintf("# /// script\n# requires-python = \"==%s.*\"\n# ///\nimport sys\n'%%d.%%d' %% sys.version_info[:2]", other.MajorMinor())
	if r, err = e.Run(ctx, RunRequest{Code: code}); err != nil || r.ReturnValue != other.MajorMinor() {
		t.Fatalf("requires-python: %v %+v", err, r)
	}
	if _, err = e.Run(ctx, RunRequest{Code: "1", PythonVersion: "3.99"}); err == nil || !strings.Contains(err.Error(), "available:") {
		t.Fatalf("unknown version: %v", err)
	}
	// Too old for the worker: said so, whether or not the host has it.
	if _, err = e.Run(ctx, RunRequest{Code: "1", PythonVersion: "3.7"}); err == nil || !strings.Contains(err.Error(), "python_version 3.7 is older than pysandbox runs: its worker needs Python 3.8 or later") {
		t.Fatalf("too old a version: %v", err)
	}
}

func TestSessionInstallPackage(t *testing.T) {
	idx := pypi.NewIndex(t, alpha, beta)
	e := depsEngine(t, idx)
	s := e.NewSessions(SessionConfig{})
	defer s.Shutdown()
	ctx := context.Background()
	info, err := s.Create(ctx, 0, CreateOptions{Dependencies: []string{"pysbx-beta"}})
	if err != nil {
		t.Fatal(err)
	}
	if r := srun(t, s, info.ID, "import pysbx_beta\nx = pysbx_beta.VALUE\nx"); r.ReturnValue != "pysbx-beta-1.2.0" {
		t.Fatalf("session dependencies: %+v", r)
	}
	if _, err := s.Install(ctx, info.ID, []string{"pysbx-alpha"}, nil); err != nil {
		t.Fatal(err)
	}
	if r := srun(t, s, info.ID, "import pysbx_alpha\n[x, pysbx_alpha.VALUE]"); fmt.Sprint(r.ReturnValue) != "[pysbx-beta-1.2.0 alpha+pysbx-beta-1.2.0]" {
		t.Fatalf("after install_package: %+v", r)
	}
	_ = os.Getpid
}
