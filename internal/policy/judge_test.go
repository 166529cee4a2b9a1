package policy

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func args(t *testing.T, s string) map[string]any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader([]byte(s)))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestOperators checks each operator as the gateway defines it, types
// included: numbers compare as numbers (exactly, past 2^53), a numeric
// string is not a number, a missing or null path is false for all but
// exists.
func TestOperators(t *testing.T) {
	cases := []struct {
		op    string
		value string // JSON
		args  string
		want  bool
	}{
		{"eq", `5`, `{"x": 5.0}`, true},
		{"eq", `5`, `{"x": "5"}`, true}, // the gateway compares texts when not both numbers
		{"eq", `"usd"`, `{"x": "usd"}`, true},
		{"eq", `true`, `{"x": true}`, true},
		{"eq", `9007199254740993`, `{"x": 9007199254740992}`, false},
		{"eq", `"a"`, `{}`, false},
		{"neq", `"a"`, `{"x": "b"}`, true},
		{"neq", `"a"`, `{}`, false},
		{"neq", `"a"`, `{"x": null}`, false},
		{"lt", `10`, `{"x": 9.5}`, true},
		{"lt", `10`, `{"x": 10}`, false},
		{"lte", `10`, `{"x": 10}`, true},
		{"gt", `10`, `{"x": 1e3}`, true},
		{"gte", `10`, `{"x": "11"}`, false}, // a numeric string is not a number
		{"gt", `-1`, `{"x": -0.5}`, true},
		{"in", `["usd", "eur"]`, `{"x": "eur"}`, true},
		{"in", `["usd", "eur"]`, `{"x": "gbp"}`, false},
		{"in", `[1, 2]`, `{"x": 2.0}`, true},
		{"not_in", `["usd", "eur"]`, `{"x": "gbp"}`, true},
		{"not_in", `["usd"]`, `{}`, false},
		{"regex", `"\\.env$"`, `{"x": "config/.env"}`, true},
		{"regex", `"env"`, `{"x": "an environment"}`, true}, // unanchored
		{"regex", `"^a"`, `{"x": 1}`, false},
		{"contains", `".."`, `{"x": "../etc/passwd"}`, true},
		{"contains", `"b"`, `{"x": ["a", "b"]}`, true},
		{"contains", `3`, `{"x": [1, 2, 3.0]}`, true},
		{"contains", `"z"`, `{"x": {"z": 1}}`, false},
		{"exists", `true`, `{"x": 0}`, true},
		{"exists", `true`, `{"x": null}`, false},
		{"exists", `false`, `{}`, true},
		{"exists", `false`, `{"x": ""}`, false},
	}
	for _, c := range cases {
		var v any
		dec := json.NewDecoder(strings.NewReader(c.value))
		dec.UseNumber()
		if err := dec.Decode(&v); err != nil {
			t.Fatal(err)
		}
		doc := map[string]any{"version": "1", "default": "allow", "tools": map[string]any{"run_python": map[string]any{
			"deny_if": []any{map[string]any{"conditions": []any{map[string]any{"path": "args.x", "op": c.op, "value": v}}}}}}}
		raw, _ := json.Marshal(doc)
		p, err := Parse(raw, "p.json", condTools)
		if err != nil {
			t.Fatalf("%s %s: %v", c.op, c.value, err)
		}
		got := p.Judge("run_python", Facts{Args: args(t, c.args)}).Deny
		if got != c.want {
			t.Errorf("args %s: x %s %s = %v, want %v", c.args, c.op, c.value, got, c.want)
		}
	}
}

