package tools

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/activity"
	"github.com/pysandbox/pysandbox/internal/policy"
)

// TestCodeRulesInTheRunsSandbox: a run's code rules are decided from the
// facts its own sandbox's parser sends before any of the code runs. A
// refused session run leaves nothing behind (its first line never ran);
// a run an operator must approve waits for them after its sandbox is let
// go, then runs once.
func TestCodeRulesInTheRunsSandbox(t *testing.T) {
	pol, err := policy.Parse([]byte(`{"version": "1", "default": "allow", "tools": {"run_python": {
		"deny_if": [{"conditions": [{"path": "code.imports", "op": "contains", "value": "socket"}], "on_deny": "no sockets"}],
		"approve_if": [{"conditions": [{"path": "code.process_calls", "op": "exists", "value": true}], "reason": "it starts processes", "by": "operator"}]}}}`), "p.json", Names)
	if err != nil {
		t.Fatal(err)
	}
	act := activity.New()
	cs := connectWith(t, nil, func(o *Options) { o.Governance = Governance{Policy: pol, Activity: act} })
	_, out := call(t, cs, "create_session", nil)
	id, _ := out["session_id"].(string)
	res, _ := call(t, cs, "run_python", map[string]any{"session_id": id, "code": "y = 2\nimport socket"})
	if !res.IsError || !strings.Contains(text(res), "no sockets") {
		t.Fatalf("socket run: %s", text(res))
	}
	_, out = call(t, cs, "run_python", map[string]any{"session_id": id, "code": "'y' in globals()"})
	if out["return_value"] != false {
		t.Fatalf("the refused run's first line ran: %v", out)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	go func() {
		for ctx.Err() == nil {
			for _, a := range act.Pending() {
				full, _ := act.Get(a.ID)
				if !strings.Contains(full.Facts, "it starts processes") {
					t.Errorf("the operator is not told why: %q", full.Facts)
				}
				act.Decide(a.ID, true, "olga", full.Digest)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	res, out = call(t, cs, "run_python", map[string]any{"code": "import subprocess\nsubprocess.run(['true'])\nprint('ran')"})
	if res.IsError || out["stdout"] != "ran\n" {
		t.Fatalf("approved run: %s %v", text(res), out)
	}
}

// TestSessionCannotTurnOffTheGate: a session's worker has run the
// caller's code, which can replace what it reports; so a session's runs
// have their code's facts derived in a sandbox of their own (on the
// session's interpreter), and patching the worker changes nothing.
func TestSessionCannotTurnOffTheGate(t *testing.T) {
	pol, err := policy.Parse([]byte(`{"version": "1", "default": "allow", "tools": {"run_python": {
		"deny_if": [{"conditions": [{"path": "code.imports", "op": "contains", "value": "subprocess"}], "on_deny": "no subprocess"}]}}}`), "p.json", Names)
	if err != nil {
		t.Fatal(err)
	}
	cs := connectWith(t, nil, func(o *Options) { o.Governance = Governance{Policy: pol} })
	_, out := call(t, cs, "create_session", nil)
	id, _ := out["session_id"].(string)
	_, out = call(t, cs, "run_python", map[string]any{"session_id": id, "code": `
import sys
n = 0
f = sys._getframe()
while f is not None:
    if "_gate" in f.f_globals:
        f.f_globals["_gate"] = lambda sock, source: None
        n += 1
    f = f.f_back
n`})
	if out["status"] != "success" {
		t.Fatalf("patch run: %v", out)
	}
	res, out := call(t, cs, "run_python", map[string]any{"session_id": id, "code": "import subprocess\nprint(subprocess.run(['id'], capture_output=True).returncode)"})
	if !res.IsError || !strings.Contains(text(res), "no subprocess") {
		t.Fatalf("after patching the session's worker: %s %v", text(res), out)
	}
}
