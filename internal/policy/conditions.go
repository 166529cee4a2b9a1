package policy

import (
	"encoding/json"
	"fmt"
	"math/big"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// The argument rules of a gateway policy (PolicyLayer's hosted format):
//
//	tools:
//	  upload_file:
//	    require:  [{conditions: [{path: args.path, op: regex, value: "^[a-z]"}], on_deny: "..."}]
//	    deny_if:  [{conditions: [{path: args.path, op: contains, value: ".."}], on_deny: "..."}]
//	    approve_if: [{conditions: [{path: args.path, op: regex, value: "\\.env$"}], by: operator}]
//
// A rule holds when every one of its conditions holds (no conditions:
// always). Every require rule must hold, and no deny_if rule may; the
// first that fails decides, with its on_deny as the reason. approve_if is
// pysandbox's: the same rules, and a match asks a human (the user, or an
// operator with by: operator) instead of refusing.
//
// A condition's path is args.NAME[.NAME...] into the call's arguments
// (objects only, as the gateway walks them), or code.FACT for the facts
// Python's parser derives from a code tool's code (see internal/codefacts:
// imports, process_calls, file_calls, network_calls, dynamic_code, urls,
// dependencies, bytes, lines, syntax_error). A path that leads nowhere
// (or to null) makes every operator but exists false: a require rule on
// it fails, a deny_if rule on it does not match.
//
// The operators and their types are the gateway's:
//
//	eq, neq        numbers compare as numbers, anything else as its text
//	lt lte gt gte  numbers only (a numeric string is not a number)
//	in, not_in     eq against any of a list
//	regex          RE2, unanchored, on strings only
//	contains       a substring of a string, or eq to an element of a list
//	exists         true or false: whether the path leads to a non-null value

// Rule is one require, deny_if or approve_if entry.
type Rule struct {
	Conditions []Condition `json:"conditions"`
	// OnDeny is the reason a refusal gives (require, deny_if).
	OnDeny string `json:"on_deny,omitempty"`
	// Reason is why a human is asked (approve_if), shown to them.
	Reason string `json:"reason,omitempty"`
	// By is who approves (approve_if): ApproveByUser or ApproveByOperator.
	By string `json:"by,omitempty"`
	// field names the rule in the file, e.g. tools.run_python.deny_if[0].
	field string
}

// Field names the rule in the policy file, e.g. tools.run_python.deny_if[0].
func (r *Rule) Field() string { return r.field }

// Condition is one test on a call.
type Condition struct {
	Path  string `json:"path"`
	Op    string `json:"op"`
	Value any    `json:"value,omitempty"`

	root string   // "args" or "code"
	keys []string // the path after its root
	re   *regexp.Regexp
}

// Roots of a condition's path.
const (
	RootArgs = "args"
	RootCode = "code"
)

// CodeFacts are the facts a code path may name.
var CodeFacts = []string{"imports", "process_calls", "file_calls", "network_calls", "dynamic_code", "urls", "dependencies", "bytes", "lines", "syntax_error"}

// listFacts are the code facts that are lists of names: only contains
// (an element) and exists (not empty) mean anything on them.
var listFacts = []string{"imports", "process_calls", "file_calls", "network_calls", "dynamic_code", "urls", "dependencies"}

var operators = []string{"eq", "neq", "lt", "lte", "gt", "gte", "in", "not_in", "exists", "regex", "contains"}

// Facts are what a call's rules look at: its arguments, and for a code
// tool whose rules name code.* the facts of its code.
type Facts struct {
	Args map[string]any // JSON values; numbers as json.Number
	Code map[string]any // nil: not derived
}

// holds reports whether the condition holds for f; certain is false when
// it cannot tell, because a number in the call is too long or too large
// to compare exactly (the rule then fails closed, see Judge).
func (c *Condition) holds(f Facts) (ok, certain bool) {
	var v any
	var found bool
	switch c.root {
	case RootArgs:
		v, found = walk(f.Args, c.keys)
	case RootCode:
		v, found = walk(f.Code, c.keys)
	}
	if found && unreadable(v) {
		return false, false
	}
	return c.test(v, found), true
}

// test is the condition on the value its path leads to.
func (c *Condition) test(v any, found bool) bool {
	if found && v == nil {
		found = false
	}
	if c.Op == "exists" {
		want, _ := c.Value.(bool)
		return found == want
	}
	if !found {
		return false
	}
	switch c.Op {
	case "eq":
		return equal(v, c.Value)
	case "neq":
		return !equal(v, c.Value)
	case "in", "not_in":
		in := false
		if list, ok := c.Value.([]any); ok {
			in = slices.ContainsFunc(list, func(x any) bool { return equal(v, x) })
		}
		return in == (c.Op == "in")
	case "lt", "lte", "gt", "gte":
		a, ok1 := number(v)
		b, ok2 := number(c.Value)
		if !ok1 || !ok2 {
			return false
		}
		switch n := a.Cmp(b); c.Op {
		case "lt":
			return n < 0
		case "lte":
			return n <= 0
		case "gt":
			return n > 0
		default:
			return n >= 0
		}
	case "regex":
		s, ok := v.(string)
		return ok && c.re != nil && c.re.MatchString(s)
	case "contains":
		switch x := v.(type) {
		case string:
			sub, ok := c.Value.(string)
			return ok && strings.Contains(x, sub)
		case []any:
			return slices.ContainsFunc(x, func(e any) bool { return equal(e, c.Value) })
		}
	}
	return false
}

// walk follows keys through nested objects.
func walk(m map[string]any, keys []string) (any, bool) {
	var v any = m
	if m == nil {
		return nil, false
	}
	for _, k := range keys {
		obj, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		if v, ok = obj[k]; !ok {
			return nil, false
		}
	}
	return v, true
}

// equal is the gateway's eq: numbers as numbers, all else as text.
func equal(a, b any) bool {
	x, ok1 := number(a)
	y, ok2 := number(b)
	if ok1 && ok2 {
		return x.Cmp(y) == 0
	}
	return text(a) == text(b)
}

func text(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case json.Number:
		return x.String()
	case nil:
		return "<nil>"
	}
	return fmt.Sprint(v)
}