// TestRuleCombination: every require must hold and no deny_if match; a
// rule holds when all its conditions do; approve_if asks only when
// nothing denies; nested paths and code facts are reached.
func TestRuleCombination(t *testing.T) {
	const doc = `
version: "1"
default: deny
tools:
  upload_file:
    require:
      - conditions:
          - {path: args.path, op: regex, value: "^[a-z./_-]+$"}
        on_deny: "paths are lower case"
    deny_if:
      - conditions:
          - {path: args.path, op: contains, value: ".."}
          - {path: args.meta.kind, op: eq, value: secret}
        on_deny: "no secrets outside the tree"
    approve_if:
      - conditions: [{path: args.path, op: regex, value: "\\.env$"}]
        reason: "an .env file"
        by: operator
  run_python:
    approve_if:
      - conditions: [{path: code.imports, op: contains, value: subprocess}]
      - conditions: [{path: code.dynamic_code, op: exists, value: true}]
`
	p, err := Parse([]byte(doc), "p.yaml", condTools)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args    string
		deny    bool
		approve bool
		reason  string
	}{
		{`{"path": "a/b.txt"}`, false, false, ""},
		{`{"path": "A.txt"}`, true, false, "paths are lower case"},
		{`{}`, true, false, "paths are lower case"},
		{`{"path": "../x", "meta": {"kind": "secret"}}`, true, false, "no secrets outside the tree"},
		{`{"path": "../x", "meta": {"kind": "public"}}`, false, false, ""},
		{`{"path": "app/.env"}`, false, true, "an .env file"},
	} {
		j := p.Judge("upload_file", Facts{Args: args(t, c.args)})
		if j.Deny != c.deny || j.Approve != c.approve || (c.reason != "" && j.Reason != c.reason) {
			t.Errorf("upload_file %s: %+v", c.args, j)
		}
		if j.Approve && j.By != ApproveByOperator {
			t.Errorf("by = %q", j.By)
		}
	}
	if !p.NeedsCode("run_python") || p.NeedsCode("upload_file") {
		t.Error("NeedsCode")
	}
	code := map[string]any{"imports": []any{"os", "subprocess"}, "dynamic_code": nil}
	j := p.Judge("run_python", Facts{Args: map[string]any{}, Code: code})
	if !j.Approve || j.By != ApproveByUser || !strings.Contains(j.Reason, "code.imports contains subprocess") {
		t.Errorf("run_python with subprocess: %+v", j)
	}
	j = p.Judge("run_python", Facts{Code: map[string]any{"imports": []any{"os"}, "dynamic_code": []any{"exec"}}})
	if !j.Approve || j.Rule.Field() != "tools.run_python.approve_if[1]" {
		t.Errorf("run_python with exec: %+v", j)
	}
	if j := p.Judge("run_python", Facts{Code: map[string]any{"imports": []any{"os"}}}); j.Approve || j.Deny {
		t.Errorf("plain run_python: %+v", j)
	}
}

// TestNumbersTooLongToCompare: a number too long or too large to compare
// exactly (which would cost seconds, or read as no number at all) makes
// its rule fail closed: require and deny_if refuse, approve_if asks.
func TestNumbersTooLongToCompare(t *testing.T) {
	p, err := Parse([]byte(`{"version":"1","default":"allow","tools":{
		"run_python":{"deny_if":[{"conditions":[{"path":"args.timeout_seconds","op":"gt","value":60}]}]},
		"upload_file":{"require":[{"conditions":[{"path":"args.n","op":"lte","value":10}]}]},
		"check_environment":{"approve_if":[{"conditions":[{"path":"args.n","op":"in","value":[1,2]}]}]}}}`), "p.json", condTools)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"61." + strings.Repeat("0", 1_000_000), "1e-1000000", "1" + strings.Repeat("0", 100)} {
		start := time.Now()
		f := Facts{Args: args(t, `{"timeout_seconds": `+n+`, "n": `+n+`}`)}
		if j := p.Judge("run_python", f); !j.Deny || !strings.Contains(j.Reason, "too long or too large") {
			t.Errorf("deny_if on %.20s...: %+v", n, j)
		}
		if j := p.Judge("upload_file", f); !j.Deny {
			t.Errorf("require on %.20s...: %+v", n, j)
		}
		if j := p.Judge("check_environment", f); !j.Approve {
			t.Errorf("approve_if on %.20s...: %+v", n, j)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("judging %.20s... took %v", n, d)
		}
	}
	if j := p.Judge("run_python", Facts{Args: args(t, `{"timeout_seconds": 5.0}`)}); j.Deny {
		t.Errorf("a plain number: %+v", j)
	}
}
