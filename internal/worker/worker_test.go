package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

const systemPython = "/usr/bin/python3"

// testWorker is a real worker process driven through a socketpair, as the
// sandbox will do it, with stdout and stderr going to files so that their
// content can be checked at the moment a reply arrives.
type testWorker struct {
	conn           *Conn
	cmd            *exec.Cmd
	dir            string
	stdout, stderr string // file paths
	outOff, errOff int64
	exited         chan struct{}
	waitErr        error
}

// pythonOK reports whether python can run the worker; tests skip otherwise.
func requirePython(t *testing.T, python string) {
	t.Helper()
	if _, err := os.Stat(python); err != nil {
		t.Skipf("%s not available: %v", python, err)
	}
}

// startWorker starts argv (built with Command, possibly wrapped) with the
// worker script written to a temporary directory. script is substituted for
// the literal "WORKER_PY" in argv.
func startWorker(t *testing.T, argv []string) *testWorker {
	t.Helper()
	dir := t.TempDir()
	script := filepath.Join(dir, "worker.py")
	if err := os.WriteFile(script, Source, 0o444); err != nil {
		t.Fatal(err)
	}
	scratch := filepath.Join(dir, "scratch")
	if err := os.Mkdir(scratch, 0o755); err != nil {
		t.Fatal(err)
	}
	argv = append([]string(nil), argv...)
	for i, a := range argv {
		if a == "WORKER_PY" {
			argv[i] = script
		}
	}

	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	parent := os.NewFile(uintptr(fds[0]), "control-parent")
	child := os.NewFile(uintptr(fds[1]), "control-child")
	nc, err := net.FileConn(parent)
	parent.Close()
	if err != nil {
		child.Close()
		t.Fatal(err)
	}

	w := &testWorker{
		conn:   NewConn(nc),
		dir:    scratch,
		stdout: filepath.Join(dir, "stdout"),
		stderr: filepath.Join(dir, "stderr"),
		exited: make(chan struct{}),
	}
	stdout, err := os.Create(w.stdout)
	if err != nil {
		t.Fatal(err)
	}
	defer stdout.Close()
	stderr, err := os.Create(w.stderr)
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()

	w.cmd = exec.Command(argv[0], argv[1:]...)
	w.cmd.Dir = scratch
	w.cmd.Stdout = stdout
	w.cmd.Stderr = stderr
	w.cmd.ExtraFiles = []*os.File{child} // becomes fd 3
	err = w.cmd.Start()
	// The child has its copy; ours must go so that the worker's death is
	// seen as EOF.
	child.Close()
	if err != nil {
		w.conn.Close()
		t.Fatal(err)
	}
	go func() {
		w.waitErr = w.cmd.Wait()
		close(w.exited)
	}()
	t.Cleanup(func() {
		// Tests that care how the worker exits have waited for it already.
		w.conn.Close()
		w.cmd.Process.Kill()
		<-w.exited
	})
	return w
}

func startPython(t *testing.T, python string, oneshot bool) *testWorker {
	t.Helper()
	requirePython(t, python)
	return startWorker(t, Command(python, "WORKER_PY", oneshot))
}

// output returns what the worker wrote to stdout and stderr since the last
// call.
func (w *testWorker) output(t *testing.T) (stdout, stderr string) {
	t.Helper()
	read := func(path string, off *int64) string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		s := string(b[*off:])
		*off = int64(len(b))
		return s
	}
	return read(w.stdout, &w.outOff), read(w.stderr, &w.errOff)
}

// exitCode waits for the worker to exit and returns its exit status.
func (w *testWorker) exitCode(t *testing.T) int {
	t.Helper()
	select {
	case <-w.exited:
	case <-time.After(10 * time.Second):
		t.Fatal("worker did not exit")
	}
	return w.cmd.ProcessState.ExitCode()
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a hang guard: 10× a loaded machine
	t.Cleanup(cancel)
	return ctx
}

func (w *testWorker) run(t *testing.T, req Request) (res *Result, stdout, stderr string) {
	t.Helper()
	res, err := w.conn.Run(testContext(t), req)
	// Read the output right away: it must be complete once the reply is in.
	stdout, stderr = w.output(t)
	if err != nil {
		t.Fatalf("Run(%q): %v\nstderr:\n%s", req.Code, err, stderr)
	}
	return res, stdout, stderr
}

