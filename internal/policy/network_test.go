package policy

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestNetworkRules(t *testing.T) {
	p, err := Parse([]byte(`
version: "1"
default: allow
network:
  allow: ["api.github.com", "*.githubusercontent.com:443", "127.0.0.1:8443", "[::1]", "Example.ORG."]
  deny: ["evil.githubusercontent.com"]
  approve: ["*.corp.example"]
  limits: {bytes_in: 1000, connections: 3, connection_seconds: 7}
`), "p.yaml", testTools)
	if err != nil {
		t.Fatal(err)
	}
	n := p.Network
	if !n.Enabled() {
		t.Fatal("not enabled")
	}
	if n.Limits.BytesIn != 1000 || n.Limits.Connections != 3 || n.Limits.ConnTime != 7*time.Second || n.Limits.BytesOut != DefaultNetLimits.BytesOut {
		t.Errorf("limits %+v", n.Limits)
	}
	for _, c := range []struct {
		host string
		port int
		want Action
	}{
		{"api.github.com", 443, Allow},
		{"api.github.com", 80, Allow},
		{"github.com", 443, Deny},
		{"raw.githubusercontent.com", 443, Allow},
		{"a.b.githubusercontent.com", 443, Allow},
		{"raw.githubusercontent.com", 80, Deny},
		{"githubusercontent.com", 443, Deny},
		{"evil.githubusercontent.com", 443, Deny},
		{"db.corp.example", 5432, Approve},
		{"127.0.0.1", 8443, Allow},
		{"127.0.0.1", 8444, Deny},
		{"::1", 80, Allow},
		{"example.org", 80, Allow},
		{"api.github.com.evil.net", 443, Deny},
	} {
		if got, _ := n.Decide(c.host, c.port); got != c.want {
			t.Errorf("%s:%d: %s, want %s", c.host, c.port, got, c.want)
		}
	}
	// A pattern never matches an address, even "*".
	star := &NetworkRules{Allow: []HostRule{mustRule(t, "*")}}
	if got, _ := star.Decide("example.com", 1); got != Allow {
		t.Errorf("* refused a name")
	}
	if got, _ := (&NetworkRules{Allow: []HostRule{mustRule(t, "1*")}}).Decide("127.0.0.1", 80); got != Deny {
		t.Errorf("a glob matched an address")
	}
	pin := mustRule(t, "Files.Corp:8443=10.0.0.5")
	if pin.Host != "files.corp" || pin.Port != 8443 || pin.Pin.String() != "10.0.0.5" || pin.String() != "files.corp:8443=10.0.0.5" {
		t.Errorf("pinned rule %+v", pin)
	}
	if !pin.Match("files.corp", 8443) || pin.Match("10.0.0.5", 8443) {
		t.Errorf("a pinned rule matches its name only")
	}
	if (&NetworkRules{Deny: []HostRule{mustRule(t, "x.com")}}).Enabled() {
		t.Error("deny alone enabled the network")
	}
}

func mustRule(t *testing.T, s string) HostRule {
	t.Helper()
	r, err := ParseHostRule(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestNetworkRuleErrors(t *testing.T) {
	for _, c := range []struct{ doc, want string }{
		{`{"version":"1","network":{"allow":"x.com"}}`, "network.allow: want a list"},
		{`{"version":"1","network":{"allow":["x.com:0"]}}`, "port must be a number"},
		{`{"version":"1","network":{"allow":["x.com:http"]}}`, "port must be a number"},
		{`{"version":"1","network":{"allow":["::1"]}}`, "brackets"},
		{`{"version":"1","network":{"allow":["x/y"]}}`, "only letters"},
		{`{"version":"1","network":{"allow":["2130706433"]}}`, "non-standard form"},
		{`{"version":"1","network":{"allow":["a..b"]}}`, "not a host"},
		{`{"version":"1","network":{"allow":["[fe80::1%eth0]"]}}`, "zone"},
		{`{"version":"1","network":{"allow":["x.com"],"proxy":1}}`, "network.proxy: unknown field"},
		{`{"version":"1","network":{"limits":{"bytes_in":0}}}`, "network.limits.bytes_in"},
		{`{"version":"1","network":{"allow":["*.x.com=10.0.0.1"]}}`, "only a plain name"},
		{`{"version":"1","network":{"allow":["x.com=nowhere"]}}`, "pinned to"},
		{`{"version":"1","network":{"limits":{"connections":-1}}}`, "network.limits.connections"},
	} {
		_, err := Parse([]byte(c.doc), "p.json", testTools)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.doc, err, c.want)
		}
	}
}

func TestNormalizeHost(t *testing.T) {
	for in, want := range map[string]string{
		"API.GitHub.com.":                "api.github.com",
		"127.0.0.1":                      "127.0.0.1",
		"::ffff:127.0.0.1":               "127.0.0.1",
		"[::1]":                          "::1",
		"under_score.x.com":              "under_score.x.com",
		"2130706433":                     "",
		"0177.0.0.1":                     "",
		"0x7f.1":                         "",
		"127.1":                          "",
		"1.2.3":                          "",
		"x.0x10":                         "",
		"":                               "",
		"-a.com":                         "",
		"a b.com":                        "",
		"[127.0.0.1]":                    "",
		"fe80::1%eth0":                   "",
		strings.Repeat("a", 64) + ".com": "",
	} {
		got, err := NormalizeHost(in)
		if want == "" {
			if err == nil {
				t.Errorf("%q: accepted as %q", in, got)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("%q: %q %v, want %q", in, got, err, want)
		}
	}
	for in, want := range map[string]string{"x.com:443": "x.com 443", "[::1]:80": "::1 80", "x.com": "x.com 80"} {
		h, p, err := SplitHostPort(in, 80)
		if err != nil || h+" "+strconv.Itoa(p) != want {
			t.Errorf("%q: %s %d %v", in, h, p, err)
		}
	}
	if _, _, err := SplitHostPort("x.com", 0); err == nil {
		t.Error("no port accepted for CONNECT")
	}
}

func TestHostRuleUnspecifiedAndURL(t *testing.T) {
	for _, c := range []struct{ rule, want string }{
		{"0.0.0.0", "unspecified address"},
		{"[::]:443", "unspecified address"},
		{"http://example.com/x", `want HOST[:PORT], not a URL; e.g. example.com`},
	} {
		if _, err := ParseHostRule(c.rule); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v", c.rule, err)
		}
	}
}
