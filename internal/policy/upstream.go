package policy

import (
	"slices"
	"strings"
)

// Tools of upstream MCP servers, called from code in a run, are named
// SERVER.TOOL in a policy, like the server's own tools: a rule may name
// one tool, or SERVER.* for every tool of that server (an exact rule
// wins). A policy can only name servers the server is configured with:
// the caller passes SERVER.* among the tool names for each.

// UpstreamLimits cap what one run may do through upstream tools.
type UpstreamLimits struct {
	// Calls bounds the calls of one run (or one session call).
	Calls int `json:"calls"`
	// Bytes bounds the arguments sent plus the results received, in
	// bytes of JSON, by one run.
	Bytes int64 `json:"bytes"`
}

// DefaultUpstreamLimits apply when a policy has no upstream section.
var DefaultUpstreamLimits = UpstreamLimits{Calls: 1000, Bytes: 64 << 20}

// UpstreamRules is the policy's "upstream" section.
type UpstreamRules struct {
	Limits UpstreamLimits `json:"limits"`
}

// UpstreamLimitsOf returns the policy's per-run caps on upstream calls.
func (p *Policy) UpstreamLimitsOf() UpstreamLimits {
	if p == nil || p.Upstream == nil {
		return DefaultUpstreamLimits
	}
	return p.Upstream.Limits
}

// UpstreamPattern is the name under which a policy may list every tool
// of an upstream server.
func UpstreamPattern(server string) string { return server + ".*" }

// knownTool reports whether a policy may name tool: one of the server's
// own, or SERVER.TOOL / SERVER.* of a configured upstream.
func knownTool(tool string, tools []string) bool {
	if slices.Contains(tools, tool) {
		return true
	}
	server, rest, ok := strings.Cut(tool, ".")
	if !ok || server == "" || rest == "" || !slices.Contains(tools, UpstreamPattern(server)) {
		return false
	}
	// SERVER.* is the only pattern: a rule that looks like a glob
	// ("github.create_*") would otherwise be taken for a tool of that
	// name and match nothing.
	return rest == "*" || !strings.ContainsAny(rest, "*?[")
}

// upstreamRule finds the rule for an upstream tool through its server's
// pattern.
func (p *Policy) upstreamRule(tool string) (*ToolRule, bool) {
	server, _, ok := strings.Cut(tool, ".")
	if !ok {
		return nil, false
	}
	r, ok := p.Tools[UpstreamPattern(server)]
	return r, ok
}

const maxUpstreamBytes = 1 << 40

func (v *validator) upstream(field string, x any) *UpstreamRules {
	m := v.object(field, x, "limits")
	r := &UpstreamRules{Limits: DefaultUpstreamLimits}
	if m == nil {
		return r
	}
	if l, ok := m["limits"]; ok {
		lm := v.object(field+".limits", l, "calls", "bytes")
		for key, max := range map[string]int64{"calls": 100_000, "bytes": maxUpstreamBytes} {
			x, ok := lm[key]
			if !ok {
				continue
			}
			n, ok := integer(x)
			if !ok || n < 1 || n > max {
				v.fail(joinField(field+".limits", key), "want a whole number from 1 to %d", max)
				continue
			}
			if key == "calls" {
				r.Limits.Calls = int(n)
			} else {
				r.Limits.Bytes = n
			}
		}
	}
	return r
}
