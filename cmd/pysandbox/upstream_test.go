package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/testutil"
	"github.com/pysandbox/pysandbox/internal/testutil/refservers"
)

// walkthroughCode is the walkthrough of docs/upstream.md: one run calls tools of two
// upstream servers, combines their results and returns a short answer.
const walkthroughCode = `
import tools
tools.memory.create_entities(entities=[
    {"name": "Ada", "entityType": "person", "observations": ["wrote the first program"]},
    {"name": "Grace", "entityType": "person", "observations": ["wrote the first compiler"]},
])
graph = tools.memory.read_graph()
total = tools.everything.get_sum(a=len(graph["entities"]), b=40)
{"people": sorted(e["name"] for e in graph["entities"]), "sum": total}
`

func writeUpstreams(t *testing.T, servers map[string]any) string {
	t.Helper()
	doc, _ := json.Marshal(map[string]any{"mcpServers": servers})
	path := filepath.Join(t.TempDir(), "upstreams.json")
	if err := os.WriteFile(path, doc, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// waitUpstreams lists the tools until the servers named are ready: they
// connect in the background.
func waitUpstreams(t *testing.T, cs *mcp.ClientSession, serverLog *testutil.SyncBuffer, names ...string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		res, _ := callOK(t, cs, "list_tools_in_sandbox", nil)
		txt := res.Content[0].(*mcp.TextContent).Text
		ready := true
		for _, n := range names {
			ready = ready && strings.Contains(txt, "server "+n+": ready")
		}
		if ready {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the upstreams did not become ready: %s\n%s", txt, serverLog.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func callOK(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) (*mcp.CallToolResult, map[string]any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil || res.IsError {
		t.Fatalf("%s: %v %+v", name, err, res)
	}
	out, _ := res.StructuredContent.(map[string]any)
	return res, out
}

// TestServeUpstream: `serve --upstream` over stdio, driven by a real
// client: the tools are listed and called from code in pooled and cold
// runs (the system interpreter and a pyenv one), every inner call is in
// the audit log, which verifies, and the upstream processes stop with
// the server, whether it is closed or killed.
func TestServeUpstream(t *testing.T) {
	evCmd, evArgs := refservers.Everything(t)
	memCmd, memArgs := refservers.Memory(t, filepath.Join(t.TempDir(), "memory.jsonl"))
	up := writeUpstreams(t, map[string]any{
		"everything": map[string]any{"command": evCmd, "args": evArgs},
		"memory":     map[string]any{"command": memCmd, "args": memArgs},
	})
	pyenv, _ := filepath.Glob("/root/.pyenv/versions/3.12*/bin/python3")
	cases := [][]string{{"--pool-size", "1"}, {"--pool-size", "0"}}
	if len(pyenv) > 0 {
		cases = append(cases, []string{"--pool-size", "1", "--python", pyenv[0]})
	}
	for _, extra := range cases {
		t.Run(strings.Join(extra, " "), func(t *testing.T) {
			auditLog := filepath.Join(t.TempDir(), "audit.log")
			args := append([]string{"serve", "--upstream", up, "--audit-log", auditLog, "--log-level", "error"}, extra...)
			cmd := exec.Command(binary(t), args...)
			var serverLog testutil.SyncBuffer
			cmd.Stderr = &serverLog
			ctx := context.Background()
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
			if err != nil {
				t.Fatalf("%v\n%s", err, serverLog.String())
			}
			waitUpstreams(t, cs, &serverLog, "everything", "memory")
			upstreams := descendants(cmd.Process.Pid)
			_, out := callOK(t, cs, "run_python", map[string]any{"code": walkthroughCode})
			rv, _ := json.Marshal(out["return_value"])
			if out["status"] != "success" || !strings.Contains(string(rv), `"people":["Ada","Grace"]`) {
				t.Fatalf("walkthrough: %v\n%s", out, serverLog.String())
			}
			// The same graph holds Ada and Grace for every later case too
			// (memory.jsonl is shared), so the sum is 42 each time.
			if !strings.Contains(string(rv), "42") {
				t.Errorf("sum: %s", rv)
			}
			cs.Close()
			for _, p := range upstreams {
				deadline := time.Now().Add(30 * time.Second)
				for alive(p) && time.Now().Before(deadline) {
					time.Sleep(20 * time.Millisecond)
				}
				if alive(p) {
					t.Errorf("upstream process %d (%s) outlived the server", p.pid, p.Comm)
				}
			}
			stdout, stderr, code := runBin(t, "", "audit", "verify", auditLog)
			if code != 0 {
				t.Errorf("audit verify: %s %s", stdout, stderr)
			}
			data, _ := os.ReadFile(auditLog)
			if n := strings.Count(string(data), `"event":"upstream_call"`); n != 3 {
				t.Errorf("%d upstream_call records, want 3:\n%s", n, data)
			}
		})
	}

	// Killed without a chance to clean up: the upstreams die too.
	cmd := exec.Command(binary(t), "serve", "--upstream", up, "--log-level", "error")
	ctx := context.Background()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	var nodes []proc
	deadline := time.Now().Add(2 * time.Minute)
	for len(nodes) < 2 && time.Now().Before(deadline) {
		nodes = nodes[:0]
		for _, p := range descendants(cmd.Process.Pid) {
			if p.Comm == "node" {
				nodes = append(nodes, p)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(nodes) < 2 {
		t.Fatalf("the upstream servers did not start under the server: %+v", descendants(cmd.Process.Pid))
	}
	cmd.Process.Signal(syscall.SIGKILL)
	for _, p := range nodes {
		deadline := time.Now().Add(30 * time.Second)
		for alive(p) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if alive(p) {
			t.Errorf("upstream %d outlived the killed server", p.pid)
		}
	}
}

// TestServeUpstreamEarlyCall: an agent that starts the server and runs
// code at once, as scripted agents do, gets the result of an upstream
// that takes 3 s to start, not an error saying it is connecting (issue
// 26).
func TestServeUpstreamEarlyCall(t *testing.T) {
	evCmd, evArgs := refservers.Everything(t)
	up := writeUpstreams(t, map[string]any{
		"everything": map[string]any{"command": "sh", "args": append([]string{"-c", `sleep 3; exec "$0" "$@"`, evCmd}, evArgs...)},
	})
	cmd := exec.Command(binary(t), "serve", "--upstream", up, "--log-level", "error", "--max-timeout", "2m")
	var serverLog testutil.SyncBuffer
	cmd.Stderr = &serverLog
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, serverLog.String())
	}
	defer cs.Close()
	_, out := callOK(t, cs, "run_python", map[string]any{"timeout_seconds": 120, "code": "import tools\ntools.everything.get_sum(a=2, b=40)"})
	if out["status"] != "success" || !strings.Contains(fmt.Sprint(out["return_value"]), "42") {
		t.Errorf("a run at once: %v\n%s", out, serverLog.String())
	}
}

// TestUnprivilegedUpstream: a normal user's server calls an upstream on
// streamable HTTP from code in its runs.
func TestUnprivilegedUpstream(t *testing.T) {
	uid, gid := throwawayUser(t)
	url := refservers.EverythingHTTP(t)
	dir, err := os.MkdirTemp("", "pysbx-up-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	up := filepath.Join(dir, "upstreams.json")
	os.WriteFile(up, []byte(fmt.Sprintf(`{"mcpServers": {"remote": {"url": %q}}}`, url)), 0o644)
	code := "import os, tools\nprint(os.getuid(), tools.remote.get_sum(a=1, b=2))\n"
	for _, pool := range []string{"0", "1"} {
		cmd := exec.Command(binary(t), "serve", "--upstream", up, "--pool-size", pool, "--log-level", "error")
		cmd.Dir = binDir
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + binDir, "LANG=C.UTF-8"}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}}}
		var serverLog testutil.SyncBuffer
		cmd.Stderr = &serverLog
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
		if err != nil {
			t.Fatalf("%v\n%s", err, serverLog.String())
		}
		waitUpstreams(t, cs, &serverLog, "remote")
		_, out := callOK(t, cs, "run_python", map[string]any{"code": code})
		if out["stdout"] != "1000 The sum of 1 and 2 is 3.\n" {
			t.Errorf("pool size %s as uid %d: %v\n%s", pool, uid, out, serverLog.String())
		}
		cs.Close()
	}
}
