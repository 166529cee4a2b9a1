package govern

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
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
	// Gate, when set, must be the run's worker.Request.Gate: the code's
	// facts come from its own sandbox, and the call is decided there,
	// before any of its code runs. After the run, AfterRun says what was
	// decided.
	Gate func(ctx context.Context, code string, facts json.RawMessage) string
	// Rerun (from AfterRun) says to run the call again: an operator
	// approved it.
	Rerun bool
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
	pol := t.g.Policy()
	pkgs := s.packages()
	for _, p := range pkgs {
		if err := pol.Packages.Check(p.name); err != nil {
			return Verdict{Refusal: t.PackageRefusal(err)}
		}
	}
	// Facts a parser gave for the same code of the same caller before
	// (see factsCache): then nothing is left for a gate to decide.
	var known *knownFacts
	codeRules := pol.HasRules(t.call.Tool) && pol.NeedsCode(t.call.Tool) && s.Code != ""
	if t.keepsFacts() && codeRules {
		if facts, summary, ok := t.g.facts.get(t.factKey(s)); ok {
			known = &knownFacts{facts: facts, summary: summary}
		}
	}
	if known == nil && codeRules && s.Kind == KindRun && s.Session == "" && t.g.sandbox.FromRun != nil {
		// The facts come from the run's own sandbox, before its code
		// runs: the rest is decided then (see Gate). Only a fresh one:
		// a session's worker has run the caller's code before, which can
		// have changed what it sends, so a session's run has its facts
		// derived in a sandbox of their own.
		//
		// What the arguments alone decide is decided now, though: before
		// the run's sandbox starts, the engine installs what it needs (its
		// packages, a Python downloaded for it), which a call the policy
		// refuses must not get. A rule that asks a human on the arguments
		// alone is asked before anything too: the facts are then derived
		// in a sandbox of their own, as for a session.
		var f policy.Facts
		dec := json.NewDecoder(bytes.NewReader(t.call.Args))
		dec.UseNumber()
		if dec.Decode(&f.Args) == nil {
			j := pol.JudgeArgs(t.call.Tool, f)
			if j.Deny {
				t.note("rule", j.Rule.Field())
				return Verdict{Refusal: t.deny(j.Reason, "rule", fmt.Sprintf("The server's policy does not allow this %s call: %s. Nothing was run. Do not retry the same call; change it to meet the policy, or ask the user.", t.call.Tool, strings.TrimRight(j.Reason, ". ")))}
			}
			if !j.Approve {
				// The rate limits too, before anything is installed; given
				// back if the code's rules refuse the call.
				if ref := t.reserve(ctx, pol.Decide(t.call.Tool)); ref != nil {
					return Verdict{Refusal: ref}
				}
				t.gate = &gate{subject: s, pkgs: pkgs, ap: ap}
				return Verdict{Gate: t.runGate}
			}
		}
	}
	var f policy.Facts
	summary := ""
	if pol.HasRules(t.call.Tool) {
		var ref *Refusal
		if f, summary, ref = t.facts(ctx, pol, s, known); ref != nil {
			return Verdict{Refusal: ref}
		}
	}
	return t.decide(ctx, pol, s, pkgs, ap, f, summary, false)
}

// reserve takes the call's place in the policy's rate limits (a shared
// store's round trip, with --store), once, even when the call is run again
// after an operator approved it.
func (t *Ticket) reserve(ctx context.Context, d policy.Decision) *Refusal {
	if t.reservation != nil {
		return nil
	}
	g := t.g
	pctx, pspan := tracing.Tracer().Start(ctx, "policy.rate_limits", trace.WithAttributes(attribute.Int("pysandbox.limits", len(d.Limits))))
	res, exceeded, err := g.limiter.Reserve(pctx, d.Limits, t.call.Identity)
	pspan.End()
	switch {
	case err != nil:
		t.decision, t.reason = "error", err.Error()
		return &Refusal{Status: StatusBusy, Message: fmt.Sprintf("Refused: %v. Nothing was run; retry in a moment, and tell the server's operator if it persists.", err)}
	case exceeded != nil:
		t.decision, t.reason = "rate_limited", exceeded.Error()
		t.rec.LimitsHit = []string{RateHit(exceeded)}
		g.metrics.RateLimited(t.call.Tool, exceeded.Limit.Counter)
		return &Refusal{Status: StatusDenied, Message: fmt.Sprintf("Refused: the server's %s. Nothing was run; wait until then before calling %s again.", exceeded.Error(), t.call.Tool)}
	}
	t.reservation = res
	return nil
}

