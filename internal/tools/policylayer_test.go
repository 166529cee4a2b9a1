package tools

import (
	"bytes"
	"encoding/json"
	"log/slog"

	"context"
	"github.com/pysandbox/pysandbox/internal/policy"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestPolicyLayerDocument loads examples/policylayer.json, a policy in
// the gateway's format, and checks that it means here what the gateway's
// documentation says: hidden and unlisted tools are gone, require and
// deny_if refuse with their on_deny, and the all_tools limit counts the
// calls of every tool that passed its rules, and only those.
func TestPolicyLayerDocument(t *testing.T) {
	doc, err := os.ReadFile("../../examples/policylayer.json")
	if err != nil {
		t.Fatal(err)
	}
	g := newGovServer(t, string(doc), nil)
	cs := g.connect(nil, nil)
	lt, err := cs.ListTools(context.Background(), nil)
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
	refused := func(name string, args map[string]any, want string) {
		t.Helper()
		res, out := call(t, cs, name, args)
		// Hidden tools too: a client has no schema for them, but a
		// refusal's structured result is its status and message.
		// check_environment's output has no status: its refusal is text.
		if !res.IsError || !strings.Contains(text(res), want) || name != "check_environment" && (out["status"] != "denied" || out["message"] != text(res)) || name == "check_environment" && out != nil {
			t.Errorf("%s %v: %v %s %v", name, args, res.IsError, text(res), out)
		}
		// Nothing ran: a refused run has no exit status of its own.
		if name == "run_python" && out["exit_code"] != -1.0 {
			t.Errorf("%s %v: exit_code %v, want -1", name, args, out["exit_code"])
		}
	}
	refused("install_package", map[string]any{"session_id": "s", "packages": []string{"x"}}, "hides it")
	refused("list_sessions", nil, "default: deny")
	refused("run_python", map[string]any{"code": "print(1)"}, "Runs must set timeout_seconds, at most 60.")
	refused("run_python", map[string]any{"code": "print(1)", "timeout_seconds": 61}, "Runs must set timeout_seconds, at most 60.")
	refused("run_python", map[string]any{"code": "import os\nos.system('RM  -rf /')", "timeout_seconds": 5}, "Destructive shell commands are not allowed.")
	refused("run_python", map[string]any{"code": "print(1)", "timeout_seconds": 5, "python_version": "3.6"}, "End-of-life Python versions are not allowed.")
	refused("upload_file", map[string]any{"session_id": "s", "path": "../x", "content": "x"}, "Paths must stay inside the workspace.")

	// Five calls a minute in all, whichever tools: none of the refused
	// calls above counted.
	for i := range 3 {
		res, out := call(t, cs, "run_python", map[string]any{"code": "print(" + string(rune('1'+i)) + ")", "timeout_seconds": 5})
		if res.IsError || out["status"] != "success" {
			t.Fatalf("allowed run %d: %s", i, text(res))
		}
	}
	for i := range 2 {
		if res, _ := call(t, cs, "check_environment", map[string]any{}); res.IsError && strings.Contains(text(res), "rate") {
			t.Fatalf("check_environment %d: %s", i, text(res))
		}
	}
	refused("check_environment", nil, `"all_calls_per_minute": 5 per minute`)
	refused("run_python", map[string]any{"code": "print(9)", "timeout_seconds": 5}, `"all_calls_per_minute": 5 per minute`)

	recs := g.records(t)
	byReason := map[string]string{}
	for _, r := range recs {
		if r.Decision == "deny" {
			byReason[r.Reason] = r.Detail["rule"]
		}
	}
	for reason, rule := range map[string]string{
		"Runs must set timeout_seconds, at most 60.":   "tools.run_python.require[0]",
		"Destructive shell commands are not allowed.":  "tools.run_python.deny_if[0]",
		"End-of-life Python versions are not allowed.": "tools.run_python.deny_if[1]",
		"Paths must stay inside the workspace.":        "tools.upload_file.deny_if[0]",
		"the policy hides it (hide)":                   "",
	} {
		got, ok := byReason[reason]
		if !ok || got != rule {
			t.Errorf("record of %q: rule %q (present %v)", reason, got, ok)
		}
	}
}

// TestApproveIf: an argument condition asks the user instead of refusing
// (here: uploads of .env files), and the prompt says why; other uploads
// go through without asking.
func TestApproveIf(t *testing.T) {
	g := newGovServer(t, `{"version": "1", "default": "allow", "tools": {"upload_file": {"approve_if": [
		{"conditions": [{"path": "args.path", "op": "regex", "value": "(^|/)\\.env$"}], "reason": "it writes an .env file"}]}}}`, nil)
	el := &elicitor{action: "decline"}
	cs := g.connect(&mcp.ClientOptions{ElicitationHandler: el.handler}, nil)
	_, out := call(t, cs, "create_session", nil)
	id, _ := out["session_id"].(string)
	if res, _ := call(t, cs, "upload_file", map[string]any{"session_id": id, "path": "data.csv", "content": "a,b\n"}); res.IsError {
		t.Fatalf("plain upload: %s", text(res))
	}
	if n := len(el.asked()); n != 0 {
		t.Fatalf("asked %d times for a plain upload", n)
	}
	res, _ := call(t, cs, "upload_file", map[string]any{"session_id": id, "path": "app/.env", "content": "KEY=1\n"})
	if !res.IsError || !strings.Contains(text(res), "did not approve") {
		t.Fatalf("declined .env upload: %s", text(res))
	}
	asked := el.asked()
	if len(asked) != 1 || !strings.Contains(asked[0], "Asked because: it writes an .env file") || !strings.Contains(asked[0], `"path": "app/.env"`) {
		t.Fatalf("asked: %q", asked)
	}
	recs := g.records(t)
	last := recs[len(recs)-1]
	if last.Decision != "declined" || last.Detail["rule"] != "tools.upload_file.approve_if[0]" {
		t.Errorf("record %+v", last)
	}
}

// TestCodeAwareApproval: a rule on the facts Python's parser derives from
// the code (in a sandbox, without running it) asks the user when the code
// imports subprocess or uses dynamic code, obfuscated or not; the prompt
// and the record show the facts that decided; other code runs unasked.
func TestCodeAwareApproval(t *testing.T) {
	g := newGovServer(t, `{"version": "1", "default": "allow", "tools": {"run_python": {"approve_if": [
		{"conditions": [{"path": "code.imports", "op": "contains", "value": "subprocess"}], "reason": "the code starts processes"},
		{"conditions": [{"path": "code.dynamic_code", "op": "exists", "value": true}], "reason": "the code runs code it builds"}]}}}`, nil)
	el := &elicitor{action: "decline"}
	cs := g.connect(&mcp.ClientOptions{ElicitationHandler: el.handler}, nil)
	if res, out := call(t, cs, "run_python", map[string]any{"code": "import json\nprint(json.dumps([1]))"}); res.IsError || out["stdout"] != "[1]\n" {
		t.Fatalf("plain run: %s", text(res))
	}
	if n := len(el.asked()); n != 0 {
		t.Fatalf("asked %d times for plain code", n)
	}
	for i, c := range []struct{ code, why string }{
		{"import subprocess\nsubprocess.run(['id'])", "the code starts processes"},
		{"getattr(__builtins__, 'ex' + 'ec')('print(1)')", "the code runs code it builds"},
		{"import base64\nexec(base64.b64decode('cHJpbnQoMSk=').decode())", "the code runs code it builds"},
		{"import importlib\nimportlib.import_module('o' + 's')", "the code runs code it builds"},
	} {
		res, _ := call(t, cs, "run_python", map[string]any{"code": c.code})
		if !res.IsError || !strings.Contains(text(res), "did not approve") {
			t.Fatalf("%q: %s", c.code, text(res))
		}
		asked := el.asked()
		if len(asked) != i+1 || !strings.Contains(asked[i], "Asked because: "+c.why) || !strings.Contains(asked[i], "What the code does") {
			t.Fatalf("%q: asked %q", c.code, asked)
		}
	}
	recs := g.records(t)
	last := recs[len(recs)-1]
	if last.Decision != "declined" || last.Detail["rule"] != "tools.run_python.approve_if[1]" || !strings.Contains(last.Detail["code_facts"], "importlib") {
		t.Errorf("record %+v", last)
	}
}

// TestRuleWarningsAtStart: rules that can never take effect on this
// server are logged when it starts: an argument the tool does not have,
// facts of code on a tool that runs none, an operator's approval
// without a console.
func TestRuleWarningsAtStart(t *testing.T) {
	pol, err := policy.Parse([]byte(`{"version": "1", "default": "allow", "tools": {
		"run_python": {"require": [{"conditions": [{"path": "args.timeout", "op": "lte", "value": 60}]}],
		               "deny_if": [{"conditions": [{"path": "args.timeoutt", "op": "exists", "value": false}]},
		                           {"conditions": [{"path": "args.timeout_seconds", "op": "gt", "value": 60}, {"path": "args.sesion_id", "op": "exists", "value": false}]},
		                           {"conditions": [{"path": "args.a", "op": "exists", "value": false}, {"path": "args.b", "op": "exists", "value": false}]}],
		               "approve_if": [{"conditions": [{"path": "args.c", "op": "exists", "value": false}], "by": "operator"}]},
		"upload_file": {"deny_if": [{"conditions": [{"path": "code.imports", "op": "contains", "value": "os"}]}],
		                "approve_if": [{"conditions": [{"path": "args.path", "op": "exists", "value": true}], "by": "operator"}]}}}`), "p.json", Names)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	newServer(t, nil, func(o *Options) {
		o.Governance = Governance{Policy: pol}
		o.Logger = slog.New(slog.NewTextHandler(&buf, nil))
	})
	logs := buf.String()
	for _, want := range []string{
		// A require rule that never holds refuses every call: the log
		// must not say it never takes effect (a new user's typo).
		`msg="policy rule refuses every call" rule=tools.run_python.require[0].conditions[0].path why="run_python has no argument \"timeout\" (its arguments are code, dependencies, inputs, python_version, session_id, timeout_seconds): the condition never holds, so the rule never does, and every run_python call is refused"`,
		`msg="policy rule refuses every call" rule=tools.run_python.deny_if[0].conditions[0].path why="run_python has no argument \"timeoutt\"`,
		`msg="policy condition tests nothing" rule=tools.run_python.deny_if[1].conditions[1].path`,
		// Every condition fixed: the rule as a whole.
		`msg="policy rule refuses every call" rule=tools.run_python.deny_if[2].conditions[0].path`,
		// An operator's approval without a console refuses.
		`msg="policy rule refuses every call" rule=tools.run_python.approve_if[0].conditions[0].path why="run_python has no argument \"c\" (its arguments are code, dependencies, inputs, python_version, session_id, timeout_seconds): the condition holds for every call, so every run_python call needs an operator's approval`,
		`msg="policy rule never takes effect" rule=tools.upload_file.deny_if[0].conditions[0].path why="upload_file runs no code, so code facts are never there: the condition never holds, so the rule never matches"`,
		`rule=tools.upload_file.approve_if[0] why="an operator must approve, and this server has no console`,
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("the log lacks %s:\n%s", want, logs)
		}
	}
}

