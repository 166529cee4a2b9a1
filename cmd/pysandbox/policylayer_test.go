package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// inOneWindow runs block, which makes calls counted against a rate limit
// of the given period and returns what it found wrong (""), and reports
// its finding only if the calls all fell in one window of the clock. A
// pass that straddled a window's start is tried again from the start of
// the next window, whose count is then empty, so the outcome never
// depends on how fast the machine is.
func inOneWindow(t *testing.T, period time.Duration, block func() string) {
	t.Helper()
	for attempt := 0; ; attempt++ {
		start := time.Now().Truncate(period)
		problem := block()
		if time.Now().Truncate(period).Equal(start) || attempt == 2 {
			if problem != "" {
				t.Error(problem)
			}
			return
		}
		time.Sleep(time.Until(time.Now().Truncate(period).Add(period)))
	}
}

// TestServePolicyLayerDocument: the binary loads examples/policylayer.json,
// a policy in the gateway's format, and over stdio a real client meets
// its meaning: hidden and unlisted tools gone, require and deny_if
// refusing with their messages, the all_tools limit counting only calls
// that passed their rules. The same document written as YAML means the
// same.
func TestServePolicyLayerDocument(t *testing.T) {
	doc, err := os.ReadFile("../../examples/policylayer.json")
	if err != nil {
		t.Fatal(err)
	}
	yamlDoc := filepath.Join(t.TempDir(), "policylayer.yaml")
	// JSON is YAML: the same text under a .yaml name takes the YAML
	// decoder, which must read it the same way.
	if err := os.WriteFile(yamlDoc, doc, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{"../../examples/policylayer.json", yamlDoc} {
		t.Run(filepath.Ext(file), func(t *testing.T) {
			ctx, cs := serveStdio(t, "--policy", file)
			lt, err := cs.ListTools(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, tool := range lt.Tools {
				names = append(names, tool.Name)
			}
			slices.Sort(names)
			if !slices.Equal(names, []string{"check_environment", "create_session", "run_python", "upload_file"}) {
				t.Errorf("tools/list: %v", names)
			}
			callText := func(name string, args map[string]any) (bool, string) {
				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
				if err != nil {
					t.Fatal(err)
				}
				var b strings.Builder
				for _, c := range res.Content {
					if tc, ok := c.(*mcp.TextContent); ok {
						b.WriteString(tc.Text)
					}
				}
				return res.IsError, b.String()
			}
			for _, c := range []struct {
				tool string
				args map[string]any
				want string
			}{
				{"install_package", map[string]any{"session_id": "s", "packages": []string{"x"}}, "hides it"},
				{"run_python", map[string]any{"code": "print(1)"}, "Runs must set timeout_seconds, at most 60. Nothing was run"},
				{"run_python", map[string]any{"code": "import os; os.system('rm -rf /tmp/x')", "timeout_seconds": 5}, "Destructive shell commands are not allowed"},
				{"run_python", map[string]any{"code": "1", "timeout_seconds": 5, "python_version": "3.7"}, "End-of-life Python versions are not allowed"},
			} {
				if isErr, text := callText(c.tool, c.args); !isErr || !strings.Contains(text, c.want) {
					t.Errorf("%s %v: %v %q", c.tool, c.args, isErr, text)
				}
			}
			// Five calls a minute in all: the limit's windows are aligned
			// to the clock, so calls that straddle the start of a minute
			// are counted in two windows. Such a pass proves nothing and
			// is tried again from the start of the next window.
			inOneWindow(t, time.Minute, func() string {
				for i := range 5 {
					if isErr, text := callText("run_python", map[string]any{"code": "print(" + string(rune('0'+i)) + ")", "timeout_seconds": 5}); isErr {
						return fmt.Sprintf("allowed run %d: %s", i, text)
					}
				}
				if isErr, text := callText("check_environment", map[string]any{}); !isErr || !strings.Contains(text, `"all_calls_per_minute": 5 per minute`) {
					return fmt.Sprintf("the sixth call: %v %q", isErr, text)
				}
				return ""
			})
		})
	}
}