// decide is the rest of Check, once the facts are known: the rules, the
// limits, a human's approval. inRun says the run's sandbox waits: an
// operator's approval is then awaited after it (see AfterRun).
func (t *Ticket) decide(ctx context.Context, pol *policy.Policy, s Subject, pkgs []requested, ap Approver, f policy.Facts, codeSummary string, inRun bool) Verdict {
	d := pol.Decide(t.call.Tool)
	var j policy.Judgement
	if pol.HasRules(t.call.Tool) {
		j = pol.Judge(t.call.Tool, f)
		if j.Rule != nil {
			t.note("rule", j.Rule.Field())
			if codeSummary != "" {
				t.note("code_facts", codeSummary)
			}
		}
	}
	if j.Deny {
		// Reserved ahead of a gate: a call the rules refuse never counts.
		t.cancel()
		return Verdict{Refusal: t.deny(j.Reason, "rule", fmt.Sprintf("The server's policy does not allow this %s call: %s. Nothing was run. Do not retry the same call; change it to meet the policy, or ask the user.", t.call.Tool, strings.TrimRight(j.Reason, ". ")))}
	}
	if ref := t.reserve(ctx, d); ref != nil {
		return Verdict{Refusal: ref}
	}
	why := ""
	by := d.By
	switch {
	case d.Action == policy.Approve && j.Approve:
		// Both ask: the stricter approver, and the rule's reason.
		why = j.Reason
		if j.By == policy.ApproveByOperator {
			by = policy.ApproveByOperator
		}
	case d.Action == policy.Approve:
	case j.Approve:
		by, why = j.By, j.Reason
	default:
		return Verdict{}
	}
	if t.decision == "approved" {
		// An operator approved this call; it runs again now.
		return Verdict{}
	}
	q := question{tool: t.call.Tool, subject: s, pkgs: pkgs, why: why, facts: codeSummary, limits: d.Limits}
	if t.call.NoAsk {
		return Verdict{Refusal: t.deny("approval required, and this request cannot ask for it", "approval",
			fmt.Sprintf("This %s call needs a human's approval under this server's policy, and this request cannot ask for it; use the tool that asks.", t.call.Tool))}
	}
	if by == policy.ApproveByOperator {
		if inRun {
			t.gate.operator = &q
			return Verdict{Refusal: &Refusal{Status: StatusDenied, Message: "waiting for an operator's approval"}}
		}
		return Verdict{Refusal: t.operatorApproval(ctx, q, ap)}
	}
	return t.userApproval(q, ap)
}

// gate is a call whose code's facts come from its run (Check's Verdict
// Gate), until the run asked.
type gate struct {
	subject Subject
	pkgs    []requested
	ap      Approver
	asked   bool    // the run asked (Gate was called)
	verdict Verdict // what Gate decided
	// operator is the question an operator must answer before the call
	// runs again (AfterRun).
	operator *question
}

// runGate decides a gated call from its code's facts, as its run sent
// them: "" lets the code run, anything else is why not (the refusal is
// the ticket's, see AfterRun).
func (t *Ticket) runGate(ctx context.Context, code string, raw json.RawMessage) string {
	gt := t.gate
	if gt == nil || gt.asked {
		return "this call's code was already decided"
	}
	gt.asked = true
	if code != gt.subject.Code {
		// A run of other code than the call's (a tool that runs a program
		// of its own for the call, say): its facts say nothing of the
		// call's code, so they neither decide it nor are kept for it.
		gt.verdict = Verdict{Refusal: t.deny("the run's code is not the code the policy was asked about", "rule",
			fmt.Sprintf("The server's policy looks at the code of %s calls, and this call ran other code than the code it was asked to decide, so nothing was run. This is a fault of the tool, not of your code: tell the server's operator.", t.call.Tool))}
		return gt.verdict.Refusal.Message
	}
	facts, summary, err := t.g.sandbox.FromRun(raw, gt.subject.Code)
	if err != nil {
		gt.verdict = Verdict{Refusal: t.deny("the code's facts could not be derived: "+err.Error(), "rule",
			fmt.Sprintf("The server's policy looks at the code of %s calls, and the code could not be analysed (%v). Nothing was run; retry, or tell the server's operator if it persists.", t.call.Tool, err))}
		return gt.verdict.Refusal.Message
	}
	if t.keepsFacts() && len(gt.subject.Packages) == 0 && facts["dependencies"] == nil {
		// From a sandbox no code had run in, and no package either (one
		// can run code as the interpreter starts, before the worker's
		// parser): what a parser says of this code, worth keeping.
		t.g.facts.put(t.factKey(gt.subject), facts, summary)
	}
	pol := t.g.Policy()
	var f policy.Facts
	dec := json.NewDecoder(bytes.NewReader(t.call.Args))
	dec.UseNumber()
	dec.Decode(&f.Args)
	f.Code = facts
	gt.verdict = t.decide(ctx, pol, gt.subject, gt.pkgs, gt.ap, f, summary, true)
	switch {
	case gt.verdict.Refusal != nil:
		return gt.verdict.Refusal.Message
	case gt.verdict.Ask != nil:
		return "the user's approval is asked first"
	}
	return ""
}

