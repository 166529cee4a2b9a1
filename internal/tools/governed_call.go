package tools

// What governance (internal/govern) is given of an MCP call: the call
// itself, what its parsed input amounts to, how its user can be asked,
// and the words for the limits a run gets; and the policy's rules that
// cannot take effect on this server.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/govern"
	"github.com/pysandbox/pysandbox/internal/policy"
)

// callOf is a request as governance sees it.
func callOf(req *mcp.CallToolRequest) govern.Call {
	c := govern.Call{Tool: req.Params.Name, Identity: identity(req), Args: req.Params.Arguments,
		Session: argString(req.Params.Arguments, "session_id", "sandbox_id"), Code: argString(req.Params.Arguments, "code", "python_code", "script", "command")}
	if !authenticated(req) {
		// Callers without a token are told apart only by their MCP
		// session, which costs nothing to open: together, they get one
		// identity's share of the operators' queue.
		c.Group = "unauthenticated"
	}
	c.Shared = callerOf(req).anonymous()
	return c
}

// approverOf is how the caller's user can be asked.
func approverOf(ctx context.Context, req *mcp.CallToolRequest) govern.Approver {
	ap := govern.Approver{CanAsk: canElicit(req)}
	if req.Params.RequestState != "" || len(req.Params.InputResponses) > 0 {
		a := &govern.Answer{State: req.Params.RequestState}
		if r, ok := req.Params.InputResponses[approvalKey].(*mcp.ElicitResult); ok && r != nil {
			a.Action = r.Action
		}
		ap.Answer = a
	}
	if tok := req.Params.GetProgressToken(); tok != nil && req.Session != nil {
		n := 0.0
		ap.Wait = func(msg string) {
			n++
			req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: n, Message: msg})
		}
	}
	return ap
}

// canElicit reports whether the client can show a form to its user.
func canElicit(req *mcp.CallToolRequest) bool {
	if req.Session == nil {
		return false
	}
	p := req.Session.InitializeParams()
	if p == nil || p.Capabilities == nil || p.Capabilities.Elicitation == nil {
		return false
	}
	e := p.Capabilities.Elicitation
	// Neither mode named means form, for older clients.
	return e.Form != nil || e.URL == nil
}

// argString is the first of keys a call has as a string argument, or ""
// (profiles name code and sessions their peers' ways: python_code,
// script, command; sandbox_id).
func argString(raw json.RawMessage, keys ...string) string {
	var args map[string]json.RawMessage
	if json.Unmarshal(raw, &args) != nil {
		return ""
	}
	for _, k := range keys {
		var v string
		if json.Unmarshal(args[k], &v) == nil && v != "" {
			return v
		}
	}
	return ""
}

// resultText is a result's text content, as the client sees it.
func resultText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// subjectOf is what a call's parsed input amounts to. A profile's input
// is judged as the native input it stands for (see Governed).
func (s *server) subjectOf(in any) govern.Subject {
	sub := subjectOf(in)
	if sub.Kind == govern.KindRun && sub.Session != "" && sub.PythonVersion == "" {
		// Its facts are derived on the session's interpreter.
		for _, i := range s.sessions.List() {
			if i.ID == sub.Session {
				// As python_version names one: major.minor.
				if parts := strings.SplitN(i.Python, ".", 3); len(parts) >= 2 {
					sub.PythonVersion = parts[0] + "." + parts[1]
				}
			}
		}
	}
	return sub
}

func subjectOf(in any) govern.Subject {
	if gv, ok := in.(Governed); ok {
		in = gv.Governed()
	}
	switch v := in.(type) {
	case RunPythonInput:
		s := govern.Subject{Kind: govern.KindRun, Code: v.Code, Session: v.SessionID, PythonVersion: v.PythonVersion,
			Packages: v.Dependencies, Inputs: v.Inputs}
		if v.TimeoutSeconds > 0 && v.TimeoutSeconds < 1e6 {
			s.Timeout = time.Duration(v.TimeoutSeconds * float64(time.Second))
		}
		return s
	case ValidateScriptInput:
		return govern.Subject{Kind: govern.KindValidate, Code: v.Code, Checks: v.Dependencies}
	case InstallPackageInput:
		return govern.Subject{Kind: govern.KindInstall, Session: v.SessionID, Packages: v.Packages}
	case CreateSessionInput:
		return govern.Subject{Kind: govern.KindSession, PythonVersion: v.PythonVersion, Packages: v.Dependencies}
	}
	return govern.Subject{Detail: in}
}

// deniedError turns an engine refusal of a package (one pulled in as a
// dependency, found during the install) into the policy's refusal.
func deniedError(err error) (*govern.Refusal, bool) {
	var py *engine.PythonDeniedError
	if errors.As(err, &py) {
		return &govern.Refusal{Status: govern.StatusDenied, Message: fmt.Sprintf("The server's policy does not allow this: %s. Nothing was run.", strings.TrimRight(py.Err.Error(), ". ")), ByPolicy: true}, true
	}
	var denied *engine.PackageDeniedError
	if !errors.As(err, &denied) {
		return nil, false
	}
	return &govern.Refusal{Status: govern.StatusDenied, Message: govern.PackageMessage(denied.Err), ByPolicy: true}, true
}

