package policy

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// TestStrictAttacks: the ways a policy file said one thing to its reader
// and another to the server (issue 27) are each refused, naming the line.
func TestStrictAttacks(t *testing.T) {
	for _, tc := range []struct {
		name, file, doc, want string
	}{
		{"second document", "p.yaml", `version: "1"
default: deny
tools:
  run_python: {action: deny}
---
tools:
  run_python: {action: approve}
`, "policy p.yaml: line 5: a second YAML document"},
		{"empty trailing document", "p.yaml", "version: \"1\"\ndefault: deny\n---\n", "policy p.yaml: line 3: a second YAML document"},
		{"merge key sets the default", "p.yaml", "version: \"1\"\n<<: {default: allow}\n", "policy p.yaml: line 2: << is YAML's merge key"},
		{"merge key doubles a tool", "p.yaml", `version: "1"
default: deny
tools:
  run_python: {action: deny}
  <<: {run_python: {action: allow}}
`, "policy p.yaml: line 5: tools: << is YAML's merge key"},
		{"custom tag", "p.yaml", "version: \"1\"\ndefault: !custom allow\n", "policy p.yaml: line 2: default: a tag (!custom)"},
		{"explicit tag", "p.yaml", "version: !!str 1\n", "policy p.yaml: line 1: version: a tag (!!str)"},
		{"anchor and alias", "p.yaml", `version: "1"
tools:
  run_python: &open {action: allow}
  install_package: *open
`, "policy p.yaml: line 3: tools.run_python: an anchor (&open)"},
		{"tool twice", "p.yaml", `version: "1"
default: deny
tools:
  run_python:
    action: deny
  install_package: {action: approve}
  run_python:
    action: allow
`, "policy p.yaml: line 7: tools.run_python: the key appears twice (already defined at line 4)"},
		{"tool twice in JSON", "p.json", `{
  "version": "1",
  "tools": {
    "run_python": {"action": "deny"},
    "run_python": {"action": "allow"}
  }
}`, "policy p.json: line 5: tools.run_python: the key appears twice (already defined at line 4)"},
		{"field in capitals", "p.yaml", "version: \"1\"\nDefault: allow\n", "policy p.yaml: line 2: Default: unknown field"},
		{"field in capitals JSON", "p.json", "{\"version\": \"1\",\n\"DEFAULT\": \"allow\"}", "policy p.json: line 2: DEFAULT: unknown field"},
		{"hex number", "p.yaml", "version: \"1\"\ntools:\n  run_python:\n    limits:\n      - {counter: c, window: minute, max: 0x10}\n", "policy p.yaml: line 5: tools.run_python.limits[0].max: 0x10 is a number"},
		{"pin to 0.0.0.0", "p.yaml", "version: \"1\"\nnetwork:\n  allow:\n    - api.example.com\n    - files.corp:443=0.0.0.0\n", `policy p.yaml: line 5: network.allow[1]: "files.corp:443=0.0.0.0": 0.0.0.0 is the unspecified address`},
		{"pin to ::", "p.json", "{\"version\": \"1\",\n \"network\": {\"allow\": [\"files.corp=[::]\"]}}", `policy p.json: line 2: network.allow[0]: "files.corp=[::]": :: is the unspecified address`},
		{"pin to mapped 0.0.0.0", "p.yaml", "version: \"1\"\nnetwork: {approve: [\"files.corp=::ffff:0.0.0.0\"]}\n", `policy p.yaml: line 2: network.approve[0]: "files.corp=::ffff:0.0.0.0": ::ffff:0.0.0.0 is the unspecified address`},
		// Validation errors name the line of the field too.
		{"bad window YAML", "p.yaml", `version: "1"
tools:
  run_python:
    limits:
      - counter: runs
        window: fortnight
        max: 3
`, `policy p.yaml: line 6: tools.run_python.limits[0].window: "fortnight" is not a window`},
		{"missing counter JSON", "p.json", "{\"version\": \"1\", \"tools\": {\"run_python\": {\"limits\": [\n  {\"window\": \"minute\", \"max\": 1}]}}}", "policy p.json: line 2: tools.run_python.limits[0].counter: want a counter name"},
		{"unknown tool", "p.yaml", "version: \"1\"\n\ntools:\n  run_pyton: {action: deny}\n", "policy p.yaml: line 4: tools.run_pyton: this server has no such tool"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Parse([]byte(tc.doc), tc.file, testTools)
			if err == nil {
				t.Fatalf("accepted:\n%s\nas %+v", tc.doc, p)
			}
			var pe *Error
			if !errors.As(err, &pe) || pe.Line == 0 {
				t.Errorf("%T %+v: want a *policy.Error with a line", err, err)
			}
			if !strings.HasPrefix(err.Error(), tc.want) {
				t.Errorf("error\n%s\nwant it to begin\n%s", err, tc.want)
			}
		})
	}
}

