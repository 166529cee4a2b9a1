package engine

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/interp"
	"github.com/pysandbox/pysandbox/internal/testutil"
	"github.com/pysandbox/pysandbox/internal/testutil/pypi"
	"github.com/pysandbox/pysandbox/internal/worker"
)

// shadowProbe is the body of every module of the hostile wheel. Wherever
// it runs, it records the privileges of the process it runs in (in a list
// on builtins, which a fork inherits, so a record made in a zygote reaches
// the runs forked from it), then, when it shadows a real module, loads
// that module in its place so that nothing else notices.
const shadowProbe = `
import builtins as _b, os as _os, sys as _sys
def _rec():
    st = {}
    try:
        for line in open("/proc/self/status"):
            k, _, v = line.partition(":")
            if k in ("CapEff", "CapAmb", "CapPrm", "Seccomp", "NoNewPrivs"):
                st[k] = v.strip()
    except Exception as e:
        st["error"] = repr(e)
    try:
        st["uid_map"] = open("/proc/self/uid_map").read()
    except Exception as e:
        st["uid_map"] = repr(e)
    st["where"] = __name__
    st["pid"] = _os.getpid()
    _b.__dict__.setdefault("_pysbx_shadow_log", []).append(st)
_rec()
del _rec
if __name__ not in ("pysbx_shadow_probe", "pysbx_shadow_pth", "sitecustomize", "usercustomize"):
    # The frozen import machinery: importlib itself may be shadowed too.
    import _frozen_importlib as _u, _frozen_importlib_external as _m
    _here = _os.path.dirname(_os.path.abspath(__file__))
    _spec = _m.PathFinder.find_spec(__name__, [p for p in _sys.path if _os.path.abspath(p or ".") != _here])
    if _spec is not None:
        _mod = _u.module_from_spec(_spec)
        _sys.modules[__name__] = _mod
        _spec.loader.exec_module(_mod)
`

// workerImports are the top-level modules worker.py imports, anywhere in
// it (the zygote's and a child's setup included): taken from the code, so
// a new import is covered without touching this test.
func workerImports(t *testing.T) []string {
	t.Helper()
	re := regexp.MustCompile(`(?m)^\s*(?:import|from)\s+([A-Za-z_][A-Za-z0-9_]*)`)
	seen := map[string]bool{}
	var names []string
	for _, m := range re.FindAllStringSubmatch(string(worker.Source), -1) {
		if !seen[m[1]] {
			seen[m[1]] = true
			names = append(names, m[1])
		}
	}
	// Modules those pull in as they load (socket → selectors, ctypes →
	// struct, json → re, ...), which run as early.
	for _, n := range []string{"selectors", "struct", "re", "enum", "functools", "collections", "codecs", "encodings", "contextlib", "copyreg", "tempfile", "random", "importlib", "site", "signal", "subprocess"} {
		if !seen[n] {
			seen[n] = true
			names = append(names, n)
		}
	}
	if len(names) < 20 || !slices.Contains(names, "base64") || !slices.Contains(names, "fcntl") {
		t.Fatalf("worker imports not found in worker.py: %v", names)
	}
	return names
}

// shadowWheel is a wheel whose top-level modules shadow every stdlib
// module the worker imports, plus a module of its own, a .pth file that
// imports another, and a sitecustomize and usercustomize.
func shadowWheel(t *testing.T) pypi.Package {
	files := map[string]string{
		"pysbx_shadow_probe.py": shadowProbe,
		"pysbx_shadow_pth.py":   shadowProbe,
		"sitecustomize.py":      shadowProbe,
		"usercustomize.py":      shadowProbe,
		"pysbx-shadow.pth":      "import pysbx_shadow_pth\n",
	}
	for _, n := range workerImports(t) {
		files[n+".py"] = shadowProbe
	}
	return pypi.Package{Name: "pysbx-shadow", Version: "1.0.0", Files: files}
}

type shadowRecord struct {
	Where      string `json:"where"`
	PID        int    `json:"pid"`
	CapEff     string `json:"CapEff"`
	CapAmb     string `json:"CapAmb"`
	CapPrm     string `json:"CapPrm"`
	Seccomp    string `json:"Seccomp"`
	NoNewPrivs string `json:"NoNewPrivs"`
	UIDMap     string `json:"uid_map"`
}