// AfterRun is what the gate of a gated call decided, once its run
// returned: nil when the code was allowed to run (or there was no
// gate). A Verdict with Rerun set means an operator approved the call
// meanwhile: run it again (its gate then lets it through).
//
// ran says the run happened (it has a result): one whose sandbox never
// asked did not go through the gate, so its result is withheld.
func (t *Ticket) AfterRun(ctx context.Context, ran bool) *Verdict {
	gt := t.gate
	if gt == nil {
		return nil
	}
	if !gt.asked {
		if !ran {
			// Refused before its code could be decided (a bad argument,
			// a sandbox that did not start): nothing ran.
			return nil
		}
		t.decision, t.reason, t.rule = "deny", "the run's sandbox did not report its code's facts", "rule"
		return &Verdict{Refusal: &Refusal{Status: StatusSandboxError, Message: "The run's sandbox did not report what its code does before running it, which the server's policy needs, so its result is withheld. Run it again; tell the server's operator if it persists."}}
	}
	if q := gt.operator; q != nil {
		gt.operator = nil
		if ref := t.operatorApproval(ctx, *q, gt.ap); ref != nil {
			return &Verdict{Refusal: ref}
		}
		gt.asked = false
		return &Verdict{Rerun: true}
	}
	if gt.verdict.Refusal == nil && gt.verdict.Ask == nil {
		return nil
	}
	v := gt.verdict
	return &v
}

// note adds a detail to the call's record.
func (t *Ticket) note(key, value string) {
	if t.rec.Detail == nil {
		t.rec.Detail = map[string]string{}
	}
	t.rec.Detail[key] = value
}

// knownFacts are facts of a call's code kept from an earlier call (see
// factsCache), and their summary.
type knownFacts struct {
	facts   map[string]any
	summary string
}

// keepsFacts says the facts of this call's code are looked up and kept:
// with a cache, for a caller the server tells apart from others.
func (t *Ticket) keepsFacts() bool { return t.g.facts != nil && !t.call.Shared }

// factKey is the key of the facts of s's code in the cache: this caller's,
// on the interpreter s asks for.
func (t *Ticket) factKey(s Subject) factKey {
	return newFactKey(t.call.Identity, s.PythonVersion, s.Code)
}

// facts are what the tool's rules look at: the arguments, as sent (with
// exact numbers), and the code's facts when a rule names them: known
// ones when given, else derived in a sandbox of their own.
func (t *Ticket) facts(ctx context.Context, pol *policy.Policy, s Subject, known *knownFacts) (policy.Facts, string, *Refusal) {
	var f policy.Facts
	dec := json.NewDecoder(bytes.NewReader(t.call.Args))
	dec.UseNumber()
	if err := dec.Decode(&f.Args); err != nil {
		return f, "", t.deny("the arguments are not a JSON object", "rule", fmt.Sprintf("The arguments of this %s call are not a JSON object, so the server's policy cannot be applied to them. Nothing was run; send the arguments as an object.", t.call.Tool))
	}
	if !pol.NeedsCode(t.call.Tool) || s.Code == "" {
		return f, "", nil
	}
	if known != nil {
		f.Code = known.facts
		return f, known.summary, nil
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
		next := "retry, or tell the server's operator if it persists"
		if strings.Contains(err.Error(), "more than the") {
			next = "send less code"
		}
		return f, "", t.deny("the code's facts could not be derived: "+err.Error(), "rule",
			fmt.Sprintf("The server's policy looks at the code of %s calls, and the code could not be analysed (%v). Nothing was run; %s.", t.call.Tool, err, next))
	}
	if t.keepsFacts() {
		// A sandbox of their own, no code run in it: worth keeping.
		t.g.facts.put(t.factKey(s), facts, summary)
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
