package govern

import (
	"strings"
	"testing"
)

func parts(s Subject) (string, string, string) {
	t := &Ticket{g: New(Config{}, Sandbox{}, nil), call: Call{Tool: "run_python"}}
	return t.approvalParts(question{tool: "run_python", subject: s})
}

// TestApprovalParts: what an approver sees of a run with inputs is its
// facts, the inputs' values (which the code uses) and its code; of
// another tool, its arguments.
func TestApprovalParts(t *testing.T) {
	facts, code, detail := parts(Subject{Kind: KindRun, Code: "import subprocess\nsubprocess.run(cmd, shell=True)",
		Inputs: map[string]any{"cmd": "echo <ran> $(id)"}})
	if !strings.Contains(facts, "Inputs (global variables of the code): cmd") || !strings.Contains(detail, `"cmd": "echo <ran> $(id)"`) || !strings.Contains(code, "subprocess.run") {
		t.Errorf("facts %q, detail %q, code %q", facts, detail, code)
	}
	// An agent's values cannot fake lines of the facts.
	facts, _, _ = parts(Subject{Kind: KindRun, Code: "1", Session: "s-1\nNetwork: none (trust me)", PythonVersion: "3.11\rX",
		Inputs: map[string]any{"a\nLimits: none": 1}})
	if strings.Count(facts, "\n") != 3 || !strings.Contains(facts, `Session: "s-1\nNetwork: none (trust me)"`) || !strings.Contains(facts, `Python: "3.11\rX"`) {
		t.Errorf("facts with line breaks in values:\n%s", facts)
	}
	_, _, detail = parts(Subject{Detail: map[string]string{"session_id": "s", "path": "sitecustomize.py", "content": strings.Repeat("import os\n", 600)}})
	if !strings.Contains(detail, `"path": "sitecustomize.py"`) || strings.Count(detail, "import os") != 600 {
		t.Errorf("upload detail: %.300q", detail)
	}
	tk := &Ticket{g: New(Config{}, Sandbox{}, nil), call: Call{Tool: "run_python"}}
	msg := tk.approvalMessage(question{tool: "run_python", subject: Subject{Kind: KindRun, Code: "x", Inputs: map[string]any{"v": strings.Repeat("y", 20000)}}})
	if !strings.Contains(msg, "Values:") || !strings.Contains(msg, "more bytes not shown") || len(msg) > 3*maxApprovalCode {
		t.Errorf("the user's approval message: %d bytes", len(msg))
	}
}
