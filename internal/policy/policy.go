// Package policy decides which tool calls may run: the policy file (allow,
// deny or ask a human, per tool), rate limits, package rules, and the
// sealed state that binds a human's approval to one exact request.
//
// The file format is the one MCP policy gateways use (version, default,
// tools.NAME.{action, reason, limits}), so a policy written for a gateway
// in front of another server loads here unchanged, plus "approve" and a
// "packages" section.
//
// A policy is security configuration, so parsing is strict: an unknown
// field, a duplicate key, a tool this server does not have or a value out
// of range is an error naming the field, and the server does not start.
// A typo that silently changed what is allowed would be worse.
package policy

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Action is what a policy does with a call.
type Action string

const (
	Allow   Action = "allow"
	Deny    Action = "deny"
	Approve Action = "approve" // ask the user through MCP elicitation first
)

// Scopes of a rate limit. "grant" and "client" both mean one count per
// authenticated identity (per connection without authentication); both
// spellings exist in gateway policies.
const (
	ScopeGlobal = "global"
	ScopeGrant  = "grant"
	ScopeClient = "client"
)

// Limit is one rate limit: at most Max calls per Window, counted in the
// named Counter. Limits that name the same counter, window and scope share
// one count, so several tools can draw on one budget.
type Limit struct {
	Counter string        `json:"counter"`
	Window  string        `json:"window"` // second | minute | hour | day
	Max     int64         `json:"max"`
	Scope   string        `json:"scope"` // global | grant | client
	Period  time.Duration `json:"-"`     // Window as a duration
}

// String describes the limit for people: `"runs": 10 per minute per identity`.
func (l Limit) String() string {
	per := "for everyone together"
	if l.Scope != ScopeGlobal {
		per = "per identity"
	}
	return fmt.Sprintf("%q: %d per %s %s", l.Counter, l.Max, l.Window, per)
}

// ToolRule is the policy for one tool.
type ToolRule struct {
	Action Action  `json:"action"`
	Reason string  `json:"reason,omitempty"`
	Limits []Limit `json:"limits,omitempty"`
	// By says who approves an approve rule: ApproveByUser (the agent's
	// user, through MCP elicitation; the default) or ApproveByOperator
	// (an operator, in the console: the call waits for them).
	By string `json:"by,omitempty"`
	// Require, DenyIf and ApproveIf are the rules on a call's arguments
	// and code (see conditions.go).
	Require   []Rule `json:"require,omitempty"`
	DenyIf    []Rule `json:"deny_if,omitempty"`
	ApproveIf []Rule `json:"approve_if,omitempty"`
}

// Who approves.
const (
	ApproveByUser     = "user"
	ApproveByOperator = "operator"
)

// Policy is a parsed, validated policy file.
type Policy struct {
	Version string               `json:"version"`
	Default Action               `json:"default"`
	Tools   map[string]*ToolRule `json:"tools,omitempty"`
	// Hide lists tools removed from tools/list and refused ("*": all).
	Hide []string `json:"hide,omitempty"`
	// AllTools are rate limits every tool call counts against (the
	// gateway's all_tools.limits), besides its tool's own.
	AllTools []Limit      `json:"all_tools,omitempty"`
	Packages PackageRules `json:"packages"`
	// Python restricts the Python versions runs may use; nil: any.
	Python *PythonRules `json:"python,omitempty"`
	// Quotas bound what one identity may hold at once (runs in flight,
	// queue places, sessions); nil when the file has no quotas section.
	Quotas *Quotas `json:"quotas,omitempty"`
	// Network is what runs may reach through the server's proxy; nil
	// when the file has no network section (no network).
	Network *NetworkRules `json:"network,omitempty"`
	// Upstream caps what a run does through upstream tools; nil: the
	// defaults (see UpstreamLimitsOf).
	Upstream *UpstreamRules `json:"upstream,omitempty"`
	// Source is where the policy came from and SHA256 the digest of its
	// bytes, for the audit log's start record.
	Source string `json:"-"`
	SHA256 string `json:"-"`
	// Warnings name the rules that can never take effect, each as
	// "FIELD: why" (see warnings.go): the policy is in force as written,
	// but its author likely meant something else. The server logs them.
	Warnings []string `json:"warnings,omitempty"`
}