// TestPathRulesSeeTheToolsPath: rules on a file's path see the path the
// tool uses, however it was written (.env/ and ./.env/. are .env), and
// they apply to resources/read of the same files.
func TestPathRulesSeeTheToolsPath(t *testing.T) {
	g := newGovServer(t, `{"version": "1", "default": "allow", "tools": {
		"upload_file": {"approve_if": [{"conditions": [{"path": "args.path", "op": "regex", "value": "(^|/)\\.env$"}], "reason": "an env file"}]},
		"download_file": {"deny_if": [{"conditions": [{"path": "args.path", "op": "regex", "value": "secret"}], "on_deny": "no secrets"}]}}}`, nil)
	el := &elicitor{action: "decline"}
	cs := g.connect(&mcp.ClientOptions{ElicitationHandler: el.handler}, nil)
	_, out := call(t, cs, "create_session", nil)
	id, _ := out["session_id"].(string)
	for i, p := range []string{".env/", "./.env/.", "a/../.env"} {
		res, _ := call(t, cs, "upload_file", map[string]any{"session_id": id, "path": p, "content": "K=1"})
		if !res.IsError || len(el.asked()) != i+1 {
			t.Errorf("upload to %q: %s (asked %d times)", p, text(res), len(el.asked()))
		}
	}
	if res, _ := call(t, cs, "upload_file", map[string]any{"session_id": id, "path": "secret.txt", "content": "s"}); res.IsError {
		t.Fatal(text(res))
	}
	if res, _ := call(t, cs, "download_file", map[string]any{"session_id": id, "path": "./secret.txt"}); !res.IsError || !strings.Contains(text(res), "no secrets") {
		t.Errorf("download_file: %s", text(res))
	}
	_, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: FileURI(id, "secret.txt")})
	if err == nil || !strings.Contains(err.Error(), "no secrets") {
		t.Errorf("resources/read of secret.txt: %v", err)
	}
}

