package profiles

import (
	"strings"
	"testing"

	"github.com/pysandbox/pysandbox/internal/govern"
)

// TestWorkspaceCodeIsJudgedAsSent: save_to_file_and_run runs a program of
// its own (runFileCode) in the caller's workspace session, so the policy
// decides the caller's code from facts derived from that code, in a
// sandbox of their own. Before, the call was gated on the facts of the
// program it ran, which let code the policy refuses run, and the facts
// cache then kept those facts for the caller's code, for every tool.
func TestWorkspaceCodeIsJudgedAsSent(t *testing.T) {
	rule := `{"deny_if": [{"conditions": [{"path": "code.imports", "op": "contains", "value": "socket"}], "on_deny": "no sockets"}]}`
	pol := `{"version": "1", "default": "allow", "tools": {"run_python": ` + rule + `, "run_python_code": ` + rule +
		`, "save_to_file_and_run": ` + rule + `, "run_python_file": ` + rule + `}}`
	cs := connect(t, "pysandbox,mcp-run-python-code", serverOpts{policy: pol, facts: govern.DefaultFactsCache})
	denied := "import socket\nprint('RAN', socket.AF_INET)"
	for _, overwrite := range []bool{true, false} {
		text, _ := callText(t, cs, "save_to_file_and_run", map[string]any{"file_name": "d.py", "code": denied, "overwrite": overwrite})
		if !strings.Contains(text, "no sockets") || strings.Contains(text, "RAN") {
			t.Errorf("save_to_file_and_run (overwrite %v) of refused code: %q", overwrite, text)
		}
	}
	// Refused before anything: the file was never saved.
	if text, _ := callText(t, cs, "run_python_file", map[string]any{"file_name": "d.py"}); strings.Contains(text, "RAN") {
		t.Errorf("the refused file ran: %q", text)
	}
	// Nothing the calls above did taught the cache that this code is fine.
	if text, _ := callText(t, cs, "run_python_code", map[string]any{"code": denied}); !strings.Contains(text, "no sockets") {
		t.Errorf("run_python_code after the workspace calls: %q", text)
	}
	text, res := callText(t, cs, "run_python", map[string]any{"code": denied})
	if !res.IsError || !strings.Contains(text, "no sockets") {
		t.Errorf("run_python after the workspace calls: %q", text)
	}
	// Code the policy allows still saves and runs, overwrite false
	// included (its existence check ran before under the call's gate,
	// which then refused the run itself).
	if text, _ := callText(t, cs, "save_to_file_and_run", map[string]any{"file_name": "ok.py", "code": "v = 6 * 7", "variable_to_return": "v", "overwrite": false}); text != "42" {
		t.Errorf("allowed code, overwrite false: %q", text)
	}
	if text, _ := callText(t, cs, "run_python_file", map[string]any{"file_name": "ok.py", "variable_to_return": "v"}); text != "42" {
		t.Errorf("run_python_file of allowed code: %q", text)
	}
}
