package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestSetup: `pysandbox setup cursor --write` writes an entry that a
// client can start as written: the test starts it, as Cursor would, and
// lists its tools.
func TestSetup(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "mcp.json")
	os.WriteFile(cfg, []byte(`{"mcpServers": {"other": {"command": "true"}}}`), 0o600)
	out, err := exec.Command(binary(t), "setup", "cursor", "--write", "--file", cfg, "--", "--tools", "mcp-run-python").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "wrote") {
		t.Fatalf("setup: %v %s", err, out)
	}
	var file struct {
		MCPServers map[string]struct {
			Command string
			Args    []string
		} `json:"mcpServers"`
	}
	data, _ := os.ReadFile(cfg)
	if err := json.Unmarshal(data, &file); err != nil || len(file.MCPServers) != 2 {
		t.Fatalf("the file: %v\n%s", err, data)
	}
	e := file.MCPServers["pysandbox"]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "cursor-like", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: exec.Command(e.Command, e.Args...)}, nil)
	if err != nil {
		t.Fatalf("starting the entry: %v", err)
	}
	defer cs.Close()
	tools, err := cs.ListTools(ctx, nil)
	if err != nil || len(tools.Tools) != 1 || tools.Tools[0].Name != "run_python_code" {
		t.Errorf("the entry's tools: %v %+v", err, tools)
	}
	// A client name that is not one is refused clearly.
	if out, err := exec.Command(binary(t), "setup", "emacs").CombinedOutput(); err == nil || !strings.Contains(string(out), "claude-code, claude-desktop, codex, cursor, gemini, vscode") {
		t.Errorf("an unknown client: %v %s", err, out)
	}
}