// maxNumberText bounds the text of a number compared exactly: parsing
// costs more the longer it is (a million digits took seconds), and no
// argument needs more digits than this.
const maxNumberText = 64

// unreadable reports whether v holds a number too long or too large to
// compare exactly (anywhere in it: a list's elements are compared too).
func unreadable(v any) bool {
	switch x := v.(type) {
	case json.Number:
		_, ok := number(x)
		return !ok
	case []any:
		for _, e := range x {
			if n, isNum := e.(json.Number); isNum {
				if _, ok := number(n); !ok {
					return true
				}
			}
		}
	}
	return false
}

// number is v as an exact rational, when v is a number (never a string:
// the gateway does not read "5" as 5). A number of more than
// maxNumberText characters, or with an exponent beyond ±400, is not read.
func number(v any) (*big.Rat, bool) {
	switch n := v.(type) {
	case json.Number:
		t := n.String()
		if len(t) > maxNumberText {
			return nil, false
		}
		if i := strings.IndexAny(t, "eE"); i >= 0 {
			exp, err := strconv.Atoi(strings.TrimPrefix(t[i+1:], "+"))
			if err != nil || exp > 400 || exp < -400 {
				return nil, false
			}
		}
		r, ok := new(big.Rat).SetString(t)
		return r, ok
	case int:
		return new(big.Rat).SetInt64(int64(n)), true
	case int64:
		return new(big.Rat).SetInt64(n), true
	case uint64:
		return new(big.Rat).SetUint64(n), true
	case float64:
		r := new(big.Rat)
		if r.SetFloat64(n) == nil {
			return nil, false
		}
		return r, true
	}
	return nil, false
}

// matches reports whether every condition of r holds; certain is false
// when one could not tell and none is surely false.
func (r *Rule) matches(f Facts) (match, certain bool) {
	certain = true
	for i := range r.Conditions {
		ok, sure := r.Conditions[i].holds(f)
		switch {
		case sure && !ok:
			return false, true
		case !sure:
			certain = false
		}
	}
	return certain, certain
}

