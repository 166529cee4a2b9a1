package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
	binDir    string
)

func TestMain(m *testing.M) {
	// Servers that stop on a signal pause their sessions into the state
	// directory, by default the user's, and the next server resumes them:
	// one test's sessions would show up in the next one's. The default
	// here is a file, which no state directory can be made under, so
	// servers keep no sessions unless a test names a --state-dir.
	state, err := os.CreateTemp("", "pysandbox-no-state-")
	if err != nil {
		panic(err)
	}
	state.Close()
	os.Setenv("XDG_STATE_HOME", state.Name())
	code := m.Run()
	os.Remove(state.Name())
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// binary builds the real pysandbox binary once per test run. It lives in a
// directory other users can read, for the unprivileged test.
func binary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "pysandbox-bin-")
		if buildErr != nil {
			return
		}
		os.Chmod(binDir, 0o755)
		binPath = filepath.Join(binDir, "pysandbox")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = err
			t.Logf("%s", out)
		}
	})
	if buildErr != nil {
		t.Fatalf("build: %v", buildErr)
	}
	return binPath
}

func runBin(t *testing.T, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(binary(t), args...)
	cmd.Stdin = strings.NewReader(stdin)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code = cmd.ProcessState.ExitCode()
	if err != nil && code < 0 {
		t.Fatalf("run %v: %v", args, err)
	}
	return o.String(), e.String(), code
}

func TestRunCommand(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "demo.py")
	os.WriteFile(script, []byte("import os, sys\nprint('uid', os.getuid())\nprint('err line', file=sys.stderr)\nraise SystemExit(7)\n"), 0o644)
	out, errOut, code := runBin(t, "", "run", script)
	if code != 7 || out != "uid 1000\n" || errOut != "err line\n" {
		t.Fatalf("code %d stdout %q stderr %q", code, out, errOut)
	}
	// stdin, and a traceback that names the file as "<stdin>".
	_, errOut, code = runBin(t, "x = 1\nx.nope\n", "run", "-")
	if code != 1 || !strings.Contains(errOut, `File "<stdin>", line 2`) {
		t.Fatalf("code %d stderr %q", code, errOut)
	}
	_, errOut, code = runBin(t, "import time\ntime.sleep(30)\n", "run", "--timeout", "1", "-")
	if code != 124 || !strings.Contains(errOut, "1s timeout (--timeout)") || !strings.Contains(errOut, "pass a larger --timeout") || strings.Contains(errOut, "timeout_seconds") {
		t.Fatalf("timeout: code %d stderr %q", code, errOut)
	}
	// More output than the server keeps of a run (--max-output) goes to
	// the terminal whole, and a run that completes exits 0, quietly.
	out, errOut, code = runBin(t, "print('x' * 100_000)\n", "run", "--max-output", "64KiB", "-")
	if code != 0 || len(out) != 100_001 || errOut != "" {
		t.Fatalf("more output than --max-output: code %d, %d bytes, stderr %q", code, len(out), errOut)
	}
	// What follows FILE is the script's, in sys.argv, as with python; a
	// flag of run's among it is pointed out.
	out, errOut, code = runBin(t, "import sys\nprint(sys.argv)\n", "run", "-", "--timeout", "2s", "x y")
	if code != 0 || out != "['<stdin>', '--timeout', '2s', 'x y']\n" || !strings.Contains(errOut, "run's flags go before FILE: pysandbox run --timeout 2s -") {
		t.Fatalf("arguments: code %d stdout %q stderr %q", code, out, errOut)
	}
	_, errOut, code = runBin(t, "", "run", filepath.Join(dir, "missing.py"))
	if code != 1 || !strings.Contains(errOut, "no such file") {
		t.Fatalf("missing file: code %d stderr %q", code, errOut)
	}
}

func TestCheckCommand(t *testing.T) {
	out, errOut, code := runBin(t, "", "check")
	if code != 0 || !strings.Contains(out, "posture: SANDBOXED") {
		t.Fatalf("code %d\n%s\n%s", code, out, errOut)
	}
	if _, err := exec.LookPath("bwrap"); err == nil {
		out, errOut, code = runBin(t, "", "check", "--sandbox", "bwrap")
		if code != 0 || !strings.Contains(out, "posture: SANDBOXED") {
			t.Fatalf("--sandbox bwrap: code %d\n%s\n%s", code, out, errOut)
		}
		out, errOut, code = runBin(t, "import os\nprint(os.getuid())\n", "run", "--sandbox", "bwrap", "-")
		if code != 0 || out != "1000\n" {
			t.Fatalf("run --sandbox bwrap: code %d %q %q", code, out, errOut)
		}
	}
	out, _, code = runBin(t, "", "check", "--sandbox", "none")
	if code != 0 || !strings.Contains(out, "posture: UNSANDBOXED") {
		t.Fatalf("--sandbox none: code %d\n%s", code, out)
	}
	// A server's --policy is read as serve reads it: its network rules
	// are the posture's, and a policy serve would refuse fails the check.
	dir := t.TempDir()
	pol := filepath.Join(dir, "net.json")
	os.WriteFile(pol, []byte(`{"version": "1", "default": "allow", "network": {"allow": ["example.com"]}}`), 0o644)
	out, errOut, code = runBin(t, "", "check", "--pool-size", "0", "--policy", pol)
	if code != 0 || !strings.Contains(out, "the one way out is the server's proxy") {
		t.Fatalf("--policy with a network section: code %d\n%s\n%s", code, out, errOut)
	}
	os.WriteFile(pol, []byte(`{bad`), 0o644)
	if _, errOut, code = runBin(t, "", "check", "--pool-size", "0", "--policy", pol); code == 0 || !strings.Contains(errOut, "invalid JSON") {
		t.Fatalf("a broken policy: code %d\n%s", code, errOut)
	}
}

func TestFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"run", "--sandbox", "docker", "-"},
		{"run", "--memory", "lots", "-"},
		{"run", "--timeout", "10m", "--max-timeout", "1m", "-"},
		{"serve", "--http", "0.0.0.0:8080"},
		{"serve", "--http", "192.168.1.5:8080"},
		{"frobnicate"},
	} {
		_, errOut, code := runBin(t, "", args...)
		if code != 2 || errOut == "" {
			t.Errorf("%v: code %d stderr %q", args, code, errOut)
		}
	}
	// A flag serve does not have: the error and one usage line.
	_, errOut, code := runBin(t, "", "serve", "--no-such-flag")
	if code != 2 || errOut != "pysandbox serve: flag provided but not defined: -no-such-flag\nusage: pysandbox serve [flags]; pysandbox serve -h lists them\n" {
		t.Errorf("bad flag: code %d stderr %q", code, errOut)
	}
	_, errOut, _ = runBin(t, "", "serve", "--http", "0.0.0.0:8080")
	if !strings.Contains(errOut, "non-loopback") {
		t.Errorf("non-loopback refusal unclear: %q", errOut)
	}
}

// serveStdio starts the built binary's stdio server with args and connects
// the SDK's client to it; both go when the test ends.
func serveStdio(t *testing.T, args ...string) (context.Context, *mcp.ClientSession) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	cmd := exec.Command(binary(t), append([]string{"serve", "--log-level", "error"}, args...)...)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return ctx, cs
}

// The built binary, driven over stdio by the SDK's client.
func TestServeStdio(t *testing.T) {
	ctx, cs := serveStdio(t)
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "print('hi')\n6*7"}})
	if err != nil {
		t.Fatal(err)
	}
	out := res.StructuredContent.(map[string]any)
	if res.IsError || out["stdout"] != "hi\n" || out["return_value"] != 42.0 {
		t.Fatalf("%v", out)
	}
	// Many calls at once over one connection.
	var wg sync.WaitGroup
	errs := make(chan string, 16)
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "n", "inputs": map[string]any{"n": i}}})
			if err != nil {
				errs <- err.Error()
				return
			}
			if rv := res.StructuredContent.(map[string]any)["return_value"]; rv != float64(i) {
				errs <- "wrong return value"
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// Malformed JSON-RPC on stdin gets an error response, and the server keeps
// serving the next, valid request.
func TestServeMalformedInput(t *testing.T) {
	cmd := exec.Command(binary(t), "serve", "--log-level", "error")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer stdin.Close()
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	send := func(s string) { io.WriteString(stdin, s+"\n") }
	next := func() string {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("server closed stdout")
			}
			return l
		case <-time.After(20 * time.Second):
			t.Fatal("no answer from the server")
		}
		return ""
	}
	send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	if l := next(); !strings.Contains(l, `"id":1,"result"`) {
		t.Fatalf("initialize: %s", l)
	}
	send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	for _, tc := range []struct{ in, want string }{
		{`this is not json`, `-32700`},
		{`{"jsonrpc":"2.0","id":7,"method":42}`, `"id":7,"error"`},
		{`{"jsonrpc":"2.0","id":2,"method":"no/such/method"}`, `"id":2,"error"`},
		{`[]`, `-32600`},
		{`[1,2,3]`, `-32600`},
		{`[{"jsonrpc":"2.0","id":9,"method":"ping"},{"jsonrpc":"2.0","id":10,"method":"ping"}]`, `-32600`},
		{`  [{"jsonrpc":"2.0","method":"notifications/initialized"}]`, `-32600`},
		{`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"run_python","arguments":"not an object"}}`, `"isError":true`},
		{`{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"run_python","arguments":{"code":"print(40+2)"}}}`, `"stdout":"42\n"`},
	} {
		send(tc.in)
		if l := next(); !strings.Contains(l, tc.want) {
			t.Errorf("%s\n  got  %s\n  want %s", tc.in, l, tc.want)
		}
	}
}

// A session over stdio against the built binary (warm pool on, as a user
// gets it): state persists, files go in and out, and the server cleans up.
func TestServeSessions(t *testing.T) {
	ctx, cs := serveStdio(t)
	callOK := func(name string, args map[string]any) map[string]any {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil || res.IsError {
			msg := ""
			if res != nil && len(res.Content) > 0 {
				if tc, ok := res.Content[0].(*mcp.TextContent); ok {
					msg = tc.Text
				}
			}
			t.Fatalf("%s: %v %s", name, err, msg)
		}
		out, _ := res.StructuredContent.(map[string]any)
		return out
	}
	id := callOK("create_session", map[string]any{})["session_id"].(string)
	callOK("upload_file", map[string]any{"session_id": id, "path": "in.txt", "content": "21"})
	callOK("run_python", map[string]any{"session_id": id, "code": "n = int(open('in.txt').read())"})
	if rv := callOK("run_python", map[string]any{"session_id": id, "code": "open('out.txt', 'w').write(str(n * 2))\nn * 2"})["return_value"]; rv != 42.0 {
		t.Fatalf("return_value %v", rv)
	}
	if out := callOK("download_file", map[string]any{"session_id": id, "path": "out.txt"}); out["size"] != 2.0 {
		t.Fatalf("download %v", out)
	}
	callOK("close_session", map[string]any{"session_id": id})
}
