package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestSession checks, on every interpreter, that a serving worker keeps one
// namespace for all its runs, survives SIGINT, and answers sync requests.
func TestSession(t *testing.T) {
	for name, python := range interpreters(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			sessionCases(t, python)
		})
	}
}

func sessionCases(t *testing.T, python string) {
	t.Run("globals and imports persist", func(t *testing.T) {
		w := startPython(t, python, false)
		res, _, _ := w.run(t, Request{Code: "import math as m\nx = 41\ndef f():\n    return x + 1\nclass C:\n    pass\n"})
		wantSuccess(t, res)
		res, _, _ = w.run(t, Request{Code: "import sys, __main__\n" +
			"(f(), round(m.pi, 2), 'm' in globals(), C.__module__, __main__.C is C, sys.modules['__main__'] is __main__)"})
		wantSuccess(t, res)
		jsonEqual(t, res.ReturnValue, `[42, 3.14, true, "__main__", true, true]`)

		// Inputs are assigned into the same namespace.
		res, _, _ = w.run(t, Request{Code: "x = x + y\nf()", Inputs: map[string]json.RawMessage{"y": json.RawMessage("100")}})
		wantSuccess(t, res)
		jsonEqual(t, res.ReturnValue, "142")

		// An exception keeps what the run did before it.
		res, _, _ = w.run(t, Request{Code: "z = 'kept'\n1 / 0\n"})
		wantError(t, res, "ZeroDivisionError", 1)
		res, _, _ = w.run(t, Request{Code: "z"})
		jsonEqual(t, res.ReturnValue, `"kept"`)

		// A function from an earlier run appears in the traceback.
		res, _, _ = w.run(t, Request{Code: "def g():\n    raise KeyError('from g')\n", Filename: "cell1.py"})
		wantSuccess(t, res)
		res, _, stderr := w.run(t, Request{Code: "g()", Filename: "cell2.py"})
		wantError(t, res, "KeyError", 1)
		if !strings.Contains(stderr, `File "cell2.py", line 1, in <module>`) || !strings.Contains(stderr, `File "cell1.py", line 2, in g`) ||
			strings.Contains(stderr, "worker.py") {
			t.Errorf("stderr:\n%s", stderr)
		}

		// Globals do not leak into another worker.
		w2 := startPython(t, python, false)
		res, _, _ = w2.run(t, Request{Code: "['x' in globals(), 'f' in globals(), 'm' in globals()]"})
		jsonEqual(t, res.ReturnValue, "[false, false, false]")
	})

	t.Run("oneshot is fresh", func(t *testing.T) {
		w := startPython(t, python, true)
		res, _, _ := w.run(t, Request{Code: "import __main__\nsorted(k for k in globals() if not k.startswith('__')), __main__.__dict__ is globals()",
			Inputs: map[string]json.RawMessage{"a": json.RawMessage("1")}})
		wantSuccess(t, res)
		jsonEqual(t, res.ReturnValue, `[["a"], true]`)
	})

	t.Run("SIGINT interrupts a run and keeps the session", func(t *testing.T) {
		w := startPython(t, python, false)
		res, _, _ := w.run(t, Request{Code: "x = 41"})
		wantSuccess(t, res)
		for _, c := range []struct{ name, code, frame string }{
			{"sleep", "import time\nprint('started', flush=True)\ntime.sleep(30)\nslept = True\n", "time.sleep(30)"},
			{"busy loop", "print('started', flush=True)\nwhile True:\n    spin = 1\n", ""},
			{"await", "import asyncio\nprint('started', flush=True)\nawait asyncio.sleep(30)\nslept = True\n", ""},
			{"last expression", "import time\nprint('started', flush=True)\ntime.sleep(30)", "time.sleep(30)"},
		} {
			res, stderr := interruptRun(t, w, c.code)
			wantError(t, res, "KeyboardInterrupt", 1)
			if !strings.HasSuffix(stderr, "KeyboardInterrupt\n") || strings.Contains(stderr, "worker.py") ||
				(c.frame != "" && !strings.Contains(res.Error.Traceback, c.frame)) {
				t.Errorf("%s: traceback:\n%s\nstderr:\n%s", c.name, res.Error.Traceback, stderr)
			}
			res, _, _ = w.run(t, Request{Code: "x + 1, 'slept' in globals()"})
			wantSuccess(t, res)
			jsonEqual(t, res.ReturnValue, "[42, false]")
		}
		// asyncio still works after an interrupted await.
		res, _, stderr := w.run(t, Request{Code: "import asyncio\nawait asyncio.sleep(0, result=7)"})
		if res.Status != "success" {
			t.Fatalf("asyncio after interrupt: %+v %+v\n%s", res, res.Error, stderr)
		}
		jsonEqual(t, res.ReturnValue, "7")
	})

	t.Run("SIGINT lets imports finish", func(t *testing.T) {
		// An import cut short would leave the module, or a package, broken
		// for the rest of the session.
		w := startPython(t, python, false)
		if err := os.WriteFile(filepath.Join(w.dir, "slowmod.py"), []byte("import time\ntime.sleep(0.5)\nVALUE = 'complete'\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		res, stderr := interruptRun(t, w, "print('started', flush=True)\nimport slowmod\nimport time\ntime.sleep(30)\n")
		wantError(t, res, "KeyboardInterrupt", 1)
		if strings.Contains(stderr, "slowmod") {
			t.Errorf("interrupted inside the import:\n%s", stderr)
		}
		res, _, _ = w.run(t, Request{Code: "import sys, slowmod\nslowmod.VALUE"})
		jsonEqual(t, res.ReturnValue, `"complete"`)

		// But not forever: the Go side kills a worker that does not stop.
		if err := os.WriteFile(filepath.Join(w.dir, "endless.py"), []byte("import time\nwhile True:\n    time.sleep(0.01)\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		res, stderr = interruptRun(t, w, "print('started', flush=True)\nimport endless\n")
		wantError(t, res, "KeyboardInterrupt", 1)
		// At least the time the worker holds SIGINT back inside an import;
		// the import itself would never end.
		if d := time.Since(start); d < 900*time.Millisecond || d > 60*time.Second {
			t.Errorf("interrupting the endless import took %v", d)
		}
		if !strings.Contains(stderr, "endless.py") {
			t.Errorf("stderr:\n%s", stderr)
		}
		res, _, _ = w.run(t, Request{Code: "import sys\n'endless' in sys.modules"})
		jsonEqual(t, res.ReturnValue, "false")
	})

	t.Run("SIGINT while idle is harmless", func(t *testing.T) {
		w := startPython(t, python, false)
		res, _, _ := w.run(t, Request{Code: "x = 1"})
		wantSuccess(t, res)
		for i := 0; i < 3; i++ {
			if err := w.cmd.Process.Signal(os.Interrupt); err != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		res, stdout, stderr := w.run(t, Request{Code: "x + 1"})
		wantSuccess(t, res)
		jsonEqual(t, res.ReturnValue, "2")
		if stdout != "" || stderr != "" {
			t.Errorf("output %q %q", stdout, stderr)
		}
		// The same after user code put Python's own handler back, which
		// raises wherever the worker happens to be.
		res, _, _ = w.run(t, Request{Code: "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\nx = 5"})
		wantSuccess(t, res)
		for i := 0; i < 3; i++ {
			w.cmd.Process.Signal(os.Interrupt)
			time.Sleep(50 * time.Millisecond)
		}
		res, _, _ = w.run(t, Request{Code: "x"})
		jsonEqual(t, res.ReturnValue, "5")
		if _, err := w.conn.Probe(testContext(t), nil, nil); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("SIGINT storm keeps the stream in step", func(t *testing.T) {
		// Interrupts that land anywhere: while reading a request, running
		// code, building or sending a reply. Each run either completes with
		// its exact value or reports KeyboardInterrupt.
		w := startPython(t, python, false)
		if _, err := w.conn.Ready(testContext(t)); err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		stopped := make(chan struct{})
		go func() {
			defer close(stopped)
			for {
				select {
				case <-stop:
					return
				case <-time.After(300 * time.Microsecond):
					w.cmd.Process.Signal(os.Interrupt)
				}
			}
		}()
		interrupted := 0
		for i := 0; i < 300; i++ {
			res, err := w.conn.Run(testContext(t), Request{Code: "[i for i in range(200)][-1] + n", Inputs: map[string]json.RawMessage{"n": json.RawMessage("1")}})
			if err != nil {
				close(stop)
				t.Fatalf("run %d: %v", i, err)
			}
			if res.Status == "error" {
				wantError(t, res, "KeyboardInterrupt", 1)
				interrupted++
				continue
			}
			if string(res.ReturnValue) != "200" || res.ReturnRepr {
				t.Errorf("run %d: return %s (repr %v)", i, res.ReturnValue, res.ReturnRepr)
			}
		}
		close(stop)
		<-stopped
		if err := w.conn.Sync(testContext(t), "storm-is-over-0123456789"); err != nil {
			t.Fatal(err)
		}
		res, _, _ := w.run(t, Request{Code: "'alive'"})
		jsonEqual(t, res.ReturnValue, `"alive"`)
		t.Logf("%d of 300 runs interrupted", interrupted)
	})

	t.Run("sync follows all earlier output", func(t *testing.T) {
		w := startPython(t, python, false)
		const marker = "pysandbox-sync-0123456789abcdef"
		code := "import sys\nfor i in range(1000):\n    print('out', i)\n    print('err', i, file=sys.stderr)\n"
		for round := 0; round < 2; round++ {
			res, err := w.conn.Run(testContext(t), Request{Code: code})
			if err != nil {
				t.Fatal(err)
			}
			wantSuccess(t, res)
			if err := w.conn.Sync(testContext(t), marker); err != nil {
				t.Fatal(err)
			}
			stdout, stderr := w.output(t)
			for _, c := range []struct{ name, text, prefix string }{{"stdout", stdout, "out"}, {"stderr", stderr, "err"}} {
				lines := strings.Split(strings.TrimSuffix(c.text, "\n"), "\n")
				if len(lines) != 1001 || lines[1000] != marker {
					t.Fatalf("%s: %d lines, ending %q", c.name, len(lines), c.text[max(0, len(c.text)-60):])
				}
				for i, l := range lines[:1000] {
					if want := c.prefix + " " + strconv.Itoa(i); l != want {
						t.Fatalf("%s line %d = %q, want %q", c.name, i, l, want)
					}
				}
			}
		}
	})

	t.Run("sync flushes what Python still buffers", func(t *testing.T) {
		w := startPython(t, python, false)
		// A thread writes through a block-buffered stream after the run has
		// ended: only the sync's flush gets it out, ahead of the marker.
		res, _, _ := w.run(t, Request{Code: "import io, sys, threading, time\n" +
			"sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, 'w', closefd=False), 1 << 16))\n" +
			"def late():\n    time.sleep(0.2)\n    sys.stdout.write('late')\n    open('written', 'w').close()\n" +
			"threading.Thread(target=late).start()\n"})
		wantSuccess(t, res)
		deadline := time.Now().Add(10 * time.Second)
		for {
			if _, err := os.Stat(filepath.Join(w.dir, "written")); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("thread did not write")
			}
			time.Sleep(10 * time.Millisecond)
		}
		if out, _ := w.output(t); out != "" {
			t.Fatalf("stdout before sync = %q", out)
		}
		const marker = "MARKER_abcdefghij-0123"
		if err := w.conn.Sync(testContext(t), marker); err != nil {
			t.Fatal(err)
		}
		if out, errOut := w.output(t); out != "late"+marker+"\n" || errOut != marker+"\n" {
			t.Errorf("after sync: stdout %q, stderr %q", out, errOut)
		}
		w.run(t, Request{Code: "sys.stdout = sys.__stdout__"})
	})

	t.Run("sync markers are validated", func(t *testing.T) {
		w := startPython(t, python, false)
		ctx := testContext(t)
		for _, m := range []string{"", "short", strings.Repeat("a", 129), "has space in it 0123", "newline\n0123456789ab", "ümlaut-0123456789abc"} {
			if err := w.conn.Sync(ctx, m); err == nil || !strings.Contains(err.Error(), "invalid sync marker") {
				t.Errorf("Sync(%q) = %v", m, err)
			}
		}
		// The worker refuses them too, keeping the stream in step.
		err := w.conn.call(ctx, &Request{Op: OpSync, Marker: "bad marker!"}, OpSynced, new(Synced))
		var er *ErrorReply
		if !errors.As(err, &er) || !strings.Contains(er.Message, "marker") {
			t.Errorf("worker accepted a bad marker: %v", err)
		}
		if err := w.conn.Sync(ctx, strings.Repeat("Z", 128)); err != nil {
			t.Fatal(err)
		}
		if out, errOut := w.output(t); out != strings.Repeat("Z", 128)+"\n" || errOut != out {
			t.Errorf("stdout %q, stderr %q", out, errOut)
		}
	})

	t.Run("working directory is importable", func(t *testing.T) {
		w := startPython(t, python, false)
		res, _, _ := w.run(t, Request{Code: "import sys\nsys.path[0]"})
		jsonEqual(t, res.ReturnValue, `""`)
		// Written from outside, as a file upload would.
		if err := os.WriteFile(filepath.Join(w.dir, "helpers.py"), []byte("def double(n):\n    return 2 * n\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		res, _, _ = w.run(t, Request{Code: "import helpers\nhelpers.double(21)"})
		wantSuccess(t, res)
		jsonEqual(t, res.ReturnValue, "42")
		// A package, and a module written by user code just before importing
		// it, after the directory was listed by the import above.
		if err := os.MkdirAll(filepath.Join(w.dir, "pkg"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(w.dir, "pkg", "__init__.py"), []byte("NAME = 'pkg'\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		res, _, _ = w.run(t, Request{Code: "with open('fresh.py', 'w') as f:\n    f.write('VALUE = 7\\n')\n" +
			"import importlib\nimportlib.invalidate_caches()\nimport fresh, pkg\n(fresh.VALUE, pkg.NAME)"})
		wantSuccess(t, res)
		jsonEqual(t, res.ReturnValue, `[7, "pkg"]`)
		// Written between runs: no invalidate_caches needed.
		if err := os.WriteFile(filepath.Join(w.dir, "later.py"), []byte("X = 'later'\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		res, _, _ = w.run(t, Request{Code: "import later\nlater.X"})
		jsonEqual(t, res.ReturnValue, `"later"`)
		// The worker's own directory stays out of reach.
		res, _, _ = w.run(t, Request{Code: "import worker"})
		wantError(t, res, "ModuleNotFoundError", 1)
	})
}

// interruptRun starts code, which must print "started" first, sends SIGINT
// once it has, and returns the result.
func interruptRun(t *testing.T, w *testWorker, code string) (*Result, string) {
	t.Helper()
	type reply struct {
		res *Result
		err error
	}
	done := make(chan reply, 1)
	go func() {
		res, err := w.conn.Run(context.Background(), Request{Code: code})
		done <- reply{res, err}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(w.stdout)
		if bytes.HasSuffix(b[w.outOff:], []byte("started\n")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("run did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // into the sleep or loop
	start := time.Now()
	if err := w.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatal(r.err)
		}
		if d := time.Since(start); d > 60*time.Second {
			t.Errorf("interrupt took %v", d)
		}
		_, stderr := w.output(t)
		return r.res, stderr
	case <-time.After(10 * time.Second):
		t.Fatal("SIGINT did not end the run")
	}
	return nil, ""
}

// hasModules reports whether python can import all of mods.
func hasModules(python string, mods ...string) bool {
	if _, err := os.Stat(python); err != nil {
		return false
	}
	return exec.Command(python, "-c", "import "+strings.Join(mods, ", ")).Run() == nil
}

// startPythonEnv is startPython with extra environment variables.
func startPythonEnv(t *testing.T, python string, oneshot bool, env ...string) *testWorker {
	t.Helper()
	requirePython(t, python)
	argv := append(append([]string{"/usr/bin/env"}, env...), Command(python, "WORKER_PY", oneshot)...)
	return startWorker(t, argv)
}