// TestSameInJSONAndYAML: the same content in either format is the same
// policy.
func TestSameInJSONAndYAML(t *testing.T) {
	j := `{
  "version": 1,
  "default": "deny",
  "tools": {
    "run_python": {"action": "allow", "limits": [{"counter": "runs", "window": "minute", "max": 10, "scope": "grant"}]},
    "install_package": {"action": "approve", "by": "operator", "reason": "installs are reviewed"},
    "validate_script": {"action": "deny", "reason": "not needed here"},
    "create_session": {"limits": [{"counter": "sessions", "window": "hour", "max": 3}]}
  },
  "packages": {"allow": ["numpy", "pandas*"], "deny": ["*miner*"]},
  "quotas": {"runs": 2, "identities": {"ci": {"runs": 8, "queue": 0}}},
  "network": {"allow": ["files.corp:443=10.0.0.5", "*.github.com:443"], "deny": ["gist.github.com"], "limits": {"bytes_in": 1048576, "connection_seconds": 60}}
}`
	y := `# the same policy, in YAML
version: 1
default: deny
tools:
  run_python:
    action: allow
    limits:
      - {counter: runs, window: minute, max: 10, scope: grant}
  install_package: {action: approve, by: operator, reason: installs are reviewed}
  validate_script:
    action: deny
    reason: "not needed here"
  create_session:
    limits: [{counter: sessions, window: hour, max: 3}]
packages:
  allow: [numpy, pandas*]
  deny: ["*miner*"]
quotas:
  runs: 2
  identities:
    ci: {runs: 8, queue: 0}
network:
  allow:
    - files.corp:443=10.0.0.5
    - "*.github.com:443"
  deny: [gist.github.com]
  limits: {bytes_in: 1048576, connection_seconds: 60}
`
	pj, err := Parse([]byte(j), "p.json", testTools)
	if err != nil {
		t.Fatal(err)
	}
	py, err := Parse([]byte(y), "p.yaml", testTools)
	if err != nil {
		t.Fatal(err)
	}
	// The same JSON read as YAML (a .yaml name) is the same policy too.
	pjy, err := Parse([]byte(j), "p.yaml", testTools)
	if err != nil {
		t.Fatal(err)
	}
	pj.SHA256, py.SHA256, pjy.SHA256 = "", "", ""
	if !reflect.DeepEqual(pj, py) || !reflect.DeepEqual(pj, pjy) {
		t.Errorf("JSON and YAML differ:\n%+v\n%+v\n%+v", pj, py, pjy)
	}
	if pj.Network == nil || len(pj.Network.Allow) != 2 || pj.Quotas == nil || pj.Quotas.Identities["ci"].Runs != 8 {
		t.Errorf("the test's policy did not parse as meant: %+v", pj)
	}
}

// TestErrorWithoutLine: an error about the whole file reads as before.
func TestErrorWithoutLine(t *testing.T) {
	for _, c := range []struct {
		e    Error
		want string
	}{
		{Error{File: "p.yaml", Msg: "the file is empty"}, "policy p.yaml: the file is empty"},
		{Error{File: "p.yaml", Field: "version", Msg: "missing"}, "policy p.yaml: version: missing"},
		{Error{File: "p.yaml", Line: 7, Field: "tools.run_python", Msg: "the key appears twice"}, "policy p.yaml: line 7: tools.run_python: the key appears twice"},
	} {
		if got := c.e.Error(); got != c.want {
			t.Errorf("%q, want %q", got, c.want)
		}
	}
}
