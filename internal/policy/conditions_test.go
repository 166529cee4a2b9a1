package policy

import (
	"strings"
	"testing"
)

var condTools = []string{"run_python", "upload_file", "check_environment", "gh.*"}

func TestRuleErrors(t *testing.T) {
	for _, c := range []struct{ doc, want string }{
		{`{"version":"1","hide":["nope"]}`, "hide[0]: this server has no such tool"},
		{`{"version":"1","hide":["run_python","run_python"]}`, `hide[1]: duplicate entry "run_python"`},
		{`{"version":"1","hide":[""]}`, "hide[0]: entry must not be empty"},
		{`{"version":"1","all_tools":{"limit":[]}}`, "all_tools.limit: unknown field"},
		{`{"version":"1","all_tools":{"limits":[{"counter":"a","window":"week","max":1}]}}`, "all_tools.limits[0].window"},
		{`{"version":"1","tools":{"run_python":{"require":[{"conditions":[{"path":"x.y","op":"eq","value":1}]}]}}}`, "tools.run_python.require[0].conditions[0].path"},
		{`{"version":"1","tools":{"run_python":{"require":[{"conditions":[{"path":"code.secrets","op":"eq","value":1}]}]}}}`, `"secrets" is not a fact of code`},
		{`{"version":"1","tools":{"run_python":{"deny_if":[{"conditions":[{"path":"args.a","op":"like","value":1}]}]}}}`, `"like" is not an operator`},
		{`{"version":"1","tools":{"run_python":{"deny_if":[{"conditions":[{"path":"args.a","op":"lt","value":"5"}]}]}}}`, `operator "lt" needs a number`},
		{`{"version":"1","tools":{"run_python":{"deny_if":[{"conditions":[{"path":"args.a","op":"in","value":"x"}]}]}}}`, `operator "in" needs a list`},
		{`{"version":"1","tools":{"run_python":{"deny_if":[{"conditions":[{"path":"args.a","op":"regex","value":"("}]}]}}}`, `invalid regex`},
		{`{"version":"1","tools":{"run_python":{"deny_if":[{"conditions":[{"path":"args.a","op":"exists","value":"yes"}]}]}}}`, `needs true or false`},
		{`{"version":"1","tools":{"run_python":{"deny_if":[{"conditions":[{"path":"args.a","op":"eq"}]}]}}}`, `value: missing`},
		{`{"version":"1","tools":{"run_python":{"require":[{"on_deny":"x"}]}}}`, `conditions: missing`},
		{`{"version":"1","tools":{"run_python":{"approve_if":[{"conditions":[{"path":"args.a","op":"eq","value":1}],"by":"boss"}]}}}`, `"boss" is not who approves`},
		{`{"version":"1","tools":{"run_python":{"deny_if":[{"conditions":[],"reason":"x"}]}}}`, `deny_if[0].reason: unknown field`},
	} {
		_, err := Parse([]byte(c.doc), "p.json", condTools)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want %q", c.doc, err, c.want)
		}
	}
	// An empty deny_if rule is the gateway's unconditional deny.
	p, err := Parse([]byte(`{"version":"1","default":"allow","tools":{"run_python":{"deny_if":[{"conditions":[],"on_deny":"Requires human approval."}]}}}`), "p.json", condTools)
	if err != nil {
		t.Fatal(err)
	}
	if j := p.Judge("run_python", Facts{}); !j.Deny || j.Reason != "Requires human approval." {
		t.Errorf("empty deny_if: %+v", j)
	}
}

// TestListFactOperators: a list fact of code takes only contains and
// exists; the others would compare the list's text.
func TestListFactOperators(t *testing.T) {
	for _, op := range []string{"eq", "neq", "in", "not_in", "regex", "lt"} {
		val := `"socket"`
		switch op {
		case "in", "not_in":
			val = `["socket"]`
		case "lt":
			val = `1`
		}
		_, err := Parse([]byte(`{"version":"1","tools":{"run_python":{"deny_if":[{"conditions":[{"path":"code.imports","op":"`+op+`","value":`+val+`}]}]}}}`), "p.json", condTools)
		if err == nil || !strings.Contains(err.Error(), "is a list of names") {
			t.Errorf("%s on code.imports: %v", op, err)
		}
	}
	if _, err := Parse([]byte(`{"version":"1","tools":{"run_python":{"deny_if":[{"conditions":[{"path":"code.lines","op":"gt","value":100}]}]}}}`), "p.json", condTools); err != nil {
		t.Errorf("gt on code.lines: %v", err)
	}
}

func TestRuleWarnings(t *testing.T) {
	p, err := Parse([]byte(`{"version":"1","hide":["upload_file"],"tools":{
		"run_python":{"action":"deny","deny_if":[{"conditions":[]}]},
		"upload_file":{"require":[{"conditions":[{"path":"args.path","op":"exists","value":true}]}]},
		"check_environment":{"action":"approve","approve_if":[{"conditions":[{"path":"args.x","op":"exists","value":true}]}]}}}`), "p.json", condTools)
	if err != nil {
		t.Fatal(err)
	}
	w := strings.Join(p.Warnings, "\n")
	for _, want := range []string{"tools.run_python: its require", "tools.upload_file: its require", "tools.check_environment.approve_if: every call is approved"} {
		if !strings.Contains(w, want) {
			t.Errorf("warnings lack %q:\n%s", want, w)
		}
	}
}
