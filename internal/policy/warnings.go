package policy

import (
	"fmt"
	"path"
	"slices"
	"strings"
	"time"
)

// A policy that parses may still hold rules that can never take effect:
// a pinned host after "*" (the first matching rule decides, so the pin is
// never used), an allow rule that a deny rule covers, a package pattern
// that no package name can match, a rate limit another one always reaches
// first. Parse reports them in Policy.Warnings rather than refusing the
// file, since such a policy is not wrong about what it allows, only about
// what its author expected; the server logs them.

// warnings lists the rules of p that can never take effect, each as
// "FIELD: why", in the order of the file's sections.
func (p *Policy) warnings() []string {
	var out []string
	out = append(out, p.toolWarnings()...)
	out = append(out, p.Packages.warnings("packages")...)
	if p.Network != nil {
		out = append(out, p.Network.warnings("network")...)
	}
	return out
}

// Warnings lists the rules that can never decide a connection: a rule
// covered by an earlier one of its list (the first match decides, so a
// pin after "*" is never used), or by a rule of a list that wins over its
// own (deny over approve, approve over allow). field names the rules in
// the messages ("network" for a policy's section).
func (r *NetworkRules) Warnings(field string) []string {
	if r == nil {
		return nil
	}
	return r.warnings(field)
}

func (r *NetworkRules) warnings(field string) []string {
	type list struct {
		name  string
		rules []HostRule
	}
	// In the order Decide consults them.
	lists := []list{{"deny", r.Deny}, {"approve", r.Approve}, {"allow", r.Allow}}
	var out []string
	c := newCoverage()
	for li, l := range lists {
	rules:
		for j, b := range l.rules {
			if c.spent() {
				break
			}
			at := fmt.Sprintf("%s.%s[%d] %q", field, l.name, j, b.String())
			pin := ""
			if b.Pin.IsValid() {
				pin = fmt.Sprintf(", and its pin to %s is never used", b.Pin)
			}
			for _, w := range lists[:li] {
				for i, a := range w.rules {
					if c.hosts(a, b) {
						out = append(out, fmt.Sprintf("%s: %s.%s[%d] %q matches every host and port it does, and %s wins over %s, so this rule never decides anything%s",
							at, field, w.name, i, a.String(), w.name, l.name, pin))
						continue rules
					}
				}
			}
			for i, a := range l.rules[:j] {
				if c.hosts(a, b) {
					fix := ""
					if pin != "" {
						fix = fmt.Sprintf("; list it before %q", a.String())
					}
					out = append(out, fmt.Sprintf("%s: %s.%s[%d] %q, earlier in the list, matches every host and port it does, and the first match decides, so this rule is never used%s%s",
						at, field, l.name, i, a.String(), pin, fix))
					continue rules
				}
			}
		}
	}
	// A loopback address is the run's own: HTTP clients in the sandbox
	// reach it directly (NO_PROXY), not through the proxy, so the rule
	// serves only code that uses the proxy on purpose. A name pinned to it
	// works for every client.
	for li, l := range lists[1:] {
		for j, b := range l.rules {
			if b.Addr.IsValid() && b.Addr.IsLoopback() {
				port := ""
				if b.Port != 0 {
					port = fmt.Sprintf(":%d", b.Port)
				}
				out = append(out, fmt.Sprintf("%s.%s[%d] %q: inside a sandbox %s is the run's own loopback, which HTTP clients reach directly (NO_PROXY), not through the proxy, so only code that sends its requests to the proxy on purpose gets through this rule; to reach a service on the host's loopback, pin a name to it (\"svc.local%s=%s\") and have the code use that name",
					field, lists[li+1].name, j, b.String(), b.Addr, port, b.Addr))
			}
		}
	}
	if len(r.Deny) > 0 && !r.Enabled() {
		out = append(out, fmt.Sprintf("%s.deny: nothing is allowed or approved, so runs have no network at all and these rules decide nothing", field))
	}
	return c.note(out, field)
}

// coverageBudget bounds the work of comparing patterns, in steps of a
// comparison (bytes scanned, pairs of pattern parts, one per pair of
// rules): a policy of many thousands of rules is not checked whole rather
// than stalling the server's start (every pair is compared).
const coverageBudget = 1 << 24

// coverage compares patterns within a budget.
type coverage struct{ budget int }

func newCoverage() *coverage { return &coverage{budget: coverageBudget} }

