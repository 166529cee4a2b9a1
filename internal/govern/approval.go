package govern

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/pysandbox/pysandbox/internal/activity"
	"github.com/pysandbox/pysandbox/internal/policy"
)

// question is what a human is asked to approve.
type question struct {
	tool    string
	subject Subject
	pkgs    []requested
	why     string // the approve_if rule that asks, when one does
	facts   string // the code's facts, when a rule looked at them
	limits  []policy.Limit
}

// userApproval implements approval by the user: nothing with side
// effects happens until the user accepted this exact request, bound to
// the caller and its arguments by sealed state.
func (t *Ticket) userApproval(q question, ap Approver) Verdict {
	g, tool := t.g, t.call.Tool
	if g.sealer == nil {
		return Verdict{Refusal: t.deny("approvals are unavailable", "approval", "This call needs a user's approval, and this server cannot issue approvals right now. Nothing was run.")}
	}
	if a := ap.Answer; a != nil {
		// An answer, genuine only if its state opens and matches.
		err := g.sealer.Open(a.State, tool, t.call.Identity, t.call.Args)
		if err == nil {
			switch a.Action {
			case "accept":
				t.decision, t.reason = "approved", "the user approved it"
				return Verdict{}
			case "":
				err = errors.New("the answer to the approval request is missing")
			default:
				t.decision, t.reason, t.rule = "declined", "the user answered "+a.Action, "approval"
				return Verdict{Refusal: &Refusal{Status: StatusDenied, Message: fmt.Sprintf("The user did not approve this %s call (%s). Nothing was run. Do not retry the same call unless the user asks for it.", tool, a.Action)}}
			}
		}
		// A made-up, stale or reused answer is not an approval: ask the
		// user properly instead.
		g.log.Warn("ignored an approval answer", "tool", tool, "identity", t.call.Identity, "err", err)
	}
	if !ap.CanAsk {
		return Verdict{Refusal: t.deny("approval required, but the client cannot ask the user (no elicitation support)", "approval",
			fmt.Sprintf("The server's policy requires the user to approve this %s call, and this client cannot ask the user (it does not support MCP elicitation). Nothing was run. Use a client that supports elicitation, or ask the user to change the server's policy.", tool))}
	}
	state, err := g.sealer.Seal(tool, t.call.Identity, t.call.Args)
	if err != nil {
		t.decision, t.reason, t.rule = "deny", "could not seal the approval request: "+err.Error(), "approval"
		return Verdict{Refusal: &Refusal{Status: StatusBusy, Message: "The approval request could not be prepared. Nothing was run; try again."}}
	}
	t.asked = true
	return Verdict{Ask: &Ask{Message: t.approvalMessage(q), State: state}}
}

// operatorWait bounds how long a call waits for an operator.
const operatorWait = 10 * time.Minute

// operatorApproval implements approval by an operator: the call waits,
// telling its client so, until an operator decides in the console. It
// works for any client, headless ones included; the answer is bound to
// this call and used once.
func (t *Ticket) operatorApproval(ctx context.Context, q question, ap Approver) *Refusal {
	g, tool := t.g, t.call.Tool
	if g.activity == nil {
		return t.deny("approval by an operator required, and this server has no console", "approval",
			fmt.Sprintf("The server's policy requires an operator to approve this %s call, and this server has no operator console (--console). Nothing was run; tell the server's operator.", tool))
	}
	wctx, cancel := context.WithTimeout(ctx, operatorWait)
	defer cancel()
	if ap.Wait != nil {
		// Until the decision: the client (and its user) knows why the
		// call takes time.
		go func() {
			tick := time.NewTicker(5 * time.Second)
			defer tick.Stop()
			for {
				ap.Wait("waiting for an operator to approve this " + tool + " call in the pysandbox console")
				select {
				case <-wctx.Done():
					return
				case <-tick.C:
				}
			}
		}()
	}
	facts, code, detail := t.approvalParts(q)
	digest := sha256.Sum256(t.call.Args)
	a := activity.Approval{ID: t.ID(), Identity: t.call.Identity, Tool: tool, Facts: facts,
		Code: strings.ToValidUTF8(code, "\ufffd"), Detail: strings.ToValidUTF8(detail, "\ufffd"), Digest: hex.EncodeToString(digest[:]), Group: t.call.Group}
	if len(a.Detail) > maxApprovalDetail {
		a.Detail, a.DetailCut = clip(a.Detail, maxApprovalDetail, detail), true
	}
	ok, by, err := g.activity.Await(wctx, a)
	switch {
	case errors.Is(err, activity.ErrTooManyWaiting):
		t.decision, t.reason, t.rule = "deny", err.Error(), "approval"
		return &Refusal{Status: StatusBusy, Message: fmt.Sprintf("Refused: %v. Nothing was run; wait until an operator has decided your earlier calls.", err)}
	case err != nil && ctx.Err() != nil:
		t.decision, t.reason, t.rule = "declined", "the call was cancelled while it waited for an operator", "approval"
		return &Refusal{Status: StatusCancelled, Message: "The call was cancelled while it waited for an operator's approval. Nothing was run."}
	case err != nil:
		t.decision, t.reason, t.rule = "declined", "no operator decided within "+operatorWait.String(), "approval"
		return &Refusal{Status: StatusDenied, Message: fmt.Sprintf("No operator approved this %s call within %s. Nothing was run; ask the server's operator.", tool, operatorWait)}
	case !ok:
		t.decision, t.reason, t.rule = "declined", "operator "+by+" declined it", "approval"
		return &Refusal{Status: StatusDenied, Message: fmt.Sprintf("Operator %s declined this %s call. Nothing was run. Do not retry it unless asked to.", by, tool)}
	}
	t.decision, t.reason = "approved", "approved by operator "+by
	return nil
}

