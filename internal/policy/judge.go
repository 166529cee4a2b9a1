package policy

import (
	"encoding/json"
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"strings"
)

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
