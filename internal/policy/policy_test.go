package policy

import (
	"strings"
	"testing"
)

var testTools = []string{"run_python", "install_package", "validate_script", "create_session", "check_environment"}

func TestParseGatewayExample(t *testing.T) {
	// The example, and the shape gateway policies have.
	p, err := Parse([]byte(`{
  "version": "1",
  "default": "deny",
  "tools": {
    "run_python":     {"action": "allow", "limits": [{"counter": "runs", "window": "minute", "max": 10, "scope": "grant"}]},
    "install_package": {"action": "approve"},
    "validate_script": {"action": "deny", "reason": "not needed here"},
    "create_session": {"limits": [{"counter": "sessions", "window": "hour", "max": 3}]}
  },
  "packages": {"allow": ["numpy", "pandas*"], "deny": ["*miner*"]}
}`), "policy.json", testTools)
	if err != nil {
		t.Fatal(err)
	}
	for tool, want := range map[string]Action{"run_python": Allow, "install_package": Approve, "validate_script": Deny, "create_session": Allow, "check_environment": Deny} {
		if got := p.Decide(tool).Action; got != want {
			t.Errorf("%s: %s, want %s", tool, got, want)
		}
	}
	d := p.Decide("run_python")
	if len(d.Limits) != 1 || d.Limits[0].Period.Minutes() != 1 || d.Limits[0].Max != 10 || d.Limits[0].Scope != ScopeGrant {
		t.Errorf("run_python limits %+v", d.Limits)
	}
	if l := p.Decide("create_session").Limits; len(l) != 1 || l[0].Scope != ScopeGlobal {
		t.Errorf("a limit without scope is global: %+v", l)
	}
	if r := p.Decide("validate_script").Reason; r != "not needed here" {
		t.Errorf("reason %q", r)
	}
	if r := p.Decide("check_environment").Reason; !strings.Contains(r, "default: deny") {
		t.Errorf("default deny reason %q", r)
	}
	if !p.Hidden("validate_script") || p.Hidden("install_package") {
		t.Error("only denied tools are hidden")
	}
	if len(p.SHA256) != 64 {
		t.Errorf("sha256 %q", p.SHA256)
	}
}

// TestHideAndAllTools: hide wins over a tool's own rule, "*" hides
// everything, and all_tools limits follow each tool's own.
func TestHideAndAllTools(t *testing.T) {
	p, err := Parse([]byte(`{"version": "1", "default": "allow", "hide": ["upload_file"],
		"all_tools": {"limits": [{"counter": "all", "window": "minute", "max": 3, "scope": "grant"}]},
		"tools": {"upload_file": {}, "run_python": {"limits": [{"counter": "runs", "window": "hour", "max": 10}]}}}`), "p.json", condTools)
	if err != nil {
		t.Fatal(err)
	}
	if d := p.Decide("upload_file"); d.Action != Deny || !d.Hidden || !p.Hidden("upload_file") {
		t.Errorf("hidden tool: %+v", d)
	}
	d := p.Decide("run_python")
	if len(d.Limits) != 2 || d.Limits[0].Counter != "runs" || d.Limits[1].Counter != "all" {
		t.Errorf("run_python limits: %+v", d.Limits)
	}
	if d := p.Decide("check_environment"); len(d.Limits) != 1 || d.Limits[0].Counter != "all" {
		t.Errorf("unlisted tool limits: %+v", d.Limits)
	}
	if d := p.Decide("gh.create_issue"); len(d.Limits) != 1 {
		t.Errorf("upstream tool limits: %+v", d.Limits)
	}
	p, err = Parse([]byte(`{"version": "1", "default": "allow", "hide": ["*"]}`), "p.json", condTools)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Hidden("check_environment") || !p.Hidden("gh.x") {
		t.Error(`hide ["*"] hides everything`)
	}
}

func TestHideServerPattern(t *testing.T) {
	p, err := Parse([]byte(`{"version":"1","default":"allow","hide":["gh.*"]}`), "p.json", condTools)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Hidden("gh.create_issue") || p.Hidden("run_python") {
		t.Error(`hide ["gh.*"] must hide gh's tools, and only those`)
	}
}