// unsure is the reason a rule could not be applied.
func unsure(rule *Rule) string {
	return "a number in the call is too long or too large to compare exactly (" + rule.field + ": " + rule.Describe() + "), so the rule cannot be applied and refuses it; send it with at most " + strconv.Itoa(maxNumberText) + " characters"
}

// Describe is the rule as a person reads it: "args.path regex \.env$ and
// code.imports contains subprocess".
func (r *Rule) Describe() string {
	if len(r.Conditions) == 0 {
		return "always"
	}
	parts := make([]string, len(r.Conditions))
	for i, c := range r.Conditions {
		v, _ := json.Marshal(c.Value)
		if s, ok := c.Value.(string); ok {
			v = []byte(s)
		}
		parts[i] = c.Path + " " + c.Op + " " + string(v)
	}
	return strings.Join(parts, " and ")
}

// Judgement is what a tool's argument rules say about one call.
type Judgement struct {
	// Deny is set when a require rule failed or a deny_if rule matched;
	// Reason is its on_deny (or a description of the rule), Rule the
	// rule that decided.
	Deny   bool
	Reason string
	// Approve is set when an approve_if rule matched (and nothing
	// denied): a human must approve, By says who.
	Approve bool
	By      string
	Rule    *Rule
}

// Judge applies the argument rules of tool to a call.
func (p *Policy) Judge(tool string, f Facts) Judgement {
	return p.judge(tool, f, false)
}

// JudgeArgs judges only the rules with no condition on the code, from
// the arguments alone: what can be decided before the code's facts are
// derived (in the run's sandbox), and so before anything the run needs
// is installed. A rule with a condition on the code is left for Judge.
func (p *Policy) JudgeArgs(tool string, f Facts) Judgement {
	return p.judge(tool, f, true)
}

// onCode reports whether a rule has a condition on the code's facts.
func (r *Rule) onCode() bool {
	for i := range r.Conditions {
		if r.Conditions[i].root == RootCode {
			return true
		}
	}
	return false
}

func (p *Policy) judge(tool string, f Facts, argsOnly bool) Judgement {
	r := p.rule(tool)
	if r == nil {
		return Judgement{}
	}
	skip := func(rule *Rule) bool { return argsOnly && rule.onCode() }
	for i := range r.Require {
		rule := &r.Require[i]
		if skip(rule) {
			continue
		}
		if m, sure := rule.matches(f); !sure {
			return Judgement{Deny: true, Reason: unsure(rule), Rule: rule}
		} else if !m {
			reason := rule.OnDeny
			if reason == "" {
				reason = "the call does not meet the policy's requirement " + rule.field + " (" + rule.Describe() + ")"
			}
			return Judgement{Deny: true, Reason: reason, Rule: rule}
		}
	}
	for i := range r.DenyIf {
		rule := &r.DenyIf[i]
		if skip(rule) {
			continue
		}
		if m, sure := rule.matches(f); !sure {
			return Judgement{Deny: true, Reason: unsure(rule), Rule: rule}
		} else if m {
			reason := rule.OnDeny
			if reason == "" {
				reason = "the call matches the policy's rule " + rule.field + " (" + rule.Describe() + ")"
			}
			return Judgement{Deny: true, Reason: reason, Rule: rule}
		}
	}
	for i := range r.ApproveIf {
		rule := &r.ApproveIf[i]
		if skip(rule) {
			continue
		}
		if m, sure := rule.matches(f); m || !sure {
			by := rule.By
			if by == "" {
				by = ApproveByUser
			}
			reason := rule.Reason
			if reason == "" {
				reason = "the call matches " + rule.field + " (" + rule.Describe() + ")"
			}
			return Judgement{Approve: true, By: by, Reason: reason, Rule: rule}
		}
	}
	return Judgement{}
}

// NeedsCode reports whether the rules of tool name facts of its code, so
// that they must be derived before the rules can be applied.
func (p *Policy) NeedsCode(tool string) bool {
	r := p.rule(tool)
	if r == nil {
		return false
	}
	for _, list := range [][]Rule{r.Require, r.DenyIf, r.ApproveIf} {
		for _, rule := range list {
			for _, c := range rule.Conditions {
				if c.root == RootCode {
					return true
				}
			}
		}
	}
	return false
}