// note adds to out that not every rule of field was checked, if so.
func (c *coverage) note(out []string, field string) []string {
	if c.spent() {
		out = append(out, fmt.Sprintf("%s: too many long patterns to check each against the others; some rules that never take effect may not be named here", field))
	}
	return out
}

// spent reports whether the budget is gone: the checks stop.
func (c *coverage) spent() bool { return c.budget < 0 }

// hosts reports whether every host and port b matches, a matches too.
func (c *coverage) hosts(a, b HostRule) bool {
	if c.budget--; c.budget < 0 || a.Port != 0 && a.Port != b.Port {
		return false
	}
	switch {
	case a.Host == "*" && !a.Addr.IsValid():
		return true // every name and every address
	case a.Addr.IsValid() || b.Addr.IsValid():
		return a.Addr == b.Addr
	case b.Host == "*":
		return false // b matches addresses, which no other glob does
	}
	return c.globs(a.Host, b.Host)
}

// globToken is one element of a glob: a literal byte, '?', '*' or a
// bracket class (its text, as path.Match takes it). Host and package
// patterns hold no backslash (their parsers refuse it), and path.Match
// allows no ']' inside a class, so a class ends at the first ']'.
type globToken struct {
	kind byte // 'c' literal, '?', '*', '['
	c    byte
	text string
}

func globTokens(g string) []globToken {
	var out []globToken
	for i := 0; i < len(g); i++ {
		switch g[i] {
		case '*', '?':
			out = append(out, globToken{kind: g[i]})
		case '[':
			end := strings.IndexByte(g[i:], ']')
			if end < 0 { // not a valid pattern: the parsers refuse it
				return append(out, globToken{kind: 'c', c: g[i]})
			}
			out = append(out, globToken{kind: '[', text: g[i : i+end+1]})
			i += end
		default:
			out = append(out, globToken{kind: 'c', c: g[i]})
		}
	}
	return out
}

// globs reports whether glob a matches every string glob b matches
// (path.Match globs). It is exact enough to be safe: it says yes only
// when each part of b is consumed by a part of a that matches whatever
// that part stands for (a '*' of b only by a '*' of a; a class of b only
// by '?', '*' or the same class), so a warning built on it is never
// wrong, though it may miss a few covered patterns. Past the budget it
// says no.
func (c *coverage) globs(a, b string) bool {
	if c.budget -= len(a) + len(b); c.budget < 0 {
		return false
	}
	if !strings.ContainsAny(a, "*?[") {
		// A plain name covers itself only: the common case, cheaply.
		return a == b
	}
	if c.budget -= (len(a) + 1) * (len(b) + 1); c.budget < 0 {
		return false
	}
	ta, tb := globTokens(a), globTokens(b)
	// next[j] is whether ta[i+1:] covers tb[j:], cur[j] whether ta[i:]
	// does.
	next, cur := make([]bool, len(tb)+1), make([]bool, len(tb)+1)
	next[len(tb)] = true
	for i := len(ta) - 1; i >= 0; i-- {
		x := ta[i]
		for j := len(tb); j >= 0; j-- {
			cur[j] = false
			switch {
			case x.kind == '*':
				// Consume nothing, or b's next part whatever it is.
				cur[j] = next[j] || j < len(tb) && cur[j+1]
			case j < len(tb) && tb[j].kind != '*' && oneCovers(x, tb[j]):
				cur[j] = next[j+1]
			}
		}
		next, cur = cur, next
	}
	return next[0]
}

// oneCovers reports whether the one-byte part x matches whatever byte the
// one-byte part y stands for.
func oneCovers(x, y globToken) bool {
	switch x.kind {
	case '?':
		return true
	case 'c':
		return y.kind == 'c' && y.c == x.c
	case '[':
		if y.kind == '[' {
			return x.text == y.text
		}
		m, _ := path.Match(x.text, string([]byte{y.c}))
		return y.kind == 'c' && m
	}
	return false
}

// warnings lists the package patterns that can never take effect: one
// that no normalised name can match, an allow pattern whose every package
// a deny pattern refuses, and one covered by an earlier pattern of its
// own list.
func (r PackageRules) warnings(field string) []string {
	var out []string
	c := newCoverage()
	check := func(list string, pats []string, against func(g string) string) {
		for j, g := range pats {
			if c.spent() {
				return
			}
			at := fmt.Sprintf("%s.%s[%d] %q", field, list, j, g)
			if why := unmatchablePackage(g); why != "" {
				out = append(out, fmt.Sprintf("%s: no package name can match it (%s)", at, why))
				continue
			}
			if w := against(g); w != "" {
				out = append(out, at+": "+w)
				continue
			}
			for i, earlier := range pats[:j] {
				if c.globs(earlier, g) {
					out = append(out, fmt.Sprintf("%s: %s.%s[%d] %q, earlier in the list, matches every package it does, so it adds nothing", at, field, list, i, earlier))
					break
				}
			}
		}
	}
	check("deny", r.Deny, func(string) string { return "" })
	check("allow", r.Allow, func(g string) string {
		for i, d := range r.Deny {
			if c.globs(d, g) {
				return fmt.Sprintf("every package it allows is refused by %s.deny[%d] %q (deny wins), so it allows nothing", field, i, d)
			}
		}
		return ""
	})
	return c.note(out, field)
}