const shadowReport = "import builtins, json, pysbx_shadow_probe\njson.dumps(builtins.__dict__.get('_pysbx_shadow_log', []))"

// checkShadowRecords asserts that the wheel's code ran only where user
// code runs: no capability, the strict filter, no_new_privs, no uid 0
// above in the uid map; that no stdlib name was shadowed; and that the
// wheel's own module and its .pth file did run (so the probe works).
func checkShadowRecords(t *testing.T, label string, r *Result, stdlib []string) {
	t.Helper()
	if r.Status != StatusSuccess {
		t.Fatalf("%s: %s %s\n%s", label, r.Status, r.Message, r.Stderr)
	}
	s, _ := r.ReturnValue.(string)
	var recs []shadowRecord
	if err := json.Unmarshal([]byte(s), &recs); err != nil {
		t.Fatalf("%s: %v: %q", label, err, s)
	}
	var where []string
	for _, rec := range recs {
		where = append(where, rec.Where)
		if slices.Contains(stdlib, rec.Where) {
			t.Errorf("%s: the wheel's %s.py shadowed the stdlib module (ran in pid %d)", label, rec.Where, rec.PID)
		}
		for k, v := range map[string]string{"CapEff": rec.CapEff, "CapAmb": rec.CapAmb, "CapPrm": rec.CapPrm} {
			if strings.Trim(v, "0") != "" || v == "" {
				t.Errorf("%s: %s ran with %s=%q", label, rec.Where, k, v)
			}
		}
		if rec.Seccomp != "2" || rec.NoNewPrivs != "1" {
			t.Errorf("%s: %s ran with Seccomp=%q NoNewPrivs=%q", label, rec.Where, rec.Seccomp, rec.NoNewPrivs)
		}
		for _, line := range strings.Split(strings.TrimSpace(rec.UIDMap), "\n") {
			if f := strings.Fields(line); len(f) == 3 && f[1] == "0" {
				t.Errorf("%s: %s ran under a uid_map that maps uid 0 above: %q", label, rec.Where, line)
			}
		}
	}
	for _, want := range []string{"pysbx_shadow_probe", "pysbx_shadow_pth"} {
		if !slices.Contains(where, want) {
			t.Errorf("%s: %s did not run (records: %v)", label, want, where)
		}
	}
}

// TestEscapeDependencyCode: code from a dependency never runs with more
// privilege than the user's own code (issue: a wheel's base64.py ran in
// the warm pool's zygote, which could become host root). It runs in cold
// sandboxes here and against pool children in TestEscapePooled, on the
// system interpreter and a pyenv one, in one-shot runs and in sessions.
func TestEscapeDependencyCode(t *testing.T) {
	wheel := shadowWheel(t)
	stdlib := workerImports(t)
	idx := pypi.NewIndex(t, wheel)
	e := depsEngine(t, idx)
	versions := []string{""}
	for _, it := range interp.Discover(context.Background()) {
		if it.Supported && it.MajorMinor() != e.cfg.Python.MajorMinor() && strings.Contains(it.Path, "/.pyenv/") {
			versions = append(versions, it.MajorMinor())
			break
		}
	}
	deps := []string{"pysbx-shadow"}
	for _, v := range versions {
		name := "system"
		if v != "" {
			name = "pyenv-" + v
		}
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			// Twice: the second run is forked from a zygote that has served
			// the first (in the pooled suite).
			for i := range 2 {
				r, err := e.Run(ctx, RunRequest{Code: shadowReport, Dependencies: deps, PythonVersion: v})
				if err != nil {
					t.Fatal(err)
				}
				checkShadowRecords(t, "one-shot run", r, stdlib)
				_ = i
			}
			s := e.NewSessions(SessionConfig{})
			defer s.Shutdown()
			info, err := s.Create(ctx, time.Minute, CreateOptions{Dependencies: deps, PythonVersion: v})
			if err != nil {
				t.Fatal(err)
			}
			r, err := s.Run(ctx, info.ID, RunRequest{Code: shadowReport})
			if err != nil {
				t.Fatal(err)
			}
			checkShadowRecords(t, "session", r, stdlib)
		})
	}
}

