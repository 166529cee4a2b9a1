package tools

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func TestRunPythonSuccess(t *testing.T) {
	cs := connect(t, nil)
	res, out := call(t, cs, "run_python", map[string]any{
		"code":   "import math\nprint('area', math.pi * r * r)\n{'r': r, 'names': names}",
		"inputs": map[string]any{"r": 2, "names": []any{"a", "b"}},
	})
	if res.IsError {
		t.Fatalf("isError: %s", text(res))
	}
	if out["status"] != "success" || out["exit_code"] != 0.0 {
		t.Fatalf("status %v exit %v", out["status"], out["exit_code"])
	}
	if !strings.HasPrefix(out["stdout"].(string), "area 12.56") {
		t.Errorf("stdout %q", out["stdout"])
	}
	rv, _ := out["return_value"].(map[string]any)
	if rv["r"] != 2.0 || len(rv["names"].([]any)) != 2 {
		t.Errorf("return_value %#v", out["return_value"])
	}
	if out["sandbox"] != "native" {
		t.Errorf("sandbox %v", out["sandbox"])
	}
	if txt := text(res); !strings.Contains(txt, "status: success") || !strings.Contains(txt, "area 12.56") {
		t.Errorf("text summary %q", txt)
	}
}

func TestRunPythonError(t *testing.T) {
	cs := connect(t, nil)
	res, out := call(t, cs, "run_python", map[string]any{"code": "x = 1\ny = 2\nz = x / 0\n"})
	if !res.IsError || out["status"] != "error" || out["exit_code"] != 1.0 {
		t.Fatalf("isError %v status %v exit %v", res.IsError, out["status"], out["exit_code"])
	}
	stderr := out["stderr"].(string)
	if !strings.Contains(stderr, `File "<code>", line 3`) || !strings.Contains(stderr, "ZeroDivisionError") {
		t.Errorf("traceback does not point at the user's line 3:\n%s", stderr)
	}
	if strings.Contains(stderr, "worker.py") {
		t.Errorf("traceback shows the worker's frames:\n%s", stderr)
	}
	if out["return_value"] != nil {
		t.Errorf("return_value %v, want null", out["return_value"])
	}
}

// TestRunPythonOutputCut: a run that completes with more output than the
// server keeps (64 KiB a stream here) is output_limit without isError,
// since the code did what it was asked; one that then fails is an error.
func TestRunPythonOutputCut(t *testing.T) {
	cs := connect(t, nil)
	for _, c := range []struct {
		code, status string
		exit         float64
		isError      bool
	}{
		{"print('x' * 200_000)\n41 + 1", "output_limit", 0, false},
		{"import sys\nprint('x' * 200_000)\nsys.exit(3)", "error", 3, true},
		{"print('x' * 200_000)\n1 / 0", "error", 1, true},
	} {
		res, out := call(t, cs, "run_python", map[string]any{"code": c.code})
		if res.IsError != c.isError || out["status"] != c.status || out["exit_code"] != c.exit || out["stdout_truncated"] != true {
			t.Errorf("%q: isError %v status %v exit %v stdout_truncated %v; want %v %s %v true", c.code, res.IsError, out["status"], out["exit_code"], out["stdout_truncated"], c.isError, c.status, c.exit)
		}
	}
}

func TestRunPythonAwaitAndRepr(t *testing.T) {
	cs := connect(t, nil)
	_, out := call(t, cs, "run_python", map[string]any{"code": "import asyncio\nawait asyncio.sleep(0.01)\nobject"})
	if out["status"] != "success" || out["return_value"] != "<class 'object'>" {
		t.Fatalf("status %v return_value %#v", out["status"], out["return_value"])
	}
}

