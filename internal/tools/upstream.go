package tools

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/pysandbox/pysandbox/internal/govern"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/audit"
	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/policy"
	"github.com/pysandbox/pysandbox/internal/upstream"
	"github.com/pysandbox/pysandbox/internal/worker"
)

// Tools from code: a run's Python calls tools of the upstream MCP servers
// (internal/upstream) through its "tools" module. Each call comes up the
// worker's control channel to a toolRun, which decides it under the
// policy (the tool's name is SERVER.TOOL), counts it against the run's
// caps and the rate limits, asks the user when the policy says approve,
// records it in the audit log under the run_python call it was made in,
// and only then forwards it.

// maxToolResultBytes bounds one upstream result as it goes back into the
// sandbox (JSON): the worker reads it whole.
const maxToolResultBytes = 8 << 20

// maxToolRefusalRecords bounds the refused calls of one run that get an
// audit record each; the rest are counted in one summary record.
const maxToolRefusalRecords = 64

// upstreamsOn reports whether code can call upstream tools.
func (s *server) upstreamsOn() bool { return s.up != nil }

// upstreamWords end the server's instructions when code can call tools.
func (s *server) upstreamWords() string {
	if !s.upstreamsOn() {
		return ""
	}
	return " Code in run_python can also call the tools of other MCP servers (import tools; list_tools_in_sandbox shows them), so a single run can gather, combine and filter their results and return only the answer."
}

// toolRun serves one run's tool calls (worker.Tools). A session's run
// gets one too, per call.
type toolRun struct {
	s *server
	// ctx and req are the MCP call the run belongs to: approvals are
	// asked through its client.
	ctx      context.Context
	req      *mcp.CallToolRequest
	identity string
	callID   string
	tool     string // the MCP tool the run came in through (run_python)
	session  string
	limits   policy.UpstreamLimits

	askMu    sync.Mutex // one question to the user at a time
	mu       sync.Mutex
	approved map[string]bool
	usage    ToolUsage
	recorded int            // refusals with a record of their own
	unrec    map[string]int // refusals past the cap, by decision
}

func (s *server) newToolRun(ctx context.Context, req *mcp.CallToolRequest, session string) *toolRun {
	if !s.upstreamsOn() {
		return nil
	}
	return &toolRun{s: s, ctx: ctx, req: req, identity: identity(req), callID: callIDOf(ctx), tool: "run_python",
		session: session, limits: s.gov.Policy().UpstreamLimitsOf(), approved: map[string]bool{}}
}

// tools returns r as a worker.Tools, or nil (a nil *toolRun must not
// become a non-nil interface).
func (r *toolRun) tools() worker.Tools {
	if r == nil {
		return nil
	}
	return r
}

// Usage is what the run did through upstream tools so far.
func (r *toolRun) Usage() *ToolUsage {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	u := r.usage
	u.LimitsHit = append([]string(nil), u.LimitsHit...)
	return &u
}

// Catalog lists the tools the policy lets this caller see: a denied tool
// is not there at all. The module takes it once per run and can call
// only what it lists, so it waits (bounded, and ended with the run) for
// servers still on their first attempt to connect: code run right after
// the server started sees their tools.
func (r *toolRun) Catalog(ctx context.Context) ([]worker.ToolSpec, []worker.ServerStatus) {
	r.s.up.Settle(ctx)
	return r.s.visibleTools()
}