// AllowAll is the policy of a server started without --policy: every tool
// runs, with no limits and no package rules.
func AllowAll() *Policy {
	return &Policy{Version: "1", Default: Allow, Source: "(none: everything allowed)"}
}

// Decision is the policy's answer for one tool.
type Decision struct {
	Action Action
	Reason string
	Limits []Limit
	By     string // for Approve: ApproveByUser or ApproveByOperator
	Hidden bool   // denied because the policy hides the tool
}

// Decide returns what the policy says about a tool. A tool the policy does
// not list falls to the default.
//
// A hidden tool is denied before anything else, even when listed; the
// limits are the tool's own and then the policy's all_tools limits,
// which every call that is not denied counts against.
func (p *Policy) Decide(tool string) Decision {
	if p.hides(tool) {
		return Decision{Action: Deny, Reason: "the policy hides it (hide)", Hidden: true}
	}
	if r := p.rule(tool); r != nil {
		return Decision{Action: r.Action, Reason: r.Reason, Limits: p.limits(r.Limits), By: r.by()}
	}
	reason := ""
	if p.Default == Deny {
		reason = "the policy denies every tool it does not list (default: deny)"
	}
	return Decision{Action: p.Default, Reason: reason, Limits: p.limits(nil)}
}

// limits are a tool's limits followed by the all_tools ones.
func (p *Policy) limits(own []Limit) []Limit {
	if len(p.AllTools) == 0 {
		return own
	}
	return append(slices.Clip(own), p.AllTools...)
}

func (p *Policy) hides(tool string) bool {
	if slices.Contains(p.Hide, tool) || slices.Contains(p.Hide, hideAll) {
		return true
	}
	// SERVER.* hides every tool of an upstream server.
	server, _, ok := strings.Cut(tool, ".")
	return ok && slices.Contains(p.Hide, UpstreamPattern(server))
}

// Hidden reports whether a tool is denied outright (hidden, or denied
// whatever its arguments), and so should not be offered to clients at
// all. The gateway keeps a denied tool in tools/list; pysandbox leaves it
// out too, since an agent can do nothing with it.
func (p *Policy) Hidden(tool string) bool { return p.Decide(tool).Action == Deny }

func (r *ToolRule) by() string {
	if r.By == "" {
		return ApproveByUser
	}
	return r.By
}

// rule is the rule that applies to tool, its own or its upstream
// server's; nil when the default applies.
func (p *Policy) rule(tool string) *ToolRule {
	if r, ok := p.Tools[tool]; ok {
		return r
	}
	if r, ok := p.upstreamRule(tool); ok {
		return r
	}
	return nil
}

// Describe is what the policy does with a tool, for people and agents
// (check_environment): hidden, or its action, its limits and its rules,
// e.g. `allow; "runs": 10 per minute per identity; deny_if args.code regex
// rm\s+-rf ("Destructive shell commands are not allowed")`.
func (p *Policy) Describe(tool string) string {
	d := p.Decide(tool)
	if d.Hidden {
		return "hidden (hide): not offered, every call refused"
	}
	v := string(d.Action)
	if d.Action == Approve && d.By == ApproveByOperator {
		v += " (by an operator)"
	}
	if d.Action == Deny {
		return v
	}
	for _, l := range d.Limits {
		v += "; " + l.String()
	}
	r := p.rule(tool)
	if r == nil {
		return v
	}
	add := func(kind string, rules []Rule) {
		for _, rule := range rules {
			v += "; " + kind + " " + rule.Describe()
			switch {
			case rule.OnDeny != "":
				v += fmt.Sprintf(" (%q)", rule.OnDeny)
			case rule.Reason != "":
				v += fmt.Sprintf(" (%q)", rule.Reason)
			}
			if kind == "approve_if" && rule.By == ApproveByOperator {
				v += " by an operator"
			}
		}
	}
	add("require", r.Require)
	add("deny_if", r.DenyIf)
	add("approve_if", r.ApproveIf)
	return v
}