// limitsText describes the limits of a run (for whoever approves it).
func (s *server) limitsText(timeout time.Duration) string {
	cfg := s.eng.Config()
	if timeout <= 0 {
		timeout = cfg.DefaultTimeout
	}
	l := cfg.Limits
	parts := []string{fmt.Sprintf("timeout %s", timeout)}
	if l.MemoryBytes > 0 {
		parts = append(parts, fmt.Sprintf("memory %d MiB", l.MemoryBytes>>20))
	}
	if l.MaxProcs > 0 {
		parts = append(parts, fmt.Sprintf("%d processes", l.MaxProcs))
	}
	if cfg.Backend.Kind() == "none" {
		parts = append(parts, "UNSANDBOXED: the code runs directly on the server's machine")
	} else {
		parts = append(parts, s.networkWords(), "no access to the host's files ("+string(cfg.Backend.Kind())+" sandbox)")
	}
	return strings.Join(parts, ", ")
}

// warnRules logs the policy's rules whose effect is fixed on this
// server, whatever the call: a condition on an argument the tool does not
// have, or on facts of code for a tool that runs none, is the same for
// every call (see policy.Condition.Missing), so its rule never holds or
// holds alone; and an operator's approval without a console refuses.
// Each warning says what the rule does then: a require rule that never
// holds refuses every call, which is no rule "never taking effect".
func (s *server) warnRules() {
	pol := s.gov.Policy()
	for tool, r := range pol.Tools {
		if s.gov.Activity() == nil && (r.By == policy.ApproveByOperator && r.Action == policy.Approve) {
			s.log.Warn("policy rule never takes effect", "rule", "tools."+tool+".by", "why", "an operator must approve, and this server has no console (--console): every call is refused")
		}
		v, ok := s.argNames.Load(tool)
		props, _ := v.(map[string]bool)
		// Each rule with its kind, in the file's order of kinds.
		for _, kl := range []struct {
			kind  string
			rules []policy.Rule
		}{{"require", r.Require}, {"deny_if", r.DenyIf}, {"approve_if", r.ApproveIf}} {
			for i := range kl.rules {
				s.warnRule(tool, kl.kind, &kl.rules[i], props, ok)
			}
		}
	}
}

// warnRule logs what one rule of kind does when its effect is fixed (see
// warnRules); props are the tool's arguments, when known.
func (s *server) warnRule(tool, kind string, rule *policy.Rule, props map[string]bool, ok bool) {
	refused := rule.By == policy.ApproveByOperator && s.gov.Activity() == nil
	if refused {
		s.log.Warn("policy rule never takes effect", "rule", rule.Field(), "why", "an operator must approve, and this server has no console (--console): every matching call is refused")
	}
	// The conditions fixed here, with why; the rule's effect is
	// worked out from all of them together.
	type fixed struct {
		field, why string
		holds      bool
	}
	var fx []fixed
	for i, c := range rule.Conditions {
		var why string
		switch {
		case c.Root() == policy.RootCode && slices.Contains(Names, tool) && tool != "run_python" && tool != "validate_script":
			why = tool + " runs no code, so code facts are never there"
		case c.Root() == policy.RootArgs && ok && len(c.Keys()) > 0 && !props[c.Keys()[0]]:
			names := make([]string, 0, len(props))
			for k := range props {
				names = append(names, k)
			}
			slices.Sort(names)
			why = fmt.Sprintf("%s has no argument %q (its arguments are %s)", tool, c.Keys()[0], strings.Join(names, ", "))
		default:
			continue
		}
		fx = append(fx, fixed{fmt.Sprintf("%s.conditions[%d].path", rule.Field(), i), why, c.Missing()})
	}
	never := slices.IndexFunc(fx, func(f fixed) bool { return !f.holds })
	switch {
	case never >= 0:
		// One condition that never holds decides the rule.
		msg, effect := fixedRule(kind, tool, false, true, refused)
		s.log.Warn(msg, "rule", fx[never].field, "why", fx[never].why+": "+effect)
	case len(fx) > 0 && len(fx) == len(rule.Conditions):
		msg, effect := fixedRule(kind, tool, true, true, refused)
		s.log.Warn(msg, "rule", fx[0].field, "why", fx[0].why+": "+effect)
	default:
		for _, f := range fx {
			msg, effect := fixedRule(kind, tool, true, false, refused)
			s.log.Warn(msg, "rule", f.field, "why", f.why+": "+effect)
		}
	}
}

// fixedRule says what a rule of kind does when one of its conditions is
// the same for every call (holds), alone deciding it or with every other
// condition fixed as well; refused is an operator's approval that no
// console can give: the log message and the effect.
func fixedRule(kind, tool string, holds, alone, refused bool) (msg, effect string) {
	switch {
	case !holds && kind == "require":
		return "policy rule refuses every call", "the condition never holds, so the rule never does, and every " + tool + " call is refused"
	case !holds:
		return "policy rule never takes effect", "the condition never holds, so the rule never matches"
	case !alone:
		return "policy condition tests nothing", "the condition holds for every call, so the rule is decided by its other conditions alone"
	case kind == "require":
		return "policy rule never takes effect", "the condition holds for every call, so the rule always does"
	case kind == "deny_if":
		return "policy rule refuses every call", "the condition holds for every call, so every " + tool + " call is refused"
	case refused:
		return "policy rule refuses every call", "the condition holds for every call, so every " + tool + " call needs an operator's approval, which this server without a console cannot give"
	}
	return "policy rule asks for every call", "the condition holds for every call, so every " + tool + " call waits for an approval"
}
