package govern

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/pysandbox/pysandbox/internal/pep"
	"github.com/pysandbox/pysandbox/internal/policy"
	"github.com/pysandbox/pysandbox/internal/tracing"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// Kind is what a call amounts to, whatever its tool is called.
type Kind int

const (
	KindOther    Kind = iota
	KindRun           // runs code (run_python, a profile's code tool)
	KindValidate      // checks code without running it
	KindInstall       // installs packages into a session
	KindSession       // creates a session
)

// Subject is what a call amounts to, as its tool parsed it: what the
// package rules, the code rules and the human asked to approve look at.
type Subject struct {
	Kind          Kind
	Code          string
	Session       string
	PythonVersion string
	Timeout       time.Duration // 0: the default
	// Packages are the requirements the call would install (a run's
	// dependencies and its PEP 723 block, an install's packages).
	Packages []string
	// Checks are dependencies a validation only checks.
	Checks []string
	// Inputs are a run's inputs (global variables of its code).
	Inputs map[string]any
	// Detail is what a human approving another kind of call is shown of
	// its arguments.
	Detail any
}

// Verdict is what Check decided: proceed (both nil), refuse, or ask the
// user and stop here (the client retries with the answer).
type Verdict struct {
	Refusal *Refusal
	Ask     *Ask
}

// Ask is an approval request for the user: its message, and the sealed
// state the answer must come back with.
type Ask struct {
	Message string
	State   string
}

// Answer is how a call arrived back after an Ask.
type Answer struct {
	State string // the sealed state, as the client returned it
	// Action is the user's answer (accept, decline, cancel); "" when the
	// answer is missing.
	Action string
}

// Approver is how a human can be reached for this call.
type Approver struct {
	// CanAsk says the client can show its user a form (MCP elicitation).
	CanAsk bool
	// Answer is set when the call is a retry that carries an answer.
	Answer *Answer
	// Wait is told, every few seconds, while the call waits for an
	// operator (MCP progress notifications); nil: nobody is told.
	Wait func(message string)
}

// requested is a package a call asks for.
type requested struct{ name, spec string }

// packages parses the subject's requirements; unparsable entries are left
// for the engine to report.
func (s *Subject) packages() []requested {
	specs := s.Packages
	if s.Kind == KindRun {
		if meta, err := pep.ParseScriptMetadata(s.Code); err == nil && meta != nil {
			specs = append(specs[:len(specs):len(specs)], meta.Dependencies...)
		}
	}
	var out []requested
	for _, spec := range specs {
		if r, err := pep.ParseRequirement(spec); err == nil {
			out = append(out, requested{name: r.Normalized, spec: r.String()})
		}
	}
	return out
}

// Check applies what needs the parsed call: the package rules, before
// anything is installed or anyone asked; the rules on its arguments and
// code; the rate limits, which only calls that pass every rule count
// against; and, when the policy or a rule says so, a human's approval.
func (t *Ticket) Check(ctx context.Context, s Subject, ap Approver) Verdict {
	ctx, span := tracing.Tracer().Start(ctx, "policy.check")
	defer span.End()
	g := t.g
	pol := g.Policy()
	pkgs := s.packages()
	for _, p := range pkgs {
		if err := pol.Packages.Check(p.name); err != nil {
			return Verdict{Refusal: t.PackageRefusal(err)}
		}
	}
	d := pol.Decide(t.call.Tool)
	var j policy.Judgement
	var codeSummary string
	if pol.HasRules(t.call.Tool) {
		f, summary, ref := t.facts(ctx, pol, s)
		if ref != nil {
			return Verdict{Refusal: ref}
		}
		codeSummary = summary
		j = pol.Judge(t.call.Tool, f)
		if j.Rule != nil {
			t.note("rule", j.Rule.Field())
			if codeSummary != "" {
				t.note("code_facts", codeSummary)
			}
		}
	}
	if j.Deny {
		return Verdict{Refusal: t.deny(j.Reason, "rule", fmt.Sprintf("The server's policy does not allow this %s call: %s. Nothing was run. Do not retry the same call; change it to meet the policy, or ask the user.", t.call.Tool, j.Reason))}
	}
	// The policy's rate limits (a shared store's round trip, with --store).
	pctx, pspan := tracing.Tracer().Start(ctx, "policy.rate_limits", trace.WithAttributes(attribute.Int("pysandbox.limits", len(d.Limits))))
	res, exceeded, err := g.limiter.Reserve(pctx, d.Limits, t.call.Identity)
	pspan.End()
	switch {
	case err != nil:
		t.decision, t.reason = "error", err.Error()
		return Verdict{Refusal: &Refusal{Status: StatusBusy, Message: fmt.Sprintf("Refused: %v. Nothing was run; retry in a moment, and tell the server's operator if it persists.", err)}}
	case exceeded != nil:
		t.decision, t.reason = "rate_limited", exceeded.Error()
		t.rec.LimitsHit = []string{RateHit(exceeded)}
		g.metrics.RateLimited(t.call.Tool, exceeded.Limit.Counter)
		return Verdict{Refusal: &Refusal{Status: StatusDenied, Message: fmt.Sprintf("Refused: the server's %s. Nothing was run; wait until then before calling %s again.", exceeded.Error(), t.call.Tool)}}
	}
	t.reservation = res
	why := ""
	by := d.By
	switch {
	case d.Action == policy.Approve:
	case j.Approve:
		by, why = j.By, j.Reason
	default:
		return Verdict{}
	}
	q := question{tool: t.call.Tool, subject: s, pkgs: pkgs, why: why, facts: codeSummary, limits: d.Limits}
	if t.call.NoAsk {
		return Verdict{Refusal: t.deny("approval required, and this request cannot ask for it", "approval",
			fmt.Sprintf("This %s call needs a human's approval under this server's policy, and this request cannot ask for it; use the tool that asks.", t.call.Tool))}
	}
	if by == policy.ApproveByOperator {
		return Verdict{Refusal: t.operatorApproval(ctx, q, ap)}
	}
	return t.userApproval(q, ap)
}

