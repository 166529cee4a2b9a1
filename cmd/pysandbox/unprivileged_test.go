package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/pysandbox/pysandbox/internal/testutil"
)

// asUser runs the binary as a throwaway unprivileged user, the way most
// people run pysandbox: no root, no cgroup delegation.
func asUser(t *testing.T, uid, gid uint32, stdin string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(binary(t), args...)
	cmd.Dir = binDir
	// A home the user cannot write to: the server must still serve runs
	// (dependencies are then disabled, with the reason).
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + binDir, "LANG=C.UTF-8"}
	cmd.Stdin = strings.NewReader(stdin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}}}
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	cmd.Run()
	return o.String(), e.String(), cmd.ProcessState.ExitCode()
}

func throwawayUser(t *testing.T) (uint32, uint32) { return testutil.ThrowawayUser(t) }

func TestUnprivilegedUser(t *testing.T) {
	uid, gid := throwawayUser(t)
	binary(t)

	out, errOut, code := asUser(t, uid, gid, "", "check")
	if code != 0 || !strings.Contains(out, "posture: SANDBOXED") {
		t.Fatalf("check as uid %d: code %d\n%s\n%s", uid, code, out, errOut)
	}
	// No cgroup delegation here: that must be said, with the fallback.
	if !strings.Contains(out, "RLIMIT_AS") {
		t.Errorf("check does not say memory falls back to RLIMIT_AS:\n%s", out)
	}

	out, errOut, code = asUser(t, uid, gid, "import os\nprint(os.getuid(), os.getgid(), len(os.listdir('/proc/self/fd')) > 0)\n", "run", "-")
	if code != 0 || out != "1000 1000 True\n" {
		t.Fatalf("run: code %d stdout %q stderr %q", code, out, errOut)
	}

	// Without a memory cgroup, RLIMIT_AS stops a memory bomb.
	_, errOut, code = asUser(t, uid, gid, "x = bytearray(2 * 1024**3)\n", "run", "--memory", "128MiB", "-")
	if code == 0 || !strings.Contains(errOut, "memory_limit") {
		t.Fatalf("memory bomb as unprivileged: code %d stderr %q", code, errOut)
	}

	// RLIMIT_NPROC (counted per user namespace) bounds a fork bomb.
	bomb := "import os, time\nn = 0\ntry:\n    while n < 500:\n        if os.fork() == 0:\n            time.sleep(30)\n            os._exit(0)\n        n += 1\nexcept OSError as e:\n    print('stopped at', n, e.errno)\n"
	out, errOut, code = asUser(t, uid, gid, bomb, "run", "--max-procs", "20", "--timeout", "10", "-")
	if code != 0 || !strings.HasPrefix(out, "stopped at") {
		t.Fatalf("fork bomb as unprivileged: code %d stdout %q stderr %q", code, out, errOut)
	}
	var n int
	fmt.Sscanf(out, "stopped at %d", &n)
	if n >= 20 {
		t.Errorf("forked %d processes with --max-procs 20", n)
	}

	// Governed serving as a normal user: a policy, an audit log the user
	// owns (append-only, fsynced, locked), a denial, and a log that
	// verifies.
	dir, err := os.MkdirTemp("", "pysbx-gov-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	pol := filepath.Join(dir, "policy.json")
	os.WriteFile(pol, []byte(`{"version": "1", "default": "allow", "tools": {"validate_script": {"action": "deny", "reason": "not here"}}}`), 0o644)
	os.Chown(dir, int(uid), int(gid))
	auditLog := filepath.Join(dir, "audit.log")
	cmd := exec.Command(binary(t), "serve", "--policy", pol, "--audit-log", auditLog, "--log-level", "error")
	cmd.Dir = binDir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + binDir, "LANG=C.UTF-8"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}}}
	// The server's log says why it stopped if it does.
	var serverLog testutil.SyncBuffer
	cmd.Stderr = &serverLog
	ctx := context.Background()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("%v\nserver log:\n%s", err, serverLog.String())
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "import os\nos.getuid()"}})
	if err != nil || res.IsError {
		t.Fatalf("governed run as a normal user: %v %+v", err, res)
	}
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "validate_script", Arguments: map[string]any{"code": "1"}})
	if err != nil || !res.IsError {
		t.Fatalf("denied tool as a normal user: %v %+v", err, res)
	}
	cs.Close()
	st, err := os.Stat(auditLog)
	if err != nil {
		t.Fatal(err)
	}
	if sys := st.Sys().(*syscall.Stat_t); sys.Uid != uid || st.Mode().Perm() != 0o600 {
		t.Errorf("audit log owned by %d with mode %v, want %d and 0600", sys.Uid, st.Mode().Perm(), uid)
	}
	out, errOut, code = asUser(t, uid, gid, "", "audit", "verify", auditLog)
	if code != 0 || !strings.Contains(out, "ok: 3 records") {
		t.Errorf("audit verify as a normal user: %d %s %s", code, out, errOut)
	}
}

// TestUnprivilegedNetwork: a normal user's server hands its runs the
// network the flags allow, through the proxy, on the system interpreter
// and on a pyenv one, and nothing else.
func TestUnprivilegedNetwork(t *testing.T) {
	uid, gid := throwawayUser(t)
	binary(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello "+r.Host) }))
	defer srv.Close()
	port := srv.URL[strings.LastIndex(srv.URL, ":")+1:]
	code := "import urllib.request\nprint(urllib.request.urlopen('http://files.test:" + port + "/', timeout=20).read().decode())\n" +
		"try:\n    urllib.request.urlopen('http://other.test:" + port + "/', timeout=20)\nexcept Exception as e:\n    print('refused:', e)\n"
	pythons := []string{"/usr/bin/python3"}
	// A pyenv interpreter lives in root's home, which a normal user cannot
	// open; one copied somewhere readable would do, but the system one is
	// what such a user has. As root, the pyenv one too (TestRunPyenvNetwork).
	for _, py := range pythons {
		for _, pool := range []string{"0", "1"} { // a cold sandbox, and a pool child
			out, errOut, code := asUser(t, uid, gid, code, "run", "--python", py, "--pool-size", pool, "--allow-net", "files.test:"+port+"=127.0.0.1", "-")
			if code != 0 || !strings.HasPrefix(out, "hello files.test:"+port+"\n") || !strings.Contains(out, "refused: HTTP Error 403: pysandbox network proxy: other.test:"+port+" is not among the hosts") {
				t.Errorf("%s (pool size %s) as uid %d: code %d\n%s\n%s", py, pool, uid, code, out, errOut)
			}
		}
	}
}

// TestRunPyenvNetwork: the same through a pyenv interpreter (as root).
func TestRunPyenvNetwork(t *testing.T) {
	matches, _ := filepath.Glob("/root/.pyenv/versions/3.12*/bin/python3")
	if len(matches) == 0 {
		t.Skip("no pyenv 3.12 on this machine")
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello "+r.Host) }))
	defer srv.Close()
	port := srv.URL[strings.LastIndex(srv.URL, ":")+1:]
	code := "import sys, urllib.request\nprint(sys.version_info[:2], urllib.request.urlopen('http://files.test:" + port + "/', timeout=20).read().decode())\n"
	out, errOut, exit := runBin(t, code, "run", "--python", matches[0], "--allow-net", "files.test:"+port+"=127.0.0.1", "-")
	if exit != 0 || out != "(3, 12) hello files.test:"+port+"\n" {
		t.Errorf("pyenv 3.12: code %d\n%s\n%s", exit, out, errOut)
	}
}
