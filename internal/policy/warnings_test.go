package policy

import (
	"fmt"
	"strings"
	"testing"
)

// TestWarnings: real policy files load, and exactly the rules that can
// never take effect are named, with the field and the reason.
func TestWarnings(t *testing.T) {
	for file, want := range map[string][]string{
		"testdata/warnings/shadowed.yaml": {
			`tools.install_package.limits[1] ("installs": 20 per hour for everyone together): tools.install_package.limits[0] ("installs": 10 per hour for everyone together) counts the same calls, over a window at least as long, up to a max no larger, so this limit never refuses a call that one would let through`,
			`tools.run_python.limits[0] ("runs": 100 per minute per identity): tools.run_python.limits[1] ("runs": 50 per hour per identity) counts the same calls, over a window at least as long, up to a max no larger, so this limit never refuses a call that one would let through`,
			`tools.validate_script.limits: the tool is denied, and a denied call is refused before any limit counts it, so these limits never apply`,
			`packages.deny[1] "-bad": no package name can match it (a name neither begins nor ends with '-')`,
			`packages.allow[2] "pandas-stubs": packages.allow[1] "pandas*", earlier in the list, matches every package it does, so it adds nothing`,
			`packages.allow[3] "torch==2-1": no package name can match it (names hold only letters, digits and '-', not '=')`,
			`packages.allow[4] "crypto-miner-helper": every package it allows is refused by packages.deny[0] "*miner*" (deny wins), so it allows nothing`,
			`network.deny[1] "gist.github.com:443": network.deny[0] "gist.github.com", earlier in the list, matches every host and port it does, and the first match decides, so this rule is never used`,
			`network.allow[1] "files.corp:8443=10.0.0.5": network.allow[0] "*", earlier in the list, matches every host and port it does, and the first match decides, so this rule is never used, and its pin to 10.0.0.5 is never used; list it before "*"`,
			`network.allow[2] "api.github.com": network.approve[0] "*.github.com" matches every host and port it does, and approve wins over allow, so this rule never decides anything`,
			`network.allow[3] "gist.github.com": network.deny[0] "gist.github.com" matches every host and port it does, and deny wins over allow, so this rule never decides anything`,
			`network.allow[4] "10.0.0.7:443": network.allow[0] "*", earlier in the list, matches every host and port it does, and the first match decides, so this rule is never used`,
		},
		"testdata/warnings/clean.yaml": nil,
		// A loopback address is the run's own; a name pinned to it is not.
		"testdata/warnings/network-loopback.yaml": {
			`network.approve[0] "[::1]": inside a sandbox ::1 is the run's own loopback, which HTTP clients reach directly (NO_PROXY), not through the proxy, so only code that sends its requests to the proxy on purpose gets through this rule; to reach a service on the host's loopback, pin a name to it ("svc.local=::1") and have the code use that name`,
			`network.allow[0] "127.0.0.1:28999": inside a sandbox 127.0.0.1 is the run's own loopback, which HTTP clients reach directly (NO_PROXY), not through the proxy, so only code that sends its requests to the proxy on purpose gets through this rule; to reach a service on the host's loopback, pin a name to it ("svc.local:28999=127.0.0.1") and have the code use that name`,
		},
		"testdata/warnings/network-deny-only.json": {
			`network.deny: nothing is allowed or approved, so runs have no network at all and these rules decide nothing`,
		},
		"../../examples/policy.json": nil,
	} {
		t.Run(file, func(t *testing.T) {
			p, err := Load(file, append(testTools, "list_sessions", "close_session", "upload_file", "list_files", "download_file"))
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(p.Warnings, "\n"); got != strings.Join(want, "\n") {
				t.Errorf("warnings:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
			}
		})
	}
}

// TestWarnedRulesNeverDecide: what the warnings say holds for the
// rules as Decide applies them.
func TestWarnedRulesNeverDecide(t *testing.T) {
	p, err := Load("testdata/warnings/shadowed.yaml", testTools)
	if err != nil {
		t.Fatal(err)
	}
	n := p.Network
	for _, c := range []struct {
		host      string
		port      int
		action    Action
		rule      string
		unusedPin bool
	}{
		{"files.corp", 8443, Allow, "*", true},
		{"api.github.com", 443, Approve, "*.github.com", false},
		{"gist.github.com", 443, Deny, "gist.github.com", false},
		{"10.0.0.7", 443, Allow, "*", false},
	} {
		a, r := n.Decide(c.host, c.port)
		if a != c.action || r == nil || r.String() != c.rule || c.unusedPin && r.Pin.IsValid() {
			t.Errorf("%s:%d: %s by %v, want %s by %s", c.host, c.port, a, r, c.action, c.rule)
		}
	}
	// pandas-stubs is allowed by pandas* alone; crypto-miner-helper is
	// refused in spite of its allow pattern; no requirement is "torch==2-1".
	if err := p.Packages.Check("pandas-stubs"); err != nil {
		t.Error(err)
	}
	for _, name := range []string{"crypto-miner-helper", "torch"} {
		if err := p.Packages.Check(name); err == nil {
			t.Errorf("%s allowed", name)
		}
	}
	// The clean file's pinned rule, listed before "*", is used.
	clean, err := Load("testdata/warnings/clean.yaml", testTools)
	if err != nil {
		t.Fatal(err)
	}
	if _, r := clean.Network.Decide("files.corp", 8443); r == nil || r.Pin.String() != "10.0.0.5" {
		t.Errorf("pinned rule before *: decided by %v", r)
	}
}

// TestGlobCoverage: the comparison of patterns says yes only when every
// string one matches, the other matches too.
func TestGlobCoverage(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{"*", "anything", true},
		{"*", "*.x.com", true},
		{"*.x.com", "*.y.x.com", true},
		{"*.x.com", "a.x.com", true},
		{"*.x.com", "x.com", false},
		{"*.x.com", "*x.com", false},
		{"a*", "ab*", true},
		{"ab*", "a*", false},
		{"?", "a", true},
		{"?", "*", false},
		{"??", "?*", false},
		{"*a*", "*a*a*", true},
		{"*a*a*", "*a*", false},
		{"[a-c]x", "bx", true},
		{"[a-c]x", "dx", false},
		{"[a-c]x", "?x", false},
		{"?x", "[a-c]x", true},
		{"[a-c]x", "[a-c]x", true},
		{"scikit-*", "scikit-[a-z]*", true},
		{"pandas", "pandas-*", false},
	} {
		if got := newCoverage().globs(c.a, c.b); got != c.want {
			t.Errorf("%q covers %q: %v, want %v", c.a, c.b, got, c.want)
		}
	}
	// Past the budget nothing is said to be covered, and a note says the
	// check was cut. A list of a few hundred names is far from it.
	many := &NetworkRules{}
	for i := range 300 {
		many.Allow = append(many.Allow, mustRule(t, fmt.Sprintf("host%d.example", i)))
	}
	if w := many.Warnings("network"); len(w) != 0 {
		t.Errorf("warnings of 300 names: %.200q", w)
	}
	many.Allow = nil
	for i := range 1000 {
		many.Allow = append(many.Allow, mustRule(t, fmt.Sprintf("*.%s%d.example", strings.Repeat("a.", 100), i)))
	}
	w := many.Warnings("network")
	if len(w) != 1 || !strings.Contains(w[0], "too many long patterns") {
		t.Errorf("warnings of 1000 long patterns: %d, %.200q", len(w), w)
	}
}