// interpreters returns the Pythons to test the worker with: Debian's and
// every pyenv 3.8-3.13 that is installed.
func interpreters(t *testing.T) map[string]string {
	t.Helper()
	pys := map[string]string{}
	if _, err := os.Stat(systemPython); err == nil {
		pys["system"] = systemPython
	}
	paths, _ := filepath.Glob("/root/.pyenv/versions/*/bin/python3")
	for _, p := range paths {
		v := filepath.Base(filepath.Dir(filepath.Dir(p)))
		m := regexp.MustCompile(`^3\.(\d+)\.\d+$`).FindStringSubmatch(v)
		if m == nil {
			continue
		}
		if minor, _ := strconv.Atoi(m[1]); minor < 8 || minor > 13 {
			continue
		}
		pys[v] = p
	}
	if len(pys) == 0 {
		t.Skip("no Python interpreter found")
	}
	return pys
}

func jsonEqual(t *testing.T, got json.RawMessage, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("return value %s: %v", got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(g) != fmt.Sprint(w) {
		t.Errorf("return value = %s, want %s", got, want)
	}
}

func reprValue(t *testing.T, res *Result) string {
	t.Helper()
	if !res.ReturnRepr {
		t.Errorf("ReturnRepr = false, want true (value %s)", res.ReturnValue)
	}
	var s string
	if err := json.Unmarshal(res.ReturnValue, &s); err != nil {
		t.Fatalf("repr value %s is not a JSON string: %v", res.ReturnValue, err)
	}
	return s
}

func wantError(t *testing.T, res *Result, typ string, exitCode int) {
	t.Helper()
	if res.Status != "error" || res.ExitCode != exitCode || res.Error == nil || res.Error.Type != typ {
		t.Fatalf("result = %+v (error %+v), want error %s, exit code %d", res, res.Error, typ, exitCode)
	}
}

func wantSuccess(t *testing.T, res *Result) {
	t.Helper()
	if res.Status != "success" || res.ExitCode != 0 || res.Error != nil {
		t.Fatalf("result = %+v (error %+v), want success", res, res.Error)
	}
}

// TestCore runs the behaviour users rely on against every interpreter
// version they may select. One worker per version serves all cases, which
// also checks that runs do not leak state into each other.
func TestCore(t *testing.T) {
	for name, python := range interpreters(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			w := startPython(t, python, false)
			ready, err := w.conn.Ready(testContext(t))
			if err != nil {
				t.Fatal(err)
			}
			if ready.Op != OpReady || ready.Version[0] != 3 || ready.PID != w.cmd.Process.Pid ||
				!strings.HasPrefix(ready.Python, fmt.Sprintf("3.%d.", ready.Version[1])) {
				t.Errorf("ready = %+v", ready)
			}
			if name != "system" && !strings.HasPrefix(name, ready.Python) {
				t.Errorf("ready.Python = %q, want %s", ready.Python, name)
			}
			coreCases(t, w)
		})
	}
}

