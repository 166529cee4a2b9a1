package policy

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
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

// Root is where a condition's path starts (RootArgs or RootCode), and
// Keys the names after it.
func (c *Condition) Root() string   { return c.root }
func (c *Condition) Keys() []string { return c.keys }

// Missing is what the condition is on a call where its path leads
// nowhere: false for every operator but exists, which is its value's
// opposite (exists: false holds).
func (c *Condition) Missing() bool { return c.test(nil, false) }