// Call decides, records and forwards one call.
func (r *toolRun) Call(ctx context.Context, name string, args json.RawMessage) worker.ToolReply {
	start := time.Now()
	rec := &audit.Record{Event: audit.EventUpstream, Identity: r.identity, Tool: name, CallID: r.callID}
	server, tool, _ := strings.Cut(name, ".")
	up := &audit.UpstreamCall{Server: server, Tool: tool, Session: r.session, ArgsBytes: len(args)}
	rec.Upstream = up
	// Value by value: a long value is digested, the others stay readable
	// (a path next to a long content).
	rec.Arguments, _ = govern.AuditArgs(name, args)
	reply, decision, limit := r.decideAndCall(ctx, name, args, rec)
	rec.Decision = decision
	if reply.Error != nil {
		rec.Reason = reply.Error.Message
		rec.Status = reply.Error.Kind
	} else {
		rec.Status = "ok"
	}
	if limit != "" {
		rec.LimitsHit = []string{"tools:" + limit}
	}
	up.ResultBytes = int64(len(reply.Structured) + len(reply.Content))
	if reply.Error != nil {
		up.ResultBytes += int64(len(reply.Error.Content))
	}
	rec.DurationMS = time.Since(start).Milliseconds()
	if _, ok := r.s.up.Lookup(name); !ok {
		server = "" // a metric label only for configured servers
	}
	ran := decision == "allow" || decision == "approved"
	var out int64
	if ran {
		out = int64(len(args))
	}
	r.s.gov.Metrics().Upstream(server, decision, 1, out, up.ResultBytes)
	if ran || r.noteRefusal(decision) {
		if err := r.s.gov.Append(rec); err != nil {
			// The call happened but cannot be recorded: its result is
			// withheld, like a tool call's.
			return failure(worker.ToolFailUnavailable, name+": the call could not be recorded in the server's audit log, so its result is withheld")
		}
	}
	return reply
}

