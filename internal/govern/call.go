package govern

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/pysandbox/pysandbox/internal/activity"
	"github.com/pysandbox/pysandbox/internal/audit"
	"github.com/pysandbox/pysandbox/internal/policy"
	"github.com/pysandbox/pysandbox/internal/tracing"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Status is what a refused call's result says happened (its structured
// status): what only governance and the layers around a run produce.
type Status string

const (
	StatusInvalidRequest Status = "invalid_request" // the arguments: fix them
	StatusDenied         Status = "denied"          // the server's policy
	StatusBusy           Status = "busy"            // retry shortly
	StatusQuota          Status = "quota"           // the caller's own quota
	StatusSandboxError   Status = "sandbox_error"   // the sandbox failed to start
	StatusCancelled      Status = "cancelled"       // the caller went away
	StatusInstallError   Status = "install_error"   // a package did not install
)

// Refusal is a call refused before anything ran: its status, and the
// message the agent reads (what happened and what to do next).
type Refusal struct {
	Status  Status
	Message string
	// ByPolicy says the policy refused it where only the run could tell
	// (a package pulled in as a dependency): recorded as a denial.
	ByPolicy bool
}

// Call is one tool call as it arrived: its arguments are raw, and hostile.
type Call struct {
	Tool     string
	Identity string
	Args     json.RawMessage
	// Group puts the operators' approvals of callers who cannot be told
	// apart (no token) in one share of the queue; "" for others.
	Group string
	// Session and Code are shown in the console's live view.
	Session, Code string
	// NoAsk says nobody can be asked to approve this call (a resource
	// read): a rule that asks refuses instead.
	NoAsk bool
	// Shared says Identity stands for callers the server cannot tell
	// apart (HTTP without a token): what one call's code taught the
	// server (its facts) is not kept for the next, or how soon a call is
	// decided would tell one of them what code another sent.
	Shared bool
}

// Ticket is an admitted call, until it ends.
type Ticket struct {
	g       *Governor
	call    Call
	rec     *audit.Record
	start   time.Time
	span    trace.Span
	endLive func()
	// What was decided, for the record and the metrics: decision "" is
	// the policy's plain allow; rule names what refused (tool, default,
	// package, approval, rule) for the denial metric.
	decision, reason, rule string
	reservation            policy.Reservation
	asked                  bool // the first pass of a user's approval
	ended                  bool
	unrecorded             bool // refused because the audit log is broken
	gate                   *gate
}

// ID is the call's id in the audit log and the console (c-HEX).
func (t *Ticket) ID() string { return t.rec.CallID }

// Identity is the caller's identity.
func (t *Ticket) Identity() string { return t.call.Identity }

func newCallID() string {
	var b [8]byte
	rand.Read(b[:])
	return "c-" + hex.EncodeToString(b[:])
}

// Admit starts governing a call: the audit log must work, and the tool
// must not be hidden or denied. The ticket must be ended whether or not
// the call was refused; ctx is the call's from now on (a trace span, and
// the console's stop button when it is admitted).
func (g *Governor) Admit(ctx context.Context, c Call) (context.Context, *Ticket, *Refusal) {
	if a := bytes.TrimSpace(c.Args); len(a) == 0 || string(a) == "null" {
		c.Args = json.RawMessage("{}")
	}
	t := &Ticket{g: g, call: c, start: time.Now(),
		rec: &audit.Record{Event: audit.EventCall, Identity: c.Identity, Tool: c.Tool, CallID: newCallID()}}
	t.rec.Arguments, t.rec.CodeSHA256 = AuditArgs(c.Tool, c.Args)
	// A trace of the call (internal/tracing; a no-op without a
	// collector): the policy, queue, sandbox, install and run spans of
	// the layers below are its children.
	ctx, t.span = tracing.Tracer().Start(ctx, "tools/call "+c.Tool, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("mcp.tool.name", c.Tool), attribute.String("pysandbox.call_id", t.rec.CallID), attribute.String("pysandbox.identity", c.Identity)))
	if err := g.Broken(); err != nil {
		// It cannot be recorded: End only counts it.
		t.unrecorded = true
		return ctx, t, &Refusal{Status: StatusDenied, Message: "This server cannot record tool calls in its audit log (" + err.Error() + "), so it refuses them. Nothing was run; tell the server's operator."}
	}
	pol := g.Policy()
	if d := pol.Decide(c.Tool); d.Action == policy.Deny {
		reason := d.Reason
		rule := "tool"
		switch {
		case d.Hidden:
			rule = "hide"
		case pol.Tools[c.Tool] == nil:
			rule = "default"
		}
		if reason == "" {
			reason = "the policy denies it"
		}
		return ctx, t, t.deny(reason, rule, fmt.Sprintf("The server's policy does not allow %s: %s. Nothing was run. Do not retry; use another tool, or ask the user to change the server's policy.", c.Tool, reason))
	}
	// In flight: the console shows it and an operator may stop it (its
	// context then ends with an activity.Killed cause).
	ctx, t.endLive = g.activity.Begin(ctx, activity.Call{ID: t.rec.CallID, Identity: c.Identity, Tool: c.Tool, Session: c.Session, Code: c.Code})
	return ctx, t, nil
}

// Rule names what refused the call, once something did: tool, default
// or hide (the tool's rule), rule (an argument rule), package, approval;
// "" otherwise.
func (t *Ticket) Rule() string { return t.rule }

// Refuse refuses an admitted call for a reason of the caller's own (an
// argument no call could have): recorded as denied, with the reason as
// what the agent reads.
func (t *Ticket) Refuse(reason string) *Refusal {
	t.decision, t.reason = "deny", reason
	return &Refusal{Status: StatusInvalidRequest, Message: reason}
}