// note adds a detail to the call's record.
func (t *Ticket) note(key, value string) {
	if t.rec.Detail == nil {
		t.rec.Detail = map[string]string{}
	}
	t.rec.Detail[key] = value
}

// facts are what the tool's rules look at: the arguments, as sent (with
// exact numbers), and the code's facts when a rule names them.
func (t *Ticket) facts(ctx context.Context, pol *policy.Policy, s Subject) (policy.Facts, string, *Refusal) {
	var f policy.Facts
	dec := json.NewDecoder(bytes.NewReader(t.call.Args))
	dec.UseNumber()
	if err := dec.Decode(&f.Args); err != nil {
		return f, "", t.deny("the arguments are not a JSON object", "rule", fmt.Sprintf("The arguments of this %s call are not a JSON object, so the server's policy cannot be applied to them. Nothing was run; send the arguments as an object.", t.call.Tool))
	}
	if !pol.NeedsCode(t.call.Tool) || s.Code == "" {
		return f, "", nil
	}
	if t.g.sandbox.Facts == nil {
		return f, "", t.deny("the policy's rules name facts of code, and this server cannot derive them", "rule",
			fmt.Sprintf("The server's policy looks at the code of %s calls, and this server cannot analyse code. Nothing was run; tell the server's operator.", t.call.Tool))
	}
	cctx, span := tracing.Tracer().Start(ctx, "policy.code_facts")
	facts, summary, err := t.g.sandbox.Facts(cctx, s.Code, s.PythonVersion)
	span.End()
	if err != nil {
		// Fail closed: a rule that cannot be applied does not allow.
		if ctx.Err() != nil {
			return f, "", &Refusal{Status: StatusCancelled, Message: "The call was cancelled before the code ran."}
		}
		return f, "", t.deny("the code's facts could not be derived: "+err.Error(), "rule",
			fmt.Sprintf("The server's policy looks at the code of %s calls, and the code could not be analysed (%v). Nothing was run; retry, or tell the server's operator if it persists.", t.call.Tool, err))
	}
	f.Code = facts
	return f, summary, nil
}

// PackageRefusal reports a package the policy refuses (err says which
// and why); the engine finds those pulled in as dependencies only while
// installing.
func (t *Ticket) PackageRefusal(err error) *Refusal {
	return t.deny(err.Error(), "package", PackageMessage(err))
}

// PackageMessage is what the agent reads of a package the policy refuses.
func PackageMessage(err error) string {
	return fmt.Sprintf("Refused by the server's package policy: %v. Nothing was installed or run; use only packages the policy allows (check_environment lists the rules).", err)
}

// Judge applies the argument rules of tool to raw arguments: the upstream
// tools code calls, which have no Subject and no code facts.
func (g *Governor) Judge(tool string, args json.RawMessage) (policy.Judgement, error) {
	pol := g.Policy()
	if !pol.HasRules(tool) {
		return policy.Judgement{}, nil
	}
	var f policy.Facts
	dec := json.NewDecoder(bytes.NewReader(args))
	dec.UseNumber()
	if err := dec.Decode(&f.Args); err != nil || f.Args == nil {
		return policy.Judgement{}, fmt.Errorf("the arguments are not a JSON object")
	}
	return pol.Judge(tool, f), nil
}