// decideAndCall returns the reply, the audit decision, and the limit that
// refused the call, if one did.
func (r *toolRun) decideAndCall(ctx context.Context, name string, args json.RawMessage, rec *audit.Record) (worker.ToolReply, string, string) {
	if err := r.s.gov.Broken(); err != nil {
		return failure(worker.ToolFailUnavailable, "this server cannot record calls in its audit log, so it refuses them; tell the server's operator"), "deny", ""
	}
	// A server that is connecting (just started, or restarting after it
	// stopped) is waited for: being early is no reason to fail.
	if err := r.s.up.Await(ctx, name); err != nil {
		if ctx.Err() != nil {
			return r.waitEnded(ctx, name), "error", ""
		}
		return failure(worker.ToolFailUnavailable, fmt.Sprintf("%s: %v, so its tools cannot be called now; tell the user if it stays so", name, err)), "error", ""
	}
	if _, ok := r.s.up.Lookup(name); !ok {
		if msg, down := r.serverDown(name); down {
			return failure(worker.ToolFailUnavailable, msg), "error", ""
		}
		return failure(worker.ToolFailUnknown, r.unknownMessage(name)), "unknown_tool", ""
	}
	pol := r.s.gov.Policy()
	d := pol.Decide(name)
	if d.Action == policy.Deny {
		reason := d.Reason
		if reason == "" {
			reason = "the policy denies it"
		}
		return failure(worker.ToolFailDenied, fmt.Sprintf("the server's policy does not allow %s: %s; do not retry", name, reason)), "deny", ""
	}
	// The run's caps: counted before anything else costs anything.
	r.mu.Lock()
	if r.usage.Calls >= r.limits.Calls {
		r.hitLocked("calls")
		r.mu.Unlock()
		return failure(worker.ToolFailLimit, fmt.Sprintf("%s: this run has made its %d tool calls (the server's per-run cap)", name, r.limits.Calls)), "limit", "calls"
	}
	if r.usage.BytesIn+r.usage.BytesOut+int64(len(args)) > r.limits.Bytes {
		r.hitLocked("bytes")
		r.mu.Unlock()
		return failure(worker.ToolFailLimit, fmt.Sprintf("%s: this run has moved its %d bytes of tool arguments and results (the server's per-run cap)", name, r.limits.Bytes)), "limit", "bytes"
	}
	r.usage.Calls++
	r.usage.BytesOut += int64(len(args))
	r.mu.Unlock()
	if err := r.s.up.Validate(name, args); err != nil {
		return failure(worker.ToolFailArguments, fmt.Sprintf("%s: %v", name, err)), "invalid_arguments", ""
	}
	// The policy's rules on the call's arguments (require, deny_if,
	// approve_if), before it counts against any limit.
	j, err := r.s.gov.Judge(name, args)
	if err != nil {
		return failure(worker.ToolFailArguments, fmt.Sprintf("%s: %v", name, err)), "invalid_arguments", ""
	}
	if j.Rule != nil {
		rec.Detail = map[string]string{"rule": j.Rule.Field()}
	}
	if j.Deny {
		return failure(worker.ToolFailDenied, fmt.Sprintf("the server's policy does not allow this call of %s: %s; do not retry the same call", name, j.Reason)), "deny", ""
	}
	if d.Action == policy.Approve && d.By == policy.ApproveByOperator {
		return failure(worker.ToolFailDenied, fmt.Sprintf("the server's policy wants an operator to approve each call of %s, and calls from code cannot wait for one; call the tool another way, or ask the user", name)), "deny", ""
	}
	if j.Approve && j.By == policy.ApproveByOperator {
		return failure(worker.ToolFailDenied, fmt.Sprintf("the server's policy wants an operator to approve this call of %s (%s), and calls from code cannot wait for one; call the tool another way, or ask the user", name, j.Reason)), "deny", ""
	}
	reservation, exceeded, err := r.s.gov.Reserve(ctx, d.Limits, r.identity)
	if err != nil {
		return failure(worker.ToolFailUnavailable, fmt.Sprintf("%s: %v; retry in a moment", name, err)), "error", ""
	}
	if exceeded != nil {
		r.s.gov.Metrics().RateLimited(name, exceeded.Limit.Counter)
		rec.LimitsHit = append(rec.LimitsHit, govern.RateHit(exceeded))
		return failure(worker.ToolFailRateLimited, fmt.Sprintf("%s: refused by the server's %s", name, exceeded.Error())), "rate_limited", ""
	}
	decision := "allow"
	if d.Action == policy.Approve || j.Approve {
		if err := r.approve(ctx, name, args, j); err != nil {
			// The user was asked (or could not be): the limits count it,
			// as they do for the server's own tools.
			return failure(worker.ToolFailDeclined, err.Error()), "declined", ""
		}
		decision = "approved"
		// The wait can be long: a policy reloaded meanwhile that denies
		// the tool wins over the answer.
		if d := r.s.gov.Policy().Decide(name); d.Action == policy.Deny {
			reservation.Cancel()
			return failure(worker.ToolFailDenied, fmt.Sprintf("the server's policy no longer allows %s (it was reloaded while the user was asked); do not retry", name)), "deny", ""
		}
	}
	res, err := r.s.up.Call(ctx, name, args)
	if err != nil {
		if errors.Is(err, upstream.ErrNotSent) {
			// Nothing reached the upstream: the rate limit does not count it.
			reservation.Cancel()
			return r.callFailure(ctx, name, err), "error", ""
		}
		// The call went out and may have taken effect upstream, whether
		// it then failed or was cancelled: it was allowed, and it counts.
		return r.callFailure(ctx, name, err), decision, ""
	}
	reply, n, err := toolReply(res)
	r.mu.Lock()
	r.usage.BytesIn += n
	over := r.usage.BytesIn+r.usage.BytesOut > r.limits.Bytes
	if over {
		r.hitLocked("bytes")
	}
	r.mu.Unlock()
	if err != nil {
		return failure(worker.ToolFailLimit, fmt.Sprintf("%s: %v; the result is withheld", name, err)), decision, "result"
	}
	if over {
		return failure(worker.ToolFailLimit, fmt.Sprintf("%s: its result (%d bytes) takes this run past its %d bytes of tool arguments and results (the server's per-run cap); the result is withheld", name, n, r.limits.Bytes)), decision, "bytes"
	}
	return reply, decision, ""
}

func (r *toolRun) hitLocked(limit string) {
	for _, l := range r.usage.LimitsHit {
		if l == limit {
			return
		}
	}
	r.usage.LimitsHit = append(r.usage.LimitsHit, limit)
}

// noteRefusal counts a refused call and reports whether it gets a record
// of its own.
func (r *toolRun) noteRefusal(decision string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.usage.Refused++
	if r.recorded < maxToolRefusalRecords {
		r.recorded++
		return true
	}
	if r.unrec == nil {
		r.unrec = map[string]int{}
	}
	r.unrec[decision]++
	return false
}