func coreCases(t *testing.T, w *testWorker) {
	t.Run("print and last expression", func(t *testing.T) {
		res, out, _ := w.run(t, Request{Code: "print('hello')\nx = 20\nx + 22\n"})
		wantSuccess(t, res)
		jsonEqual(t, res.ReturnValue, "42")
		if res.ReturnRepr {
			t.Error("ReturnRepr = true")
		}
		if out != "hello\n" { // the value is returned, not printed
			t.Errorf("stdout = %q", out)
		}
	})
	t.Run("statement returns null", func(t *testing.T) {
		res, _, _ := w.run(t, Request{Code: "x = 1"})
		wantSuccess(t, res)
		if string(res.ReturnValue) != "null" || res.ReturnRepr {
			t.Errorf("return = %s repr=%v, want null", res.ReturnValue, res.ReturnRepr)
		}
	})
	t.Run("None returns null", func(t *testing.T) {
		res, _, _ := w.run(t, Request{Code: "None"})
		if string(res.ReturnValue) != "null" {
			t.Errorf("return = %s, want null", res.ReturnValue)
		}
	})
	t.Run("numpy scalars are their values", func(t *testing.T) {
		code := "try:\n    import numpy as np\nexcept ImportError:\n    np = None\n" +
			"[np.int64(45), np.float32(1.5), np.bool_(True), np.uint8(7), {'k': np.int32(-3)}, np.int64(2**62)] if np else 'no numpy'"
		// A date is not a number: its repr says what it is (its item()
		// would be epoch nanoseconds).
		dateCode := "try:\n    import numpy as np\nexcept ImportError:\n    np = None\nnp.datetime64('2024-01-01T00:00:00', 'ns') if np else 'no numpy'"
		res, _, _ := w.run(t, Request{Code: code})
		wantSuccess(t, res)
		if string(res.ReturnValue) == `"no numpy"` {
			t.Skip("numpy is not installed for this interpreter")
		}
		if res.ReturnRepr || string(res.ReturnValue) != `[45,1.5,true,7,{"k":-3},4611686018427387904]` {
			t.Errorf("return = %s repr=%v, want the values as JSON", res.ReturnValue, res.ReturnRepr)
		}
		res, _, _ = w.run(t, Request{Code: dateCode})
		if !res.ReturnRepr || !strings.Contains(string(res.ReturnValue), "2024-01-01T00:00:00") {
			t.Errorf("a datetime64: %s repr=%v, want its repr", res.ReturnValue, res.ReturnRepr)
		}
	})
	t.Run("structured value", func(t *testing.T) {
		res, _, _ := w.run(t, Request{Code: "{'a': [1, 2.5, 'é', None, True], 'b': (3,)}"})
		jsonEqual(t, res.ReturnValue, `{"a":[1,2.5,"é",null,true],"b":[3]}`)
	})
	t.Run("not JSON-able gives repr", func(t *testing.T) {
		res, _, _ := w.run(t, Request{Code: "class P:\n    def __repr__(self): return 'P()'\n{'p': P()}"})
		if got := reprValue(t, res); got != "{'p': P()}" {
			t.Errorf("repr = %q", got)
		}
	})
	t.Run("NaN gives repr", func(t *testing.T) {
		res, _, _ := w.run(t, Request{Code: "float('nan')"})
		if got := reprValue(t, res); got != "nan" {
			t.Errorf("repr = %q", got)
		}
	})
	t.Run("large value is truncated", func(t *testing.T) {
		res, _, _ := w.run(t, Request{Code: "['x' * 100] * 1000", MaxReturnBytes: 1000})
		if len(res.ReturnValue) > 1000 {
			t.Errorf("return value is %d bytes, limit 1000", len(res.ReturnValue))
		}
		if got := reprValue(t, res); !strings.HasPrefix(got, "['xxx") || !strings.HasSuffix(got, "… (truncated)") {
			t.Errorf("repr = %q", got)
		}
	})
	t.Run("inputs are globals", func(t *testing.T) {
		res, _, _ := w.run(t, Request{
			Code:   "s * n, d['k']",
			Inputs: map[string]json.RawMessage{"s": json.RawMessage(`"ab"`), "n": json.RawMessage("3"), "d": json.RawMessage(`{"k":[1]}`)},
		})
		wantSuccess(t, res)
		jsonEqual(t, res.ReturnValue, `["ababab",[1]]`)
	})
	t.Run("bad input name", func(t *testing.T) {
		res, _, _ := w.run(t, Request{Code: "1", Inputs: map[string]json.RawMessage{"not valid": json.RawMessage("1")}})
		wantError(t, res, "ValueError", 1)
	})
	t.Run("session main namespace", func(t *testing.T) {
		w.run(t, Request{Code: "leftover = 1"})
		res, _, _ := w.run(t, Request{Code: "import sys, __main__\n" +
			"(__name__, '__file__' in globals(), 'leftover' in globals(), __main__.__dict__ is globals(), sys.argv)"})
		wantSuccess(t, res)
		jsonEqual(t, res.ReturnValue, `["__main__",false,true,true,["<code>"]]`)
	})
	t.Run("worker not importable", func(t *testing.T) {
		res, _, _ := w.run(t, Request{Code: "import worker"})
		wantError(t, res, "ModuleNotFoundError", 1)
	})
	t.Run("traceback", func(t *testing.T) {
		res, _, stderr := w.run(t, Request{Code: "a = 1\nb = 0\nc = a / b\nprint('unreached')\n"})
		wantError(t, res, "ZeroDivisionError", 1)
		if res.Error.Message != "division by zero" {
			t.Errorf("message = %q", res.Error.Message)
		}
		for _, tb := range []string{stderr, res.Error.Traceback} {
			if !strings.HasPrefix(tb, "Traceback (most recent call last):\n  File \"<code>\", line 3, in <module>\n    c = a / b\n") ||
				!strings.HasSuffix(tb, "ZeroDivisionError: division by zero\n") ||
				strings.Contains(tb, "worker.py") {
				t.Errorf("traceback:\n%s", tb)
			}
		}
	})
	t.Run("traceback through user function and filename", func(t *testing.T) {
		code := "def f():\n    raise KeyError('k')\n\nf()\n"
		res, _, stderr := w.run(t, Request{Code: code, Filename: "cell.py"})
		wantError(t, res, "KeyError", 1)
		for _, want := range []string{
			"File \"cell.py\", line 4, in <module>\n    f()\n",
			"File \"cell.py\", line 2, in f\n    raise KeyError('k')\n",
		} {
			if !strings.Contains(stderr, want) {
				t.Errorf("stderr lacks %q:\n%s", want, stderr)
			}
		}
	})
	t.Run("error in last expression", func(t *testing.T) {
		res, _, stderr := w.run(t, Request{Code: "x = {}\nx['missing']"})
		wantError(t, res, "KeyError", 1)
		if !strings.Contains(stderr, "line 2, in <module>\n    x['missing']\n") || strings.Contains(stderr, "worker.py") {
			t.Errorf("stderr:\n%s", stderr)
		}
	})
	t.Run("syntax error", func(t *testing.T) {
		res, _, stderr := w.run(t, Request{Code: "x = 1\ny = (\n"})
		wantError(t, res, "SyntaxError", 1)
		if !strings.HasPrefix(stderr, "  File \"<code>\", line 2\n") || strings.Contains(stderr, "worker.py") {
			t.Errorf("stderr:\n%s", stderr)
		}
	})
	t.Run("custom exception types", func(t *testing.T) {
		res, _, stderr := w.run(t, Request{Code: "class MyError(Exception): pass\nraise MyError('boom')"})
		wantError(t, res, "__main__.MyError", 1)
		if res.Error.Message != "boom" || !strings.HasSuffix(stderr, "MyError: boom\n") {
			t.Errorf("message = %q, stderr:\n%s", res.Error.Message, stderr)
		}
		res, _, _ = w.run(t, Request{Code: "class E(Exception): pass\nE.__module__ = 'mymod'\nraise E('x')"})
		wantError(t, res, "mymod.E", 1)
		res, _, _ = w.run(t, Request{Code: "import json\njson.loads('{')"})
		wantError(t, res, "json.decoder.JSONDecodeError", 1)
	})
	t.Run("chained exception", func(t *testing.T) {
		res, _, stderr := w.run(t, Request{Code: "try:\n    1/0\nexcept Exception as e:\n    raise ValueError('v') from e\n"})
		wantError(t, res, "ValueError", 1)
		if !strings.Contains(stderr, "ZeroDivisionError") || !strings.Contains(stderr, "direct cause") || strings.Contains(stderr, "worker.py") {
			t.Errorf("stderr:\n%s", stderr)
		}
	})
	t.Run("SystemExit", func(t *testing.T) {
		for _, c := range []struct {
			code, status, stderr string
			exit                 int
		}{
			{"import sys\nsys.exit()", "success", "", 0},
			{"import sys\nsys.exit(0)", "success", "", 0},
			{"raise SystemExit(3)", "error", "", 3},
			{"import sys\nsys.exit('fatal: msg')", "error", "fatal: msg\n", 1},
		} {
			res, _, stderr := w.run(t, Request{Code: c.code})
			if res.Status != c.status || res.ExitCode != c.exit || stderr != c.stderr {
				t.Errorf("%q: status %s, exit %d, stderr %q; want %s, %d, %q", c.code, res.Status, res.ExitCode, stderr, c.status, c.exit, c.stderr)
			}
			if (res.Error != nil) != (c.status == "error") || (res.Error != nil && res.Error.Type != "SystemExit") {
				t.Errorf("%q: error = %+v", c.code, res.Error)
			}
		}
	})
	t.Run("KeyboardInterrupt", func(t *testing.T) {
		res, _, stderr := w.run(t, Request{Code: "raise KeyboardInterrupt"})
		wantError(t, res, "KeyboardInterrupt", 1)
		if !strings.Contains(stderr, "KeyboardInterrupt") {
			t.Errorf("stderr:\n%s", stderr)
		}
	})
	t.Run("MemoryError", func(t *testing.T) {
		res, _, _ := w.run(t, Request{Code: "raise MemoryError"})
		wantError(t, res, "MemoryError", 1)
	})
	t.Run("top-level await", func(t *testing.T) {
		res, _, _ := w.run(t, Request{Code: "import asyncio\nawait asyncio.sleep(0)\nq = asyncio.Queue()\nawait q.put(5)\nawait q.get() + await asyncio.sleep(0, result=37)"})
		wantSuccess(t, res)
		jsonEqual(t, res.ReturnValue, "42")
		res, _, _ = w.run(t, Request{Code: "import asyncio\nawait asyncio.sleep(0)"})
		wantSuccess(t, res)
		jsonEqual(t, res.ReturnValue, "null")
		// The loop is closed again, and the user may run their own.
		res, _, _ = w.run(t, Request{Code: "import asyncio\nasync def f(): return 7\nasyncio.run(f())"})
		jsonEqual(t, res.ReturnValue, "7")
	})
	t.Run("top-level await traceback", func(t *testing.T) {
		res, _, stderr := w.run(t, Request{Code: "import asyncio\nawait asyncio.sleep(0)\n1 / 0\n"})
		wantError(t, res, "ZeroDivisionError", 1)
		if !strings.HasPrefix(stderr, "Traceback (most recent call last):\n  File \"<code>\", line 3, in <module>\n") ||
			strings.Contains(stderr, "worker.py") || strings.Contains(stderr, "asyncio") {
			t.Errorf("stderr:\n%s", stderr)
		}
	})
	t.Run("validate", func(t *testing.T) {
		ctx := testContext(t)
		for _, c := range []struct {
			code  string
			valid bool
			se    SyntaxError
		}{
			{"x = 1\nawait something()\n", true, SyntaxError{}},
			{"x = 1\nif x\n    pass\n", false, SyntaxError{Line: 2, Text: "if x"}},
			{"def f():\n  return 1\n    return 2\n", false, SyntaxError{Line: 3, Message: "unexpected indent", Text: "    return 2"}},
			{"x = 1\x00", false, SyntaxError{}},
		} {
			v, err := w.conn.Validate(ctx, c.code, "")
			if err != nil {
				t.Fatal(err)
			}
			if v.Valid != c.valid || v.Valid != (v.SyntaxError == nil) {
				t.Errorf("Validate(%q) = %+v, want valid=%v", c.code, v, c.valid)
				continue
			}
			if c.valid {
				continue
			}
			se := v.SyntaxError
			if se.Line != c.se.Line || se.Message == "" || (c.se.Message != "" && se.Message != c.se.Message) ||
				se.Text != c.se.Text || (se.Line > 0 && se.Column < 1) {
				t.Errorf("Validate(%q).SyntaxError = %+v, want %+v", c.code, se, c.se)
			}
		}
		// Validating runs nothing.
		if _, err := w.conn.Validate(ctx, "print('side effect')", "x.py"); err != nil {
			t.Fatal(err)
		}
		if out, errOut := w.output(t); out != "" || errOut != "" {
			t.Errorf("validate wrote output %q %q", out, errOut)
		}
	})
	t.Run("validate column", func(t *testing.T) {
		v, err := w.conn.Validate(testContext(t), "x = 1 +* 2", "")
		if err != nil {
			t.Fatal(err)
		}
		if v.Valid || v.SyntaxError.Line != 1 || v.SyntaxError.Column < 7 || v.SyntaxError.Column > 8 {
			t.Errorf("validate = %+v", v.SyntaxError)
		}
	})
	t.Run("probe", func(t *testing.T) {
		p, err := w.conn.Probe(testContext(t), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		checkProbe(t, p, w.dir)
	})
}

func checkProbe(t *testing.T, p *Probe, dir string) {
	t.Helper()
	if p.UID != os.Getuid() || p.GID != os.Getgid() {
		t.Errorf("uid/gid = %d/%d, want %d/%d", p.UID, p.GID, os.Getuid(), os.Getgid())
	}
	for _, k := range []string{"CapEff", "CapBnd", "NoNewPrivs", "Seccomp"} {
		if _, ok := p.Status[k]; !ok {
			t.Errorf("status lacks %s: %v", k, p.Status)
		}
	}
	if !strings.HasPrefix(p.Namespaces["mnt"], "mnt:[") || !strings.HasPrefix(p.Namespaces["net"], "net:[") {
		t.Errorf("namespaces = %v", p.Namespaces)
	}
	if want, _ := os.Readlink("/proc/self/ns/pid"); p.Namespaces["pid"] != want {
		t.Errorf("pid namespace = %q, want ours %q", p.Namespaces["pid"], want)
	}
	if _, err := os.Stat("/proc/net/dev"); err == nil && !contains(p.Interfaces, "lo") {
		t.Errorf("interfaces = %v", p.Interfaces)
	}
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	if got := p.Rlimits["NOFILE"]; got[0] != int64(rl.Cur) {
		t.Errorf("NOFILE = %v, want soft %d", got, rl.Cur)
	}
	var keys []string
	for k := range p.Rlimits {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if strings.Join(keys, ",") != "AS,CORE,CPU,FSIZE,NOFILE,NPROC,STACK" {
		t.Errorf("rlimits = %v", p.Rlimits)
	}
	if host, _ := os.Hostname(); p.Hostname != host {
		t.Errorf("hostname = %q, want %q", p.Hostname, host)
	}
	if want, _ := filepath.EvalSymlinks(dir); p.Cwd != want {
		t.Errorf("cwd = %q, want %q", p.Cwd, want)
	}
	if p.ProcessesSeen < 1 {
		t.Errorf("processes seen = %d", p.ProcessesSeen)
	}
	if !p.TmpWritable {
		t.Error("tmp not writable")
	}
	if rootOK := syscall.Access("/", 2 /* W_OK */) == nil; p.RootWritable != rootOK {
		t.Errorf("root writable = %v, want %v", p.RootWritable, rootOK)
	}
	// A probe of another interpreter, running in parallel, may have its
	// own file there for a moment: only one that stays was left behind.
	if entries, _ := os.ReadDir("/"); len(entries) > 0 {
		for _, e := range entries {
			if !strings.HasPrefix(e.Name(), ".pysandbox-probe-") {
				continue
			}
			path := filepath.Join("/", e.Name())
			gone := false
			for deadline := time.Now().Add(30 * time.Second); !gone && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				_, err := os.Lstat(path)
				gone = errors.Is(err, os.ErrNotExist)
			}
			if !gone {
				t.Errorf("probe left %s behind", e.Name())
			}
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func TestOneshotExitCode(t *testing.T) {
	for _, c := range []struct {
		code, stdout string
		exit         int
	}{
		{"print('a')\n'value'", "a\n", 0},
		{"print('b')\n1/0", "b\n", 1},
		{"import sys\nprint('c')\nsys.exit(3)", "c\n", 3},
		{"import sys, atexit\natexit.register(print, 'at exit')\nsys.stdout.write('partial')", "partialat exit\n", 0},
	} {
		t.Run(fmt.Sprint(c.exit), func(t *testing.T) {
			t.Parallel()
			w := startPython(t, systemPython, true)
			res, err := w.conn.Run(testContext(t), Request{Code: c.code})
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode != c.exit {
				t.Errorf("result exit code = %d, want %d", res.ExitCode, c.exit)
			}
			if got := w.exitCode(t); got != c.exit {
				t.Errorf("process exit code = %d, want %d", got, c.exit)
			}
			if out, _ := w.output(t); out != c.stdout {
				t.Errorf("stdout = %q, want %q", out, c.stdout)
			}
		})
	}
}

func TestExitsOnEOF(t *testing.T) {
	w := startPython(t, systemPython, false)
	res, _, _ := w.run(t, Request{Code: "1"})
	wantSuccess(t, res)
	w.conn.Close()
	if got := w.exitCode(t); got != 0 {
		t.Errorf("exit code after EOF = %d, want 0", got)
	}
}

// Output printed before the reply must be in stdout once the reply is read,
// including a final partial line.
func TestOutputPrecedesReply(t *testing.T) {
	w := startPython(t, systemPython, false)
	code := "import sys\nfor i in range(5000):\n    print('line', i)\n    print('err', i, file=sys.stderr)\nsys.stdout.write('tail')"
	for i := 0; i < 3; i++ {
		_, stdout, stderr := w.run(t, Request{Code: code})
		if n := strings.Count(stdout, "\n"); n != 5000 || !strings.HasSuffix(stdout, "line 4999\ntail") {
			t.Fatalf("stdout has %d lines, ends %q", n, stdout[max(0, len(stdout)-30):])
		}
		if n := strings.Count(stderr, "\n"); n != 5000 {
			t.Fatalf("stderr has %d lines", n)
		}
	}
}

// Output streams while the code runs rather than arriving at the end.
func TestOutputIsLineBuffered(t *testing.T) {
	w := startPython(t, systemPython, false)
	ctx := testContext(t)
	// The code waits for the test to see its output, so no timing is
	// involved: output held back until the end would never be seen.
	release := filepath.Join(t.TempDir(), "release")
	done := make(chan error, 1)
	go func() {
		code := fmt.Sprintf("import os, time\nprint('early')\nfor _ in range(1500):\n    if os.path.exists(%q): break\n    time.sleep(0.01)\n", release)
		_, err := w.conn.Run(ctx, Request{Code: code})
		done <- err
	}()
	for deadline := time.Now().Add(15 * time.Second); ; {
		b, _ := os.ReadFile(w.stdout)
		if string(b) == "early\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("output not seen while the code was still running")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Programs started by user code must not inherit the control channel.
func TestSubprocessDoesNotSeeControlFD(t *testing.T) {
	w := startPython(t, systemPython, false)
	res, _, stderr := w.run(t, Request{Code: `import os, subprocess
own = os.readlink('/proc/self/fd/3')
p = subprocess.run(['ls', '-l', '/proc/self/fd'], close_fds=False, stdout=subprocess.PIPE, universal_newlines=True)
os.system('ls -l /proc/self/fd > via_system.txt')
(own, os.get_inheritable(3), p.stdout, open('via_system.txt').read())`})
	wantSuccess(t, res)
	var got []any
	if err := json.Unmarshal(res.ReturnValue, &got); err != nil || len(got) != 4 {
		t.Fatalf("return %s: %v (stderr %s)", res.ReturnValue, err, stderr)
	}
	if own, _ := got[0].(string); !strings.HasPrefix(own, "socket:") {
		t.Fatalf("fd 3 in the worker is %q, not the control socket", own)
	}
	if got[1] != false {
		t.Error("control socket is inheritable")
	}
	for _, listing := range got[2:] {
		s, _ := listing.(string)
		if !strings.Contains(s, "/proc/") || strings.Contains(s, "socket:") {
			t.Errorf("child fd listing:\n%s", s)
		}
	}
}

// startUnderRlimitAS starts a worker of the system python whose address
// space is limited to kib KiB, as a sandbox without a memory cgroup is.
func startUnderRlimitAS(t *testing.T, kib int, oneshot bool) *testWorker {
	t.Helper()
	requirePython(t, systemPython)
	argv := append([]string{"/bin/sh", "-c", fmt.Sprintf(`ulimit -v %d && exec "$@"`, kib), "sh"}, Command(systemPython, "WORKER_PY", oneshot)...)
	return startWorker(t, argv)
}

// A real allocation failure under RLIMIT_AS must still produce a reply with
// the MemoryError type, and the worker must remain usable.
func TestRealMemoryError(t *testing.T) {
	w := startUnderRlimitAS(t, 500000, false)

	res, _, _ := w.run(t, Request{Code: "b = bytearray(1 << 40)"})
	wantError(t, res, "MemoryError", 1)

	// Exhaust memory for real, keeping it referenced by a global, so the
	// reply has to be built while memory is still tight.
	res, _, stderr := w.run(t, Request{Code: "hog = []\nwhile True:\n    hog.append(bytearray(1 << 20))\n"})
	wantError(t, res, "MemoryError", 1)
	if !strings.Contains(stderr, "MemoryError") {
		t.Errorf("stderr:\n%s", stderr)
	}

	// The same inside a function: its frame holds the memory until the
	// worker frees it to report the error.
	res, _, stderr = w.run(t, Request{Code: "def f():\n    hog = []\n    while True:\n        hog.append(bytearray(1 << 20))\n\nf()\n"})
	wantError(t, res, "MemoryError", 1)
	if !strings.Contains(stderr, "line 6, in <module>") || !strings.Contains(stderr, "line 4, in f") {
		t.Errorf("stderr:\n%s", stderr)
	}

	res, _, _ = w.run(t, Request{Code: "sum(range(10))"})
	wantSuccess(t, res)
	jsonEqual(t, res.ReturnValue, "45")
}

// Filling memory with small objects leaves no room in the allocator's
// arenas: the worker's reserve must make room for the reply, and be taken
// again for the next run.
func TestMemoryErrorSmallObjects(t *testing.T) {
	w := startUnderRlimitAS(t, 120000, false)
	for i := 0; i < 2; i++ {
		res, _, _ := w.run(t, Request{Code: "x = []\nwhile True:\n    x.append(str(len(x)) * 3)\n"})
		wantError(t, res, "MemoryError", 1)
		if !strings.Contains(res.Error.Traceback, "line 3, in <module>") {
			t.Errorf("run %d: traceback %q", i, res.Error.Traceback)
		}
		// The session keeps x, and with it all the memory: the worker must
		// still read and compile the code that frees it, and then take its
		// reserve again.
		res, _, _ = w.run(t, Request{Code: "n = len(x)\ndel x\nn > 1000"})
		wantSuccess(t, res)
		jsonEqual(t, res.ReturnValue, "true")
	}
	res, _, _ := w.run(t, Request{Code: "sum(range(10))"})
	wantSuccess(t, res)
	jsonEqual(t, res.ReturnValue, "45")
}

func TestCommand(t *testing.T) {
	if got := strings.Join(Command("/py", "/w.py", false), " "); got != "/py -I -B -c "+bootstrap+" /w.py" {
		t.Errorf("Command = %q", got)
	}
	if got := strings.Join(Command("/py", "/w.py", true, "/s"), " "); got != "/py -I -B -c "+bootstrap+" /w.py --site /s --oneshot" {
		t.Errorf("Command oneshot = %q", got)
	}
}

// heapProbe prints the resident size of the worker's malloc heap, in KiB.
const heapProbe = `kib = 0
where = None
for line in open("/proc/self/smaps"):
    f = line.split()
    if len(f) >= 5 and "-" in f[0] and ":" in f[3]:
        where = f[5] if len(f) > 5 else ""
    elif f and f[0] == "Rss:" and where == "[heap]":
        kib += int(f[1])
kib`

// A worker started as Command starts it holds no syntax tree of worker.py:
// its heap is megabytes smaller than one started as a plain script's,
// whose tree Python keeps until the script returns. Every pooled run pays
// for each page a zygote keeps, twice (its fork copies the page table
// entry, its exit tears it down), so this is worth a test.
func TestCommandFreesTheParseTree(t *testing.T) {
	requirePython(t, systemPython)
	heap := func(argv []string) int {
		w := startWorker(t, argv)
		res, _, _ := w.run(t, Request{Code: heapProbe})
		wantSuccess(t, res)
		var kib int
		if err := json.Unmarshal(res.ReturnValue, &kib); err != nil || kib <= 0 {
			t.Fatalf("heap = %s, %v", res.ReturnValue, err)
		}
		return kib
	}
	script := heap([]string{systemPython, "-I", "-B", "WORKER_PY"})
	boot := heap(Command(systemPython, "WORKER_PY", false))
	t.Logf("malloc heap: %d KiB as a script, %d KiB through the bootstrap", script, boot)
	if script-boot < 512 {
		t.Errorf("the bootstrap saved %d KiB of heap (%d as a script, %d through it); want at least 512 KiB", script-boot, script, boot)
	}
}

// Through the bootstrap, the worker still sees what a script does:
// the arguments a script would (none left once it has read them), the
// working directory first on sys.path as in `python -c` (a zygote's has
// none: see TestEscapeDependencyCode), and never its own directory.
func TestCommandLooksLikeAScript(t *testing.T) {
	for name, py := range toolPythons(t) {
		t.Run(name, func(t *testing.T) {
			w := startPython(t, py, false)
			res, _, _ := w.run(t, Request{Code: `import sys, os
[sys.argv, "" in sys.path, [p for p in sys.path if os.path.exists(os.path.join(p or ".", "worker.py"))]]`})
			wantSuccess(t, res)
			jsonEqual(t, res.ReturnValue, `[["<code>"], true, []]`)
		})
	}
}

func TestForkedChildStaysSilent(t *testing.T) {
	w := startPython(t, systemPython, false)
	// The child returns from the user code into the worker; only the parent
	// may answer.
	res, _, _ := w.run(t, Request{Code: "import os, time\npid = os.fork()\nif pid:\n    os.waitpid(pid, 0)\npid"})
	wantSuccess(t, res)
	var pid int
	if err := json.Unmarshal(res.ReturnValue, &pid); err != nil || pid == 0 {
		t.Fatalf("return = %s, want the child's pid", res.ReturnValue)
	}
	res, _, _ = w.run(t, Request{Code: "'still in step'"})
	jsonEqual(t, res.ReturnValue, `"still in step"`)
}

// The traceback on stderr must be what Python prints when the same code runs
// as a script, in every version.
func TestTracebackMatchesPython(t *testing.T) {
	cases := []string{
		"a = 1\nb = 0\nc = a / b\n",
		"x = {}\nx['missing']",
		"x = {}\nprint(x['missing'])",
		"def f(n):\n    return 1 / n\n\nf(0) + 1",
		"try:\n    1/0\nexcept Exception as e:\n    raise ValueError('v') from e\n",
		"try:\n    1/0\nexcept Exception:\n    [][0]\n",
		"class MyError(Exception): pass\nraise MyError('boom')",
		"def f():\n  return 1\n    return 2\n",
		"x = 1 +* 2\n",
		"import json\njson.loads('{')",
		"import sys\nsys.exit('bye')",
		"raise KeyboardInterrupt",
	}
	for name, python := range interpreters(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			w := startPython(t, python, false)
			ready, err := w.conn.Ready(testContext(t))
			if err != nil {
				t.Fatal(err)
			}
			// Before 3.11 the interpreter names classes from __main__ as
			// "__main__.MyError"; the traceback module, which the worker
			// needs for source lines, does not.
			old := ready.Version[1] < 11
			file := filepath.Join(w.dir, "cell.py")
			for _, code := range cases {
				if err := os.WriteFile(file, []byte(code), 0o644); err != nil {
					t.Fatal(err)
				}
				cmd := exec.Command(python, "-I", "-B", file)
				cmd.Dir = w.dir
				var want strings.Builder
				cmd.Stderr = &want
				cmd.Run()
				_, _, got := w.run(t, Request{Code: code, Filename: file})
				if got != want.String() && !(old && strings.Contains(want.String(), "__main__.MyError")) {
					t.Errorf("%q:\n--- python:\n%s--- worker:\n%s", code, want.String(), got)
				}
			}
		})
	}
}

// A one-shot run keeps the reserves it started with (it does not free and
// take them around compiling, as a session does), and they must still give
// the reply room when small objects fill the memory.
func TestOneShotMemoryErrorSmallObjects(t *testing.T) {
	w := startUnderRlimitAS(t, 120000, true)
	res, _, stderr := w.run(t, Request{Code: "x = []\nwhile True:\n    x.append(str(len(x)) * 3)\n"})
	wantError(t, res, "MemoryError", 1)
	if !strings.Contains(res.Error.Traceback, "line 3, in <module>") || !strings.Contains(stderr, "MemoryError") {
		t.Errorf("traceback %q stderr %q", res.Error.Traceback, stderr)
	}
	if code := w.exitCode(t); code != 1 {
		t.Errorf("one-shot worker exited with %d, want 1", code)
	}
}