// TestExactArgumentNames: a key that differs from an argument's name
// only in case (or by Unicode folding) does not reach the tool, since
// the policy's rules, reading keys as sent, would not see it.
func TestExactArgumentNames(t *testing.T) {
	type in struct {
		Script string `json:"script"`
	}
	tool := &mcp.Tool{Name: "t", InputSchema: map[string]any{"type": "object", "properties": map[string]any{"script": map[string]any{"type": "string"}}}}
	sc, err := schemasFor[in, any](tool)
	if err != nil {
		t.Fatal(err)
	}
	got, ref := decodeInput[in]("t", json.RawMessage(`{"script": "print(1)", "Script": "import subprocess", "ſcript": "x"}`), sc)
	if ref != nil || got.Script != "print(1)" {
		t.Errorf("decoded %+v (%v)", got, ref)
	}
}

func TestArgumentOutOfRange(t *testing.T) {
	type in struct {
		N float64 `json:"n"`
	}
	tool := &mcp.Tool{Name: "t"}
	sc, err := schemasFor[in, any](tool)
	if err != nil {
		t.Fatal(err)
	}
	_, ref := decodeInput[in]("t", json.RawMessage(`{"n": 1e400}`), sc)
	if ref == nil || !strings.Contains(ref.Message, "64-bit float") {
		t.Errorf("%+v", ref)
	}
}