// HasRules reports whether tool has argument rules at all.
func (p *Policy) HasRules(tool string) bool {
	r := p.rule(tool)
	return r != nil && len(r.Require)+len(r.DenyIf)+len(r.ApproveIf) > 0
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

// maxRules bounds the rules of one list and the conditions of one rule:
// every call evaluates them.
const maxRules = 64

func (v *validator) rules(field string, x any, kind string) []Rule {
	list, ok := x.([]any)
	if !ok {
		v.fail(field, "want a list of rules, each {conditions: [{path, op, value}, ...]}, got %s", show(x))
		return nil
	}
	if len(list) > maxRules {
		v.fail(field, "more than %d rules", maxRules)
		return nil
	}
	out := make([]Rule, 0, len(list))
	for i, item := range list {
		f := fmt.Sprintf("%s[%d]", field, i)
		allowed := []string{"conditions", "on_deny"}
		if kind == "approve_if" {
			allowed = []string{"conditions", "reason", "by"}
		}
		m := v.object(f, item, allowed...)
		if m == nil {
			continue
		}
		r := Rule{field: f}
		for _, key := range []string{"on_deny", "reason"} {
			if s, ok := m[key]; ok {
				text, _ := v.str(f+"."+key, s)
				if len(text) > 1000 {
					v.fail(f+"."+key, "longer than 1000 characters")
				}
				if key == "on_deny" {
					r.OnDeny = text
				} else {
					r.Reason = text
				}
			}
		}
		if b, ok := m["by"]; ok {
			r.By, _ = v.str(f+".by", b)
			if r.By != ApproveByUser && r.By != ApproveByOperator {
				v.fail(f+".by", "%q is not who approves; want user (the agent's user, asked through MCP) or operator (in the console)", r.By)
			}
		}
		if c, ok := m["conditions"]; ok {
			cl, ok := c.([]any)
			if !ok {
				v.fail(f+".conditions", "want a list of conditions ({path, op, value}), got %s", show(c))
				continue
			}
			if len(cl) > maxRules {
				v.fail(f+".conditions", "more than %d conditions", maxRules)
				continue
			}
			for j, cx := range cl {
				r.Conditions = append(r.Conditions, v.condition(fmt.Sprintf("%s.conditions[%d]", f, j), cx))
			}
		} else if kind != "deny_if" {
			// An empty deny_if rule is the gateway's "always deny"; a
			// require or approve_if without conditions is more likely a
			// mistake than "always".
			v.fail(f+".conditions", "missing; a %s rule needs at least one condition", kind)
		}
		out = append(out, r)
	}
	return out
}

func (v *validator) condition(field string, x any) Condition {
	m := v.object(field, x, "path", "op", "value")
	var c Condition
	if m == nil {
		return c
	}
	c.Path, _ = v.str(field+".path", m["path"])
	c.Op, _ = v.str(field+".op", m["op"])
	c.Value = m["value"]
	root, rest, _ := strings.Cut(c.Path, ".")
	switch {
	case root != RootArgs && root != RootCode || rest == "":
		v.fail(field+".path", "%q is not a path; want args.NAME (an argument of the call, args.a.b for a nested one) or code.FACT (a fact of a code tool's code: %s)", c.Path, strings.Join(CodeFacts, ", "))
		return c
	case len(c.Path) > 500:
		v.fail(field+".path", "longer than 500 characters")
	case root == RootCode && !slices.Contains(CodeFacts, rest):
		v.fail(field+".path", "%q is not a fact of code; the facts are %s", rest, strings.Join(CodeFacts, ", "))
	}
	c.root, c.keys = root, strings.Split(rest, ".")
	if slices.Contains(c.keys, "") {
		v.fail(field+".path", "%q has an empty name between dots", c.Path)
	}
	if !slices.Contains(operators, c.Op) {
		v.fail(field+".op", "%q is not an operator; want one of %s", c.Op, strings.Join(operators, ", "))
		return c
	}
	if _, ok := m["value"]; !ok {
		if c.Op == "exists" {
			v.fail(field+".value", "missing; exists needs true (the path leads to a value) or false (it does not)")
		} else {
			v.fail(field+".value", "missing; %s compares the argument with a value", c.Op)
		}
		return c
	}
	if root == RootCode && slices.Contains(listFacts, rest) && c.Op != "contains" && c.Op != "exists" {
		v.fail(field+".op", "code.%s is a list of names, so %q means nothing on it; use contains (one of them is the value, e.g. {path: code.%s, op: contains, value: socket}) or exists (true: the list is not empty)", rest, c.Op, rest)
		return c
	}
	switch c.Op {
	case "lt", "lte", "gt", "gte":
		if _, ok := number(c.Value); !ok {
			v.fail(field+".value", "operator %q needs a number, got %s", c.Op, show(c.Value))
		}
	case "in", "not_in":
		list, ok := c.Value.([]any)
		if !ok {
			v.fail(field+".value", "operator %q needs a list, got %s", c.Op, show(c.Value))
		} else if len(list) > 1000 {
			v.fail(field+".value", "more than 1000 values")
		}
	case "exists":
		if _, ok := c.Value.(bool); !ok {
			v.fail(field+".value", "operator \"exists\" needs true or false, got %s", show(c.Value))
		}
	case "regex":
		s, ok := c.Value.(string)
		if !ok {
			v.fail(field+".value", "operator \"regex\" needs a string, got %s", show(c.Value))
			break
		}
		if len(s) > maxPattern {
			v.fail(field+".value", "a pattern of %d bytes; the limit is %d (every call is matched against it)", len(s), maxPattern)
			break
		}
		re, err := regexp.Compile(s)
		if err != nil {
			v.fail(field+".value", "invalid regex %q: %v", s, err)
			break
		}
		c.re = re
	case "contains":
		switch c.Value.(type) {
		case map[string]any, []any:
			v.fail(field+".value", "operator \"contains\" needs a string (a substring) or a single value (an element of a list), got %s", show(c.Value))
		}
	}
	return c
}

// maxPattern bounds a regex: matching costs its size times the text's.
const maxPattern = 1024

// hideAll is the hide entry that hides every tool.
const hideAll = "*"

func (v *validator) hide(field string, x any) []string {
	list, ok := x.([]any)
	if !ok {
		v.fail(field, "want a list of tool names, got %s", show(x))
		return nil
	}
	var out []string
	for i, item := range list {
		f := fmt.Sprintf("%s[%d]", field, i)
		name, ok := v.str(f, item)
		switch {
		case !ok:
		case name == "":
			v.fail(f, "entry must not be empty")
		case slices.Contains(out, name):
			v.fail(f, "duplicate entry %q", name)
		case name != hideAll && !knownTool(name, v.tools):
			v.fail(f, "this server has no such tool; its tools are %s", strings.Join(v.tools, ", "))
		default:
			out = append(out, name)
		}
	}
	return out
}

func (v *validator) allTools(field string, x any) []Limit {
	m := v.object(field, x, "limits")
	if m == nil {
		return nil
	}
	l, ok := m["limits"]
	if !ok {
		return nil
	}
	list, ok := l.([]any)
	if !ok {
		v.fail(field+".limits", "want a list, got %s", kind(l))
		return nil
	}
	var out []Limit
	for i, item := range list {
		out = append(out, v.limit(fmt.Sprintf("%s.limits[%d]", field, i), item))
	}
	return out
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

// Root is where a condition's path starts (RootArgs or RootCode), and
// Keys the names after it.
func (c *Condition) Root() string   { return c.root }
func (c *Condition) Keys() []string { return c.keys }

// Rules are a tool's own argument rules, all three kinds, in order.
func (p *Policy) Rules(tool string) []*Rule {
	r := p.Tools[tool]
	if r == nil {
		return nil
	}
	var out []*Rule
	for _, list := range [][]Rule{r.Require, r.DenyIf, r.ApproveIf} {
		for i := range list {
			out = append(out, &list[i])
		}
	}
	return out
}