// maxApprovalCode is how much code the approval message shows; the rest
// is summarised (the full code is in the audit log).
const maxApprovalCode = 8 << 10

// maxApprovalDetail bounds the values an operator is shown whole (a
// longer one is cut, and the console says so).
const maxApprovalDetail = 256 << 10

// approvalMessage tells the user what they are approving: the tool, why
// it is asked, the code or packages, and the limits it will run under.
func (t *Ticket) approvalMessage(q question) string {
	facts, code, detail := t.approvalParts(q)
	var b strings.Builder
	fmt.Fprintf(&b, "An AI agent wants to call %s on pysandbox. Approve?\n", q.tool)
	// The facts first: a long program cannot push them out of view.
	b.WriteString(facts)
	if detail != "" {
		b.WriteString("\n" + clip("Values:\n"+detail, maxApprovalCode, detail))
	}
	if code != "" || q.subject.Kind == KindRun {
		b.WriteString("\n" + clip("Code:\n"+strings.ToValidUTF8(code, "?"), maxApprovalCode, code))
	}
	return b.String()
}

// approvalParts are what a call will do: its facts (why it is asked,
// session, Python, inputs, packages, what the code does, limits), one
// per line; its code; and the values of its other arguments (a run's
// inputs, which become variables the code uses; an upload's path and
// content), as indented JSON.
func (t *Ticket) approvalParts(q question) (facts, code, detail string) {
	var b strings.Builder
	s := q.subject
	if q.why != "" {
		fmt.Fprintf(&b, "Asked because: %s\n", oneLine(q.why))
	}
	switch s.Kind {
	case KindRun:
		if s.Session != "" {
			fmt.Fprintf(&b, "Session: %s (its variables and files persist)\n", oneLine(s.Session))
		}
		if s.PythonVersion != "" {
			fmt.Fprintf(&b, "Python: %s\n", oneLine(s.PythonVersion))
		}
		code = s.Code
		if len(s.Inputs) > 0 {
			keys := make([]string, 0, len(s.Inputs))
			for k := range s.Inputs {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			fmt.Fprintf(&b, "Inputs (global variables of the code): %s\n", oneLine(strings.Join(keys, ", ")))
			detail = indented(s.Inputs)
		}
	case KindValidate:
		code = s.Code
		b.WriteString("Checks the code without running it\n")
		if len(s.Checks) > 0 {
			fmt.Fprintf(&b, "Dependencies to check: %s\n", oneLine(strings.Join(s.Checks, ", ")))
		}
	case KindInstall:
		fmt.Fprintf(&b, "Session: %s\n", oneLine(s.Session))
	case KindSession:
		if s.PythonVersion != "" {
			fmt.Fprintf(&b, "Python: %s\n", oneLine(s.PythonVersion))
		}
	default:
		detail = indented(s.Detail)
	}
	if len(q.pkgs) > 0 {
		names := make([]string, len(q.pkgs))
		for i, p := range q.pkgs {
			names[i] = p.spec
		}
		fmt.Fprintf(&b, "Packages to install: %s\n", oneLine(strings.Join(names, ", ")))
	}
	if q.facts != "" {
		fmt.Fprintf(&b, "What the code does, by Python's parser (a tripwire, not a boundary): %s\n", oneLine(q.facts))
	}
	b.WriteString("Limits: " + t.g.sandbox.Limits(s.Timeout))
	if len(q.limits) > 0 {
		var ls []string
		for _, l := range q.limits {
			ls = append(ls, l.String())
		}
		fmt.Fprintf(&b, "\nRate limits: %s", strings.Join(ls, "; "))
	}
	return b.String(), code, detail
}

// clip cuts text to n bytes, saying how much is not shown and the SHA-256
// of what it stands for.
func clip(text string, n int, of string) string {
	if len(text) <= n {
		return text
	}
	head := text[:n]
	for len(head) > 0 && !utf8.ValidString(head[max(0, len(head)-3):]) {
		head = head[:len(head)-1]
	}
	sum := sha256.Sum256([]byte(of))
	return head + fmt.Sprintf("\n... (%d more bytes not shown; SHA-256 %s)", len(text)-len(head), hex.EncodeToString(sum[:])[:16])
}

// oneLine keeps an agent's value on its line of the facts: one holding a
// line break or another control character (which could fake further
// facts) is shown quoted, with those escaped.
func oneLine(v string) string {
	if strings.IndexFunc(v, func(r rune) bool { return unicode.IsControl(r) }) < 0 {
		return v
	}
	return strconv.Quote(v)
}

// indented is v as JSON indented by two spaces, without HTML escapes.
func indented(v any) string {
	b, _ := PlainJSON(v, "  ")
	return string(b)
}