// deny notes a refusal by the policy and returns it.
func (t *Ticket) deny(reason, rule, msg string) *Refusal {
	t.decision, t.reason, t.rule = "deny", reason, rule
	return &Refusal{Status: StatusDenied, Message: msg}
}

// Outcome is what happened to a call that was admitted and checked.
type Outcome struct {
	// Refused is set when nothing ran after all (a quota, a bad argument,
	// a sandbox that could not start), with what the agent was told.
	Refused *Refusal
	// Failed is a protocol error: the call could not be answered.
	Failed error
	// What ran: its status (success, error, timeout, ...; "ok" for a
	// tool that has none), and what the sandbox measured.
	Status          string
	ExitCode        *int
	PeakMemoryBytes int64
	CPUTimeMS       int64
	LimitsHit       []string
	// Error is the text the agent saw when the call failed.
	Error string
	// Killed names who stopped the call from the console, when one did.
	Killed string
}

// Limits a run hit, in records' limits_hit.
const (
	HitTimeout = "timeout"
	HitMemory  = "memory"
	HitOutput  = "output"
)

// KilledBy names who stopped the call from the console ("stopped by
// operator NAME"), or is "": ctx is the call's, parent the request's
// (which ends when the client goes away instead).
func KilledBy(ctx, parent context.Context) string {
	var k *activity.Killed
	if parent.Err() == nil && errors.As(context.Cause(ctx), &k) {
		return k.Error()
	}
	return ""
}

// End records the call, and must be called once for every ticket. An
// error means the record could not be written: the result must then be
// withheld.
func (t *Ticket) End(o Outcome) error {
	if t.ended {
		return nil
	}
	t.ended = true
	if t.endLive != nil {
		t.endLive()
	}
	g, rec := t.g, t.rec
	rec.Decision, rec.Reason = t.decision, t.reason
	if rec.Decision == "" {
		rec.Decision = "allow"
	}
	ran := true
	switch {
	case t.asked:
		// The first pass of an approval: nothing ran yet, and the
		// retry will be counted.
		rec.Decision = "approval_requested"
		t.cancel()
		ran = false
	case rec.Decision == "declined":
		// Nothing ran, but the user was asked: that counts, so the
		// limits also bound how often an agent can ask.
		ran = false
		g.denied(rec.Tool, t.rule)
	case rec.Decision == "rate_limited":
		ran = false
	case rec.Decision != "allow" && rec.Decision != "approved":
		// Refused by a rule, or approval impossible: nothing ran and
		// nobody was bothered.
		t.cancel()
		ran = false
		g.denied(rec.Tool, t.rule)
	case o.Refused != nil && o.Refused.ByPolicy:
		rec.Decision, rec.Reason = "deny", o.Refused.Message
		t.cancel()
		ran = false
		g.metrics.Denied(rec.Tool, "package")
	}
	if o.Killed != "" {
		rec.Reason = o.Killed
	}
	switch {
	case o.Failed != nil:
		rec.Status, rec.Error = "protocol_error", o.Failed.Error()
	case t.asked:
	case !ran && o.Refused != nil:
		rec.Error = o.Refused.Message
	case o.Refused != nil:
		// Nothing ran after all (a quota, a bad argument): the status
		// says why. It passed the policy, so it counts against the
		// limits, as the gateway counts a call its server answered with
		// an error (it gives the count back only for a protocol error).
		rec.Status, rec.Error = string(o.Refused.Status), o.Refused.Message
	case ran:
		rec.Status, rec.ExitCode, rec.PeakMemoryBytes, rec.CPUTimeMS = o.Status, o.ExitCode, o.PeakMemoryBytes, o.CPUTimeMS
		rec.LimitsHit = append(rec.LimitsHit, o.LimitsHit...)
		if rec.Status == "" {
			rec.Status = "ok"
		}
		rec.Error = o.Error
	}
	t.span.SetAttributes(attribute.String("pysandbox.decision", rec.Decision), attribute.String("pysandbox.status", rec.Status))
	if rec.Status == "error" || rec.Status == "protocol_error" {
		t.span.SetStatus(codes.Error, rec.Status)
	}
	t.span.End()
	g.activity.Finish(activity.Done{ID: rec.CallID, Identity: rec.Identity, Tool: rec.Tool, Decision: rec.Decision,
		Status: rec.Status, DurationMS: time.Since(t.start).Milliseconds()})
	if t.unrecorded {
		g.metrics.Call(rec.Tool, "deny", false, time.Since(t.start), "")
		return nil
	}
	return g.record(rec, t.start, ran && o.Refused == nil)
}

func (g *Governor) denied(tool, rule string) {
	if rule != "" {
		g.metrics.Denied(tool, rule)
	}
}

func (t *Ticket) cancel() {
	if t.reservation != nil {
		t.reservation.Cancel()
		t.reservation = nil
	}
}

// record counts a call and writes its audit record, which is on disk
// before the client gets the result. After a failed write every later
// call is refused.
func (g *Governor) record(rec *audit.Record, start time.Time, ran bool) error {
	rec.DurationMS = time.Since(start).Milliseconds()
	runStatus := ""
	if rec.Tool == "run_python" && ran {
		runStatus = rec.Status
		g.metrics.CPU(time.Duration(rec.CPUTimeMS) * time.Millisecond)
	}
	for _, l := range rec.LimitsHit {
		if !strings.HasPrefix(l, "rate:") {
			g.metrics.LimitHit(l)
		}
	}
	g.metrics.Call(rec.Tool, rec.Decision, ran, time.Since(start), runStatus)
	return g.Append(rec)
}

// Error makes a refusal an error: a handler returns it as one.
func (r *Refusal) Error() string { return string(r.Status) + ": " + r.Message }