// finish writes the summary of the refusals past the cap, once the run
// is over.
func (r *toolRun) finish() {
	if r == nil {
		return
	}
	r.mu.Lock()
	unrec := r.unrec
	r.unrec, r.recorded = nil, 0
	r.mu.Unlock()
	if len(unrec) == 0 {
		return
	}
	n := 0
	var parts []string
	keys := make([]string, 0, len(unrec))
	for d := range unrec {
		keys = append(keys, d)
	}
	sort.Strings(keys)
	for _, d := range keys {
		n += unrec[d]
		parts = append(parts, fmt.Sprintf("%s %d", d, unrec[d]))
	}
	r.s.gov.Append(&audit.Record{Event: audit.EventUpstream, Identity: r.identity, CallID: r.callID, Decision: "limit",
		LimitsHit: []string{"tools:refusals"},
		Reason:    fmt.Sprintf("%d more refused tool calls (%s) have no record of their own: a run gets at most %d refusal records", n, strings.Join(parts, ", "), maxToolRefusalRecords),
		Upstream:  &audit.UpstreamCall{Session: r.session, Unrecorded: unrec}})
}

// approve asks the user, once per tool per run (per session call), before
// the first call to a tool under an approve rule.
func (r *toolRun) approve(ctx context.Context, name string, args json.RawMessage, j policy.Judgement) error {
	r.askMu.Lock()
	defer r.askMu.Unlock()
	// An approval the policy asks for by a rule on the arguments holds
	// for those arguments only; one for the tool, for every call to it.
	key := name
	if j.Approve {
		sum := sha256.Sum256(args)
		key = name + "\x00" + hex.EncodeToString(sum[:])
	}
	r.mu.Lock()
	ok := r.approved[key]
	r.mu.Unlock()
	if ok {
		return nil
	}
	shown := argsForUser(args)
	scope := "run"
	if r.session != "" {
		scope = "session call"
	}
	holds := fmt.Sprintf("The answer holds for every call to %s in this %s.", name, scope)
	if j.Approve {
		holds = fmt.Sprintf("Asked because: %s. The answer holds for these arguments only.", j.Reason)
	}
	err := r.s.consent(r.ctx, r.req, ctx, consentAsk{
		question: fmt.Sprintf("The Python code of this %s call wants to call the tool %s with these arguments:%s\nAllow it? %s",
			r.tool, name, shown, holds),
		subject: name, rules: "policy", what: "the call to " + name,
		instead: fmt.Sprintf("ask the user to allow %s in the server's policy", name),
	})
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.approved[key] = true
	r.mu.Unlock()
	return nil
}

// callFailure explains an upstream call that failed before it had a
// result.
func (r *toolRun) callFailure(ctx context.Context, name string, err error) worker.ToolReply {
	switch {
	case ctx.Err() != nil && (errors.Is(context.Cause(ctx), context.DeadlineExceeded) || deadlinePassed(ctx)):
		return failure(worker.ToolFailTimeout, fmt.Sprintf("%s: the run's time ran out during the call, which was cancelled", name))
	case ctx.Err() != nil:
		return failure(worker.ToolFailCancelled, fmt.Sprintf("%s: the run was cancelled or ended during the call, which was cancelled", name))
	case errors.Is(err, upstream.ErrUnknownTool):
		return failure(worker.ToolFailUnknown, r.unknownMessage(name))
	default:
		return failure(worker.ToolFailUnavailable, fmt.Sprintf("%s: %v", name, err))
	}
}