// TestEscapeDependencyState: a run with a dependency leaves nothing for the
// next run with the same dependency (they may share a zygote): not the
// state of the dependency's modules, not a secret, not its code.
func TestEscapeDependencyState(t *testing.T) {
	idx := pypi.NewIndex(t, shadowWheel(t))
	e := depsEngine(t, idx)
	ctx := context.Background()
	deps := []string{"pysbx-shadow"}
	secret := "s3cret-" + strings.Repeat("x", 8) + "-run-A"
	sum := sha256.Sum256([]byte(secret))
	codeA := "import pysbx_shadow_probe, builtins, os\n" +
		"pysbx_shadow_probe.SECRET = " + pyQuote(secret) + "\n" +
		"builtins.LEAK = pysbx_shadow_probe.SECRET\n" +
		"os.environ['LEAK'] = pysbx_shadow_probe.SECRET\n" +
		"open('/tmp/leak', 'w').write(pysbx_shadow_probe.SECRET)\n'stored'"
	r, err := e.Run(ctx, RunRequest{Code: codeA, Dependencies: deps})
	if err != nil || r.ReturnValue != "stored" {
		t.Fatalf("run A: %v %+v", err, r)
	}
	// Run B looks for the secret by its digest, so that its own code does
	// not contain it.
	codeB := `import pysbx_shadow_probe, builtins, os, gc, hashlib, linecache
want = "` + hex.EncodeToString(sum[:]) + `"
found = []
if hasattr(pysbx_shadow_probe, "SECRET"): found.append("module state")
if hasattr(builtins, "LEAK"): found.append("builtins")
if "LEAK" in os.environ: found.append("environment")
if os.path.exists("/tmp/leak"): found.append("/tmp")
for o in gc.get_objects():
    for s in ([o] if isinstance(o, str) else [x for x in (o.values() if isinstance(o, dict) else []) if isinstance(x, str)]):
        if len(s) == ` + strconv.Itoa(len(secret)) + ` and hashlib.sha256(s.encode()).hexdigest() == want:
            found.append("memory")
for lines in linecache.cache.values():
    if len(lines) > 2 and any(("LEAK" + " = ") in l for l in lines[2] or []):
        found.append("run A's code")
found`
	r, err = e.Run(ctx, RunRequest{Code: codeB, Dependencies: deps})
	if err != nil || r.Status != StatusSuccess {
		t.Fatalf("run B: %v %+v", err, r)
	}
	if got, _ := json.Marshal(r.ReturnValue); string(got) != "[]" {
		t.Fatalf("run B saw run A's: %s", got)
	}
}

func pyQuote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// TestEscapeUnprivileged runs the dependency-code and host-information
// attacks again with this test binary started as a throwaway unprivileged
// user (no cgroup delegation, the user's own uid mapped), cold and pooled:
// how most people run pysandbox.
func TestEscapeUnprivileged(t *testing.T) {
	if os.Getenv("PYSANDBOX_TEST_UNPRIVILEGED") != "" || testing.Short() {
		t.Skip("already the unprivileged run, or -short")
	}
	uid, gid := testutil.ThrowawayUser(t)
	// The user must be able to run this binary and write its temp files.
	dir, err := os.MkdirTemp("", "pysbx-unpriv-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin := filepath.Join(dir, "engine.test")
	data, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(os.Chown(tmp, int(uid), int(gid)), os.Chmod(dir, 0o755)); err != nil {
		t.Fatal(err)
	}
	for _, pooled := range []string{"", "1"} {
		cmd := exec.Command(bin, "-test.run", "^(TestEscapeDependencyCode|TestEscapeDependencyState|TestEscapeHostInfo|TestEscapePrivileges)$", "-test.count=1", "-test.v")
		cmd.Dir = tmp
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + tmp, "TMPDIR=" + tmp, "LANG=C.UTF-8",
			"PYSANDBOX_TEST_UNPRIVILEGED=1", "PYSANDBOX_TEST_POOLED=" + pooled}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}}}
		out, err := cmd.CombinedOutput()
		if err != nil || !bytes.Contains(out, []byte("--- PASS: TestEscapeDependencyCode")) {
			t.Fatalf("as uid %d (pooled %q): %v\n%s", uid, pooled, err, out)
		}
		t.Logf("as uid %d (pooled %q):\n%s", uid, pooled, out)
	}
}