// TestReplyBoundsHold: an error whose text the run inflated (escaped on
// the wire, or past the worker's bounds, which code in the run can
// change) is cut to the reply budget; an argument refusal does not echo
// a huge value; and what a caller reads is marked private to it.
func TestReplyBoundsHold(t *testing.T) {
	cs := connect(t, nil)
	res, _ := call(t, cs, "run_python", map[string]any{"code": "raise ValueError('\\x01' * 40000)"})
	raw, _ := json.Marshal(res)
	if len(raw) > 150<<10 {
		t.Errorf("an error of escaped characters made a reply of %d bytes", len(raw))
	}
	res, _ = call(t, cs, "run_python", map[string]any{"code": "x", "timeout_seconds": json.Number("1" + strings.Repeat("0", 400) + "e-390")})
	if raw, _ := json.Marshal(res); len(raw) > 8<<10 {
		t.Errorf("a refusal of %d bytes", len(raw))
	}
}

// TestSessionOutputRotates: a session keeps the whole output of its last
// keptRuns runs only, so chatty runs cannot fill its workspace unseen.
func TestSessionOutputRotates(t *testing.T) {
	cs := connect(t, nil)
	_, out := call(t, cs, "create_session", nil)
	id, _ := out["session_id"].(string)
	for i := range keptRuns + 3 {
		if _, o := call(t, cs, "run_python", map[string]any{"session_id": id, "code": "print('x' * 60000, " + strconv.Itoa(i) + ")"}); o["stdout_uri"] == nil {
			t.Fatalf("run %d kept no output: %v", i, o["message"])
		}
	}
	_, out = call(t, cs, "run_python", map[string]any{"session_id": id, "code": "import os\nsorted(os.listdir('/work/.pysandbox/output'))"})
	files, _ := out["return_value"].([]any)
	if len(files) != keptRuns {
		t.Errorf("kept %d files: %v", len(files), files)
	}
}

// TestReplyBudgetIsWhatTheModelReads: the budget counts what a client
// decodes, so output of '<' and '&' under --max-reply-output is shown
// whole; a display's Markdown is in the structured result too, for the
// clients that give the model only that.
func TestReplyBudgetIsWhatTheModelReads(t *testing.T) {
	cs := connect(t, nil)
	_, out := call(t, cs, "run_python", map[string]any{"code": "print('<tr><td>1</td><td>a &amp; b</td></tr>\\n' * 500, end='')"})
	if s, _ := out["stdout"].(string); len(s) != 19000 || out["stdout_truncated"] == true {
		t.Errorf("19 000 bytes of HTML: %d shown (truncated %v, %v)", len(s), out["stdout_truncated"], out["message"])
	}
	_, out = call(t, cs, "run_python", map[string]any{"code": "from IPython.display import display, Markdown\ndisplay(Markdown('# Title\\n* a < b'))"})
	ds, _ := out["displays"].([]any)
	if len(ds) != 1 {
		t.Fatalf("displays: %v", out["displays"])
	}
	d, _ := ds[0].(map[string]any)
	if d["source"] != "# Title\n* a < b" || d["source_type"] != "text/markdown" {
		t.Errorf("the display in the structured result: %v", d)
	}
}