func TestRunPythonTimeout(t *testing.T) {
	cs := connect(t, nil)
	start := time.Now()
	res, out := call(t, cs, "run_python", map[string]any{"code": "import time\ntime.sleep(60)", "timeout_seconds": 1})
	if !res.IsError || out["status"] != "timeout" {
		t.Fatalf("isError %v status %v", res.IsError, out["status"])
	}
	// Well under the 60 s sleep: the timeout, not the code, ended it.
	if el := time.Since(start); el > 30*time.Second {
		t.Errorf("timeout result took %s", el)
	}
}

// Bad input gets a clear isError result, and the server keeps serving.
func TestRunPythonBadInput(t *testing.T) {
	cs := connect(t, nil)
	for _, tc := range []struct {
		name string
		args map[string]any
		want string
	}{
		{"missing code", map[string]any{}, "code"},
		{"empty code", map[string]any{"code": "  \n"}, "code is required"},
		{"NUL byte", map[string]any{"code": "print(1)\x00"}, "NUL byte"},
		{"oversized", map[string]any{"code": strings.Repeat("#", MaxCodeBytes+1)}, "too large"},
		{"code not a string", map[string]any{"code": 42}, "code"},
		{"negative timeout", map[string]any{"code": "1", "timeout_seconds": -1}, "positive"},
		{"timeout over max", map[string]any{"code": "1", "timeout_seconds": 10000}, "maximum"},
		{"bad input name", map[string]any{"code": "1", "inputs": map[string]any{"not valid": 1}}, "not a valid Python variable name"},
		{"keyword input name", map[string]any{"code": "1", "inputs": map[string]any{"class": 1}}, "not a valid Python variable name"},
		{"unknown session", map[string]any{"code": "1", "session_id": "abc"}, "create_session"},
		{"no dependency cache", map[string]any{"code": "1", "dependencies": []any{"pysbx-nonexistent"}}, "installs no dependencies"},
		{"bad requirement", map[string]any{"code": "1", "dependencies": []any{"numpy>="}}, "invalid requirement"},
		{"unknown python", map[string]any{"code": "1", "python_version": "3.99"}, "available:"},
		{"bad inline block", map[string]any{"code": "# /// script\n# dependencies = 5\n# ///\n1"}, "inline script metadata"},
		{"unknown field", map[string]any{"code": "1", "bogus": true}, "bogus"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, _ := call(t, cs, "run_python", tc.args)
			if !res.IsError || !strings.Contains(text(res), tc.want) {
				t.Errorf("isError %v, text %q; want an error mentioning %q", res.IsError, text(res), tc.want)
			}
		})
	}
	// An unknown tool is a protocol error, and the session still works.
	if _, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "no_such_tool"}); err == nil {
		t.Error("unknown tool: no error")
	}
	res, out := call(t, cs, "run_python", map[string]any{"code": "print('still serving')"})
	if res.IsError || out["stdout"] != "still serving\n" {
		t.Fatalf("server stopped serving after bad input: %s", text(res))
	}
}

// Cancelling the client's call sends notifications/cancelled; the run is
// killed and the server keeps serving.
func TestRunPythonCancel(t *testing.T) {
	cs := connect(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "import time\ntime.sleep(60)"}})
		done <- err
	}()
	time.Sleep(700 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Error("cancelled call returned no error")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("cancelled call did not return")
	}
	// The server must be free again: with one slot and no queue a second
	// call would be refused if the cancelled run were still holding it.
	res, out := call(t, cs, "run_python", map[string]any{"code": "print('after cancel')"})
	if res.IsError || out["stdout"] != "after cancel\n" {
		t.Fatalf("after cancel: %s", text(res))
	}
}

func TestToolsList(t *testing.T) {
	cs := connect(t, nil)
	lt, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*mcp.Tool{}
	for _, tl := range lt.Tools {
		got[tl.Name] = tl
	}
	for _, name := range []string{"run_python", "check_environment", "validate_script"} {
		tl := got[name]
		if tl == nil {
			t.Fatalf("tool %s missing", name)
		}
		if tl.Description == "" || tl.InputSchema == nil || tl.OutputSchema == nil {
			t.Errorf("tool %s lacks a description or schemas", name)
		}
	}
}
