package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestServeProfiles: the binary with --tools, as each peer's clients run
// it over stdio: one changed command line. The policy names the
// profile's tools, and the audit log records them.
func TestServeProfiles(t *testing.T) {
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.json")
	os.WriteFile(pol, []byte(`{"version":"1","default":"allow","tools":{"execute_terminal_command":{"action":"deny","reason":"no shells here"}}}`), 0o600)
	auditLog := filepath.Join(dir, "audit.log")

	// mcp-run-python: `uvx mcp-run-python stdio` becomes this.
	ctx, cs := serveStdio(t, "--tools", "mcp-run-python")
	init := cs.InitializeResult()
	if init.ServerInfo.Name != "MCP Run Python" || !strings.Contains(init.Instructions, "run_python_code") {
		t.Errorf("server info: %+v %q", init.ServerInfo, init.Instructions)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python_code", Arguments: map[string]any{"python_code": "x = 4\nprint(f'{x=}')\nx"}})
	if err != nil || toolText(res) != "<status>success</status>\n<output>\nx=4\n</output>\n<return_value>\n4\n</return_value>" {
		t.Errorf("the peer's basic example: %v %q", err, toolText(res))
	}
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "1"}}); err == nil {
		t.Error("run_python served beside --tools mcp-run-python alone")
	}

	// mcp-sandbox, under a policy that denies its shell, with an audit log.
	ctx, cs = serveStdio(t, "--tools", "mcp-sandbox", "--policy", pol, "--audit-log", auditLog)
	created, _ := callTool(t, cs, "create_sandbox", nil)
	id := between(toolText(created), `"sandbox_id": "`, `"`)
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "execute_terminal_command", Arguments: map[string]any{"sandbox_id": id, "command": "id"}})
	if err != nil || !res.IsError || !strings.Contains(toolText(res), "no shells here") {
		t.Errorf("a denied profile tool: %v %+v", err, res)
	}
	out, _ := callTool(t, cs, "execute_python_code", map[string]any{"sandbox_id": id, "code": "print('audited')"})
	if !strings.Contains(toolText(out), `"stdout": "audited\n"`) {
		t.Errorf("execute_python_code: %q", toolText(out))
	}
	cs.Close()
	data, _ := os.ReadFile(auditLog)
	for _, want := range []string{`"tool":"execute_python_code"`, `"decision":"deny","reason":"no shells here"`, `print('audited')`} {
		if !strings.Contains(string(data), want) {
			t.Errorf("the audit log lacks %s:\n%s", want, data)
		}
	}

	// Clashing names are refused with a clear message.
	outb, err := exec.Command(binary(t), "serve", "--tools", "pysandbox,mcp-python-exec-sandbox").CombinedOutput()
	if err == nil || !strings.Contains(string(outb), "both have a tool named check_environment") {
		t.Errorf("a clash: %v %s", err, outb)
	}
	// A policy naming a tool the profile does not have is refused.
	os.WriteFile(pol, []byte(`{"version":"1","default":"allow","tools":{"run_python":{"action":"deny"}}}`), 0o600)
	outb, err = exec.Command(binary(t), "serve", "--tools", "mcp-run-python", "--policy", pol).CombinedOutput()
	if err == nil || !strings.Contains(string(outb), "run_python") {
		t.Errorf("a policy for other tools: %v %s", err, outb)
	}
}

func between(s, a, b string) string {
	_, rest, ok := strings.Cut(s, a)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(rest, b)
	return v
}