// deadlinePassed reports whether ctx's deadline (the run's) has passed:
// a call ended by the run's end just as its time ran out was ended by
// the time, whichever cancellation reached it first.
func deadlinePassed(ctx context.Context) bool {
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// waitEnded explains a call whose run ended while it waited for its
// server to connect: nothing was sent.
func (r *toolRun) waitEnded(ctx context.Context, name string) worker.ToolReply {
	server, _, _ := strings.Cut(name, ".")
	if errors.Is(context.Cause(ctx), context.DeadlineExceeded) || deadlinePassed(ctx) {
		return failure(worker.ToolFailTimeout, fmt.Sprintf("%s: the run's time ran out while the call waited for the upstream server %q to connect", name, server))
	}
	return failure(worker.ToolFailCancelled, fmt.Sprintf("%s: the run was cancelled or ended while the call waited for the upstream server %q to connect", name, server))
}

func (r *toolRun) unknownMessage(name string) string {
	if msg, down := r.serverDown(name); down {
		return msg
	}
	return fmt.Sprintf("there is no tool %q; tools.list() shows the tools this server offers to code", name)
}

// serverDown says whether name is a tool of a configured upstream that is
// not ready, and what to tell the code.
func (r *toolRun) serverDown(name string) (string, bool) {
	server, _, _ := strings.Cut(name, ".")
	for _, st := range r.s.up.Status() {
		if st.Name == server && st.State != upstream.StateReady {
			return fmt.Sprintf("%s: the upstream server %q is %s (%s), so its tools cannot be called now; tell the user if it stays so", name, server, st.State, st.Error), true
		}
	}
	return "", false
}

func failure(kind, msg string) worker.ToolReply {
	return worker.ToolReply{Error: &worker.ToolFailure{Kind: kind, Message: msg}}
}

// toolReply turns an upstream result into what goes back into the
// sandbox: bounded, since the upstream is outside this process too.
// It also returns the result's size, which counts against the run's
// bytes even when the result is withheld.
func toolReply(res *mcp.CallToolResult) (worker.ToolReply, int64, error) {
	var reply worker.ToolReply
	content, err := json.Marshal(res.Content)
	if err != nil {
		return reply, 0, fmt.Errorf("its result cannot be encoded: %v", err)
	}
	if len(res.Content) == 0 {
		content = nil
	}
	var structured json.RawMessage
	if res.StructuredContent != nil {
		if structured, err = json.Marshal(res.StructuredContent); err != nil {
			return reply, int64(len(content)), fmt.Errorf("its structured result cannot be encoded: %v", err)
		}
	}
	n := int64(len(content) + len(structured))
	if n > maxToolResultBytes {
		return reply, n, fmt.Errorf("its result is %d bytes, more than the %d a call may bring into the sandbox", n, maxToolResultBytes)
	}
	if res.IsError {
		return worker.ToolReply{Error: &worker.ToolFailure{Kind: worker.ToolFailError, Message: errorText(res), Content: content}}, n, nil
	}
	reply.Structured, reply.Content = structured, content
	return reply, n, nil
}

// errorText is what an upstream's error result says, for the exception.
func errorText(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, t.Text)
		}
	}
	s := strings.Join(parts, "\n")
	if s == "" {
		s = "the tool reported an error"
	}
	if len(s) > 4000 {
		s = s[:4000] + "..."
	}
	return s
}

// argsForUser shows a call's arguments to the user who approves it: every
// argument by name, each value cut to a few hundred bytes, so that no
// long value can push another (a path, a recipient) out of sight.
func argsForUser(args json.RawMessage) string {
	var m map[string]json.RawMessage
	if json.Unmarshal(args, &m) != nil {
		return "(not a JSON object)"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	const perValue, total = 300, 16000
	var b strings.Builder
	for i, k := range keys {
		v := string(m[k])
		if len(v) > perValue {
			v = fmt.Sprintf("%s... (%d bytes)", cutAt(v, perValue), len(m[k]))
		}
		// Keys are quoted: a key is the code's to choose, and one with a
		// line break could otherwise draw lines of its own.
		line := fmt.Sprintf("\n  %s = %s", strconv.Quote(clipText(k, 100)), v)
		if b.Len()+len(line) > total {
			rest := make([]string, 0, len(keys)-i)
			for _, k := range keys[i:] {
				rest = append(rest, strconv.Quote(clipText(k, 100)))
			}
			fmt.Fprintf(&b, "\n  ... and %d more arguments: %s", len(keys)-i, clipText(strings.Join(rest, ", "), 2000))
			break
		}
		b.WriteString(line)
	}
	if len(keys) == 0 {
		return "(none)"
	}
	return b.String()
}

// cutAt cuts s to at most n bytes at a character boundary.
func cutAt(s string, n int) string {
	return engine.Head(s, n)
}

func clipText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return cutAt(s, n) + "..."
}
