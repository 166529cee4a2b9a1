package govern

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pysandbox/pysandbox/internal/audit"
	"github.com/pysandbox/pysandbox/internal/policy"
)

// These tests drive governance alone: a real audit log, a fake deriver of
// code facts, no sandbox and no python3.

var testTools = []string{"run_python", "upload_file", "check_environment"}

func newGov(t *testing.T, doc string, facts FactsFunc) (*Governor, string) {
	t.Helper()
	pol, err := policy.Parse([]byte(doc), "p.json", testTools)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "audit.log")
	w, err := audit.Open(path, audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return New(Config{Policy: pol, Audit: w}, Sandbox{Facts: facts}, nil), path
}

func records(t *testing.T, path string) []audit.Record {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []audit.Record
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var r audit.Record
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

// call admits and checks one call, and ends it as a success when it
// passes.
func call(g *Governor, tool, args string, s Subject) *Refusal {
	ctx, tk, ref := g.Admit(context.Background(), Call{Tool: tool, Identity: "alice", Args: json.RawMessage(args)})
	if ref == nil {
		v := tk.Check(ctx, s, Approver{})
		ref = v.Refusal
	}
	if ref != nil {
		tk.End(Outcome{Refused: ref})
		return ref
	}
	tk.End(Outcome{Status: "success"})
	return nil
}

func TestDecideAndRecord(t *testing.T) {
	derived := 0
	facts := func(_ context.Context, code, _ string) (map[string]any, string, error) {
		derived++
		if strings.Contains(code, "boom") {
			return nil, "", errors.New("the analyser failed")
		}
		imports := []any{}
		if strings.Contains(code, "socket") {
			imports = append(imports, "socket")
		}
		return map[string]any{"imports": imports}, "imports: " + strings.TrimSpace(code), nil
	}
	g, path := newGov(t, `{"version": "1", "default": "allow", "hide": ["check_environment"],
		"all_tools": {"limits": [{"counter": "all", "window": "hour", "max": 2, "scope": "grant"}]},
		"tools": {"run_python": {"deny_if": [{"conditions": [{"path": "code.imports", "op": "contains", "value": "socket"}], "on_deny": "no sockets"}]},
		          "upload_file": {"require": [{"conditions": [{"path": "args.size", "op": "lt", "value": 10}]}]}}}`, facts)
	if r := call(g, "check_environment", `{}`, Subject{}); r == nil || !strings.Contains(r.Message, "hides it") {
		t.Errorf("hidden: %+v", r)
	}
	if r := call(g, "run_python", `{"code": "import socket"}`, Subject{Kind: KindRun, Code: "import socket"}); r == nil || !strings.Contains(r.Message, "no sockets") {
		t.Errorf("code rule: %+v", r)
	}
	if r := call(g, "run_python", `{"code": "boom"}`, Subject{Kind: KindRun, Code: "boom"}); r == nil || !strings.Contains(r.Message, "could not be analysed") {
		t.Errorf("failed facts must refuse: %+v", r)
	}
	if r := call(g, "upload_file", `{"size": 10}`, Subject{}); r == nil || r.Status != StatusDenied || !strings.Contains(r.Message, "args.size lt 10") {
		t.Errorf("require: %+v", r)
	}
	if derived != 2 {
		t.Errorf("facts derived %d times; only run_python's rules name them", derived)
	}
	// The refused calls did not count: two calls pass, the third is
	// limited.
	if r := call(g, "run_python", `{"code": "1"}`, Subject{Kind: KindRun, Code: "1"}); r != nil {
		t.Fatal(r)
	}
	if r := call(g, "upload_file", `{"size": 1}`, Subject{}); r != nil {
		t.Fatal(r)
	}
	if r := call(g, "upload_file", `{"size": 1}`, Subject{}); r == nil || !strings.Contains(r.Message, `"all": 2 per hour`) {
		t.Errorf("all_tools limit: %+v", r)
	}
	recs := records(t, path)
	want := []struct{ decision, rule, status string }{
		{"deny", "", ""}, {"deny", "tools.run_python.deny_if[0]", ""}, {"deny", "", ""},
		{"deny", "tools.upload_file.require[0]", ""}, {"allow", "", "success"}, {"allow", "", "success"}, {"rate_limited", "", ""},
	}
	if len(recs) != len(want) {
		t.Fatalf("%d records: %+v", len(recs), recs)
	}
	for i, w := range want {
		r := recs[i]
		if r.Decision != w.decision || r.Detail["rule"] != w.rule || r.Status != w.status {
			t.Errorf("record %d: %s %q %s, want %+v", i, r.Decision, r.Detail["rule"], r.Status, w)
		}
	}
	if recs[1].Detail["code_facts"] != "imports: import socket" {
		t.Errorf("the facts that decided: %q", recs[1].Detail["code_facts"])
	}
}

// TestApprovalByRule: an approve_if rule asks; the answer is bound to the
// caller and the arguments by sealed state, and a client that cannot ask
// is refused.
func TestApprovalByRule(t *testing.T) {
	g, path := newGov(t, `{"version": "1", "default": "allow", "tools": {"upload_file": {"approve_if": [
		{"conditions": [{"path": "args.path", "op": "regex", "value": "\\.env$"}], "reason": "an env file"}]}}}`, nil)
	args := `{"path": "a/.env"}`
	ctx, tk, _ := g.Admit(context.Background(), Call{Tool: "upload_file", Identity: "alice", Args: json.RawMessage(args)})
	v := tk.Check(ctx, Subject{Detail: map[string]string{"path": "a/.env"}}, Approver{CanAsk: true})
	if v.Ask == nil || !strings.Contains(v.Ask.Message, "Asked because: an env file") {
		t.Fatalf("no approval asked: %+v", v)
	}
	tk.End(Outcome{})
	// The answer on other arguments is no answer: asked again.
	ctx, tk, _ = g.Admit(context.Background(), Call{Tool: "upload_file", Identity: "alice", Args: json.RawMessage(`{"path": "b/.env"}`)})
	if v2 := tk.Check(ctx, Subject{}, Approver{CanAsk: true, Answer: &Answer{State: v.Ask.State, Action: "accept"}}); v2.Ask == nil {
		t.Errorf("an answer for other arguments was taken: %+v", v2)
	}
	tk.End(Outcome{})
	ctx, tk, _ = g.Admit(context.Background(), Call{Tool: "upload_file", Identity: "alice", Args: json.RawMessage(args)})
	if v3 := tk.Check(ctx, Subject{}, Approver{CanAsk: true, Answer: &Answer{State: v.Ask.State, Action: "accept"}}); v3.Ask != nil || v3.Refusal != nil {
		t.Errorf("the genuine answer: %+v", v3)
	}
	tk.End(Outcome{Status: "ok"})
	ctx, tk, _ = g.Admit(context.Background(), Call{Tool: "upload_file", Identity: "alice", Args: json.RawMessage(args)})
	if v4 := tk.Check(ctx, Subject{}, Approver{}); v4.Refusal == nil || !strings.Contains(v4.Refusal.Message, "cannot ask the user") {
		t.Errorf("no elicitation: %+v", v4)
	}
	tk.End(Outcome{Refused: &Refusal{}})
	recs := records(t, path)
	got := []string{}
	for _, r := range recs {
		got = append(got, r.Decision)
	}
	if strings.Join(got, ",") != "approval_requested,approval_requested,approved,deny" {
		t.Errorf("decisions %v", got)
	}
}

// TestStricterApproverWins: action approve (the user) and an approve_if
// rule that wants an operator: the operator decides, told the rule's
// reason (without a console, the call is refused saying so).
func TestStricterApproverWins(t *testing.T) {
	g, _ := newGov(t, `{"version": "1", "default": "allow", "tools": {"upload_file": {"action": "approve",
		"approve_if": [{"conditions": [{"path": "args.path", "op": "exists", "value": true}], "reason": "any path", "by": "operator"}]}}}`, nil)
	ctx, tk, _ := g.Admit(context.Background(), Call{Tool: "upload_file", Identity: "alice", Args: json.RawMessage(`{"path": "x"}`)})
	v := tk.Check(ctx, Subject{}, Approver{CanAsk: true})
	if v.Ask != nil || v.Refusal == nil || !strings.Contains(v.Refusal.Message, "operator console") {
		t.Errorf("verdict %+v", v)
	}
	tk.End(Outcome{Refused: v.Refusal})
}

// TestRefusedByTheToolCounts: a call that passed the policy and that its
// tool then refused (an unknown session) counts against the limits, as
// the gateway counts a call its server answered with an error.
func TestRefusedByTheToolCounts(t *testing.T) {
	g, _ := newGov(t, `{"version": "1", "default": "allow", "tools": {"upload_file": {"limits": [{"counter": "u", "window": "hour", "max": 1}]}}}`, nil)
	ctx, tk, _ := g.Admit(context.Background(), Call{Tool: "upload_file", Identity: "alice", Args: json.RawMessage(`{}`)})
	if v := tk.Check(ctx, Subject{}, Approver{}); v.Refusal != nil {
		t.Fatal(v.Refusal)
	}
	tk.End(Outcome{Refused: &Refusal{Status: StatusInvalidRequest, Message: "Unknown session."}})
	ctx, tk, _ = g.Admit(context.Background(), Call{Tool: "upload_file", Identity: "alice", Args: json.RawMessage(`{}`)})
	if v := tk.Check(ctx, Subject{}, Approver{}); v.Refusal == nil || !strings.Contains(v.Refusal.Message, "rate limit") {
		t.Errorf("the second call: %+v", v)
	}
	tk.End(Outcome{Refused: &Refusal{}})
}

// With a rule on the code, a run's rules are decided in its own sandbox
// (the gate); what its arguments alone decide is decided before, since
// the engine installs what the run needs (packages, a Python) before its
// sandbox starts. A refused call never counts against the limits.
func TestArgumentRulesBeforeTheGate(t *testing.T) {
	doc := `{"version": "1", "default": "allow", "tools": {"run_python": {
	  "limits": [{"counter": "runs", "window": "hour", "max": 2}],
	  "deny_if": [
	    {"conditions": [{"path": "args.python_version", "op": "eq", "value": "3.13"}], "on_deny": "no 3.13 here"},
	    {"conditions": [{"path": "code.imports", "op": "contains", "value": "socket"}]}],
	  "approve_if": [{"conditions": [{"path": "args.python_version", "op": "eq", "value": "3.12"}], "reason": "3.12 needs a look"}]}}}`
	derived := 0
	pol, err := policy.Parse([]byte(doc), "p.json", testTools)
	if err != nil {
		t.Fatal(err)
	}
	g := New(Config{Policy: pol}, Sandbox{
		Facts: func(ctx context.Context, code, python string) (map[string]any, string, error) {
			derived++
			return map[string]any{"imports": []any{}}, "", nil
		},
		FromRun: func(raw json.RawMessage, code string) (map[string]any, string, error) {
			return map[string]any{"imports": []any{"socket"}}, "", nil
		},
	}, nil)
	check := func(args string) Verdict {
		ctx, tk, ref := g.Admit(context.Background(), Call{Tool: "run_python", Identity: "alice", Args: json.RawMessage(args)})
		if ref != nil {
			t.Fatalf("admit: %v", ref)
		}
		var a map[string]any
		json.Unmarshal([]byte(args), &a)
		v, _ := a["python_version"].(string)
		verdict := tk.Check(ctx, Subject{Kind: KindRun, Code: "import socket", PythonVersion: v}, Approver{})
		refused := verdict.Refusal
		if verdict.Gate != nil {
			// The run's worker reports its facts: socket, refused.
			msg := verdict.Gate(ctx, "import socket", json.RawMessage(`{}`))
			if msg == "" {
				t.Fatalf("%s: the gate let the run through", args)
			}
			refused = &Refusal{Status: StatusDenied, Message: msg}
		}
		if refused == nil && verdict.Ask != nil {
			refused = &Refusal{Status: StatusDenied, Message: "declined"}
		}
		tk.End(Outcome{Refused: refused})
		return verdict
	}
	// Refused on its arguments before any sandbox: no gate.
	v := check(`{"code": "import socket", "python_version": "3.13"}`)
	if v.Gate != nil || v.Refusal == nil || !strings.Contains(v.Refusal.Message, "no 3.13 here") {
		t.Fatalf("3.13: %+v", v)
	}
	// An approval on the arguments alone is asked before anything: the
	// facts come from a sandbox of their own, not the gate.
	v = check(`{"code": "import socket", "python_version": "3.12"}`)
	if v.Gate != nil || derived != 1 {
		t.Fatalf("3.12: gate %v, facts derived %d times", v.Gate != nil, derived)
	}
	// Otherwise the gate decides; refused there, the call gives its
	// place in the limits back: two more calls still fit in the hour.
	for i := range 3 {
		v = check(`{"code": "import socket", "python_version": "3.11"}`)
		if v.Gate == nil {
			t.Fatalf("call %d: %+v, want a gate", i, v)
		}
	}
}
