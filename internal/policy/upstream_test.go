package policy

import (
	"strings"
	"testing"
)

func TestUpstreamTools(t *testing.T) {
	tools := append(append([]string(nil), testTools...), UpstreamPattern("github"), UpstreamPattern("memory"))
	p, err := Parse([]byte(`{"version": "1", "default": "deny", "tools": {
		"github.*": {"action": "allow", "limits": [{"counter": "gh", "window": "minute", "max": 5}]},
		"github.delete_repo": {"action": "deny", "reason": "never"},
		"memory.read_graph": {"action": "approve"}
	}, "upstream": {"limits": {"calls": 20, "bytes": 1000}}}`), "p.json", tools)
	if err != nil {
		t.Fatal(err)
	}
	for tool, want := range map[string]Action{
		"github.search":      Allow,
		"github.delete_repo": Deny,
		"memory.read_graph":  Approve,
		"memory.write":       Deny, // the default
		"run_python":         Deny,
		"other.x":            Deny,
	} {
		if got := p.Decide(tool).Action; got != want {
			t.Errorf("%s: %s, want %s", tool, got, want)
		}
	}
	if d := p.Decide("github.search"); len(d.Limits) != 1 || d.Limits[0].Counter != "gh" {
		t.Errorf("the pattern's limits: %+v", d)
	}
	if d := p.Decide("github.delete_repo"); d.Reason != "never" {
		t.Errorf("the exact rule wins: %+v", d)
	}
	if l := p.UpstreamLimitsOf(); l.Calls != 20 || l.Bytes != 1000 {
		t.Errorf("limits %+v", l)
	}
	if l := AllowAll().UpstreamLimitsOf(); l != DefaultUpstreamLimits {
		t.Errorf("default limits %+v", l)
	}

	for _, tc := range []struct{ doc, want string }{
		{`{"version": "1", "tools": {"gitlab.search": {"action": "deny"}}}`, `tools.gitlab.search: this server has no upstream named "gitlab"`},
		{`{"version": "1", "tools": {"github.": {"action": "deny"}}}`, `tools.github.: this server has no upstream named "github"`},
		{`{"version": "1", "tools": {"github.create_*": {"action": "deny"}}}`, `tools.github.create_*: a rule names one upstream tool (github.TOOL) or all of its tools (github.*)`},
		{`{"version": "1", "tools": {"github.*issue?": {"action": "deny"}}}`, `other patterns are not supported`},
		{`{"version": "1", "upstream": {"limits": {"calls": 0}}}`, "upstream.limits.calls: want a whole number from 1"},
		{`{"version": "1", "upstream": {"limits": {"bytes": "1MiB"}}}`, "upstream.limits.bytes: want a whole number"},
		{`{"version": "1", "upstream": {"limit": {}}}`, "upstream.limit: unknown field"},
	} {
		_, err := Parse([]byte(tc.doc), "p.json", tools)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.doc, err, tc.want)
		}
	}
	// Without upstreams configured, no upstream name is known.
	if _, err := Parse([]byte(`{"version": "1", "tools": {"github.*": {"action": "allow"}}}`), "p.json", testTools); err == nil {
		t.Error("an upstream pattern was accepted with no upstreams")
	}
}