// unmatchablePackage says why no PEP 503 normalised name (lowercase
// letters, digits and single '-' between them) can match glob g, or "".
// A requirement written where a name belongs ("torch==2.1") is the usual
// cause.
func unmatchablePackage(g string) string {
	toks := globTokens(g)
	for _, t := range toks {
		if t.kind == 'c' && !(t.c >= 'a' && t.c <= 'z' || t.c >= '0' && t.c <= '9' || t.c == '-') {
			return fmt.Sprintf("names hold only letters, digits and '-', not %q", t.c)
		}
	}
	if len(toks) > 0 && toks[0].kind == 'c' && toks[0].c == '-' || len(toks) > 0 && toks[len(toks)-1].kind == 'c' && toks[len(toks)-1].c == '-' {
		return "a name neither begins nor ends with '-'"
	}
	return ""
}

// toolWarnings lists the parts of tool rules that can never take effect:
// the limits of a denied tool (its calls are refused before they are
// counted), and a limit that another limit of the same rule always
// reaches first.
func (p *Policy) toolWarnings() []string {
	names := make([]string, 0, len(p.Tools))
	for name := range p.Tools {
		names = append(names, name)
	}
	slices.Sort(names)
	// The count a limit is checked against (see counterKey).
	type key struct {
		counter, scope string
		period         time.Duration
	}
	keyOf := func(l Limit) key { return key{l.Counter, l.Scope, l.Period} }
	// Which rules count in each key. Windows are aligned to the clock, so
	// a longer one holds the current shorter one; its count is at least
	// the shorter one's when every rule counting in the shorter one
	// counts in the longer one too.
	var out0 []string
	for _, name := range names {
		r := p.Tools[name]
		n := len(r.Require) + len(r.DenyIf) + len(r.ApproveIf)
		switch {
		case n > 0 && (r.Action == Deny || p.hides(name)):
			out0 = append(out0, fmt.Sprintf("tools.%s: its require, deny_if and approve_if rules never apply, since the tool is denied whatever its arguments", name))
		case len(r.ApproveIf) > 0 && r.Action == Approve:
			out0 = append(out0, fmt.Sprintf("tools.%s.approve_if: every call is approved by a human already (action: approve), so these rules change nothing", name))
		}
	}
	counting := map[key]map[string]bool{}
	for _, name := range names {
		if p.Tools[name].Action == Deny {
			continue
		}
		for _, l := range p.Tools[name].Limits {
			k := keyOf(l)
			if counting[k] == nil {
				counting[k] = map[string]bool{}
			}
			counting[k][name] = true
		}
	}
	within := func(short, long key) bool {
		for name := range counting[short] {
			if !counting[long][name] {
				return false
			}
		}
		return true
	}
	out := out0
	for _, name := range names {
		r := p.Tools[name]
		field := "tools." + name
		if r.Action == Deny && len(r.Limits) > 0 {
			out = append(out, fmt.Sprintf("%s.limits: the tool is denied, and a denied call is refused before any limit counts it, so these limits never apply", field))
			continue
		}
	limits:
		for j, l := range r.Limits {
			kj := keyOf(l)
			for i, o := range r.Limits {
				ki := keyOf(o)
				if i == j || ki.counter != kj.counter || ki.scope != kj.scope || ki.period < kj.period || o.Max > l.Max {
					continue
				}
				// Of two identical limits, the later one is the extra.
				if ki == kj && o.Max == l.Max && i > j {
					continue
				}
				if ki != kj && !within(kj, ki) {
					continue
				}
				out = append(out, fmt.Sprintf("%s.limits[%d] (%s): %s.limits[%d] (%s) counts the same calls, over a window at least as long, up to a max no larger, so this limit never refuses a call that one would let through",
					field, j, l, field, i, o))
				continue limits
			}
		}
	}
	return out
}
