package tools

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/activity"
	"github.com/pysandbox/pysandbox/internal/audit"
	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/metrics"
	"github.com/pysandbox/pysandbox/internal/pep"
	"github.com/pysandbox/pysandbox/internal/policy"
	"github.com/pysandbox/pysandbox/internal/tracing"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Governance is what stands between a tool call and the engine: the
// policy, its rate limits and approvals, the audit log and the metrics.
// Every part is optional; the zero value allows everything and records
// nothing.
type Governance struct {
	Policy  *policy.Policy   // nil: allow everything
	Audit   *audit.Writer    // nil: no audit log
	Metrics *metrics.Metrics // nil: no metrics
	// ApprovalTTL is how long a user's approval stays valid for its retry
	// (default 10 minutes).
	ApprovalTTL time.Duration
	// Updates, when set, delivers policies that replace the one in force
	// (serve reloads its file on SIGHUP). Rate-limit counts carry over.
	Updates <-chan *policy.Policy
	// Limiter counts rate limits; nil: in this process. A shared store's
	// (internal/sharedstate) counts across replicas.
	Limiter policy.RateLimiter
	// ApprovalKey seals approval state (AES, 16 to 32 bytes); nil: a
	// random key of this process. Nonces, when set, records used
	// approvals where every replica sees them. With both shared, an
	// approval answered through one replica is honoured, once, by any.
	ApprovalKey []byte
	Nonces      policy.NonceStore
	// Activity, when set, is told of every call in flight (and can stop
	// it) and every call that ended: the operator console's live view.
	Activity *activity.Registry
}

// approvalKey names the one input request of an approval.
const approvalKey = "approval"

// governor enforces Governance for one server.
type governor struct {
	pol      atomic.Pointer[policy.Policy] // replaced by Governance.Updates
	limiter  policy.RateLimiter
	sealer   *policy.Sealer
	audit    *audit.Writer
	metrics  *metrics.Metrics
	activity *activity.Registry
	log      *slog.Logger
	eng      *engine.Engine
	// netWords says what network runs have (see server.networkWords).
	netWords func() string
	// governed are the tools whose calls it decides, audits and counts:
	// pysandbox's own (unless left out) and the profiles'.
	governed map[string]bool

	// broken is set once the audit log failed: from then on every call is
	// refused, because it could not be recorded.
	mu     sync.Mutex
	broken error
}

func newGovernor(g Governance, eng *engine.Engine, log *slog.Logger) *governor {
	pol := g.Policy
	if pol == nil {
		pol = policy.AllowAll()
	}
	ttl := g.ApprovalTTL
	if ttl <= 0 {
		ttl = 10 * time.Minute
	}
	var sealer *policy.Sealer
	var err error
	if g.ApprovalKey != nil {
		sealer, err = policy.NewSharedSealer(g.ApprovalKey, ttl, nil, g.Nonces)
	} else {
		sealer, err = policy.NewSealer(ttl, nil)
	}
	if err != nil {
		// Only a broken system random source gets here; approvals then
		// cannot be granted, which fails closed.
		log.Error("approvals disabled", "err", err)
	}
	var limiter policy.RateLimiter = policy.NewLimiter(nil)
	if g.Limiter != nil {
		limiter = g.Limiter
	}
	gv := &governor{limiter: limiter, sealer: sealer, activity: g.Activity, audit: g.Audit, metrics: g.Metrics, log: log, eng: eng,
		netWords: func() string { return "no network" }}
	gv.pol.Store(pol)
	return gv
}

// policy is the policy in force now.
func (g *governor) policy() *policy.Policy { return g.pol.Load() }

// callInfo is what a handler learned that the audit record needs: set
// through the context by the approval step and by handlers that refuse a
// package.
type callInfo struct {
	callID   string // see newCallID
	mu       sync.Mutex
	decision string // "" means the policy's plain allow
	reason   string
	rule     string // for the denial metric: tool, default, package, approval
	// run is the outcome of the last run a profile's tool made through
	// Host.Run (its result text is the peer's, not pysandbox's), and
	// refused says Host refused one; the record is made from them.
	run     *engine.Result
	refused string
	status  string // a profile's install: installed or install_error
}

// noteStatus keeps, for the call's record, the status of what a
// profile's tool did that is not a run (an install).
func noteStatus(ctx context.Context, status, errText string) {
	if ci, ok := ctx.Value(callInfoKey{}).(*callInfo); ok {
		ci.mu.Lock()
		ci.status = status
		if errText != "" {
			ci.refused = errText
		}
		ci.mu.Unlock()
	}
}

// noteRun keeps, for the call's record, the outcome of a run a profile's
// tool made.
func noteRun(ctx context.Context, res *engine.Result, refused *mcp.CallToolResult) {
	if ci, ok := ctx.Value(callInfoKey{}).(*callInfo); ok {
		ci.mu.Lock()
		ci.run = res
		if refused != nil {
			ci.refused = resultText(refused)
		}
		ci.mu.Unlock()
	}
}

type callInfoKey struct{}

func noteDecision(ctx context.Context, decision, reason, rule string) {
	if ci, ok := ctx.Value(callInfoKey{}).(*callInfo); ok {
		ci.mu.Lock()
		ci.decision, ci.reason, ci.rule = decision, reason, rule
		ci.mu.Unlock()
	}
}

// middleware intercepts every tools/call before the SDK routes it, so a
// tool the policy hides still answers with its reason (not "unknown
// tool"), and every call of one of our tools is rate-limited, audited and
// counted. It wraps the SDK's own multi-round-trip layer, so for an older
// client that is asked for approval with elicitation/create it sees the
// whole exchange as one call.
func (g *governor) middleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if rr, ok := req.(*mcp.ReadResourceRequest); ok && method == "resources/read" && rr.Params != nil && strings.HasPrefix(rr.Params.URI, sessionURIPrefix) {
			return g.readResource(ctx, method, rr, next)
		}
		ctr, ok := req.(*mcp.CallToolRequest)
		if method != "tools/call" || !ok || ctr.Params == nil {
			return next(ctx, method, req)
		}
		if a := bytes.TrimSpace(ctr.Params.Arguments); len(a) == 0 || string(a) == "null" {
			// No arguments are an empty object: the SDK would apply a
			// schema's defaults to a nil map and crash (go-sdk v1.8.0).
			ctr.Params.Arguments = json.RawMessage("{}")
		}
		if !g.governed[ctr.Params.Name] {
			return next(ctx, method, req)
		}
		tool := ctr.Params.Name
		start := time.Now()
		rec := &audit.Record{Event: "call", Identity: identity(req), Tool: tool, CallID: newCallID()}
		rec.Arguments, rec.CodeSHA256 = auditArgs(tool, ctr.Params.Arguments)
		// A trace of the call (internal/tracing; a no-op without a
		// collector): the policy, queue, sandbox, install and run spans of
		// the layers below are its children.
		ctx, span := tracing.Tracer().Start(ctx, "tools/call "+tool, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("mcp.tool.name", tool), attribute.String("pysandbox.call_id", rec.CallID), attribute.String("pysandbox.identity", rec.Identity)))
		defer func() {
			span.SetAttributes(attribute.String("pysandbox.decision", rec.Decision), attribute.String("pysandbox.status", rec.Status))
			if rec.Status == "error" || rec.Status == "protocol_error" {
				span.SetStatus(codes.Error, rec.Status)
			}
			span.End()
		}()

		if err := g.brokenErr(); err != nil {
			return errorResult("This server cannot record tool calls in its audit log (" + err.Error() + "), so it refuses them. Nothing was run; tell the server's operator."), nil
		}
		pol := g.policy()
		d := pol.Decide(tool)
		if d.Action == policy.Deny {
			reason := d.Reason
			rule := "tool"
			if _, listed := pol.Tools[tool]; !listed {
				rule = "default"
			}
			if reason == "" {
				reason = "the policy denies it"
			}
			rec.Decision, rec.Reason = "deny", reason
			g.metrics.Denied(tool, rule)
			res := errorResult(fmt.Sprintf("The server's policy does not allow %s: %s. Nothing was run. Do not retry; use another tool, or ask the user to change the server's policy.", tool, reason))
			return g.finish(rec, res, nil, start, false)
		}
		// The policy's rate limits (a shared store's round trip, with --store).
		pctx, pspan := tracing.Tracer().Start(ctx, "policy.rate_limits", trace.WithAttributes(attribute.Int("pysandbox.limits", len(d.Limits))))
		reservation, exceeded, err := g.limiter.Reserve(pctx, d.Limits, rec.Identity)
		pspan.End()
		if err != nil {
			rec.Decision, rec.Reason = "error", err.Error()
			res := errorResult(fmt.Sprintf("Refused: %v. Nothing was run; retry in a moment, and tell the server's operator if it persists.", err))
			return g.finish(rec, res, nil, start, false)
		}
		if exceeded != nil {
			rec.Decision, rec.Reason = "rate_limited", exceeded.Error()
			rec.LimitsHit = []string{rateHit(exceeded)}
			g.metrics.RateLimited(tool, exceeded.Limit.Counter)
			res := errorResult(fmt.Sprintf("Refused: the server's %s. Nothing was run; wait until then before calling %s again.", exceeded.Error(), tool))
			return g.finish(rec, res, nil, start, false)
		}

		ci := &callInfo{callID: rec.CallID}
		// In flight: the console shows it and an operator may stop it (its
		// context then ends with an activity.Killed cause).
		actx, end := g.activity.Begin(ctx, activity.Call{ID: rec.CallID, Identity: rec.Identity, Tool: tool,
			Session: argString(ctr.Params.Arguments, "session_id", "sandbox_id"), Code: argString(ctr.Params.Arguments, "code", "python_code", "script", "command")})
		actx = engine.WithUsageObserver(actx, func(probe engine.UsageProbe) {
			g.activity.SetProbe(rec.CallID, func() (time.Duration, int64) { u := probe(); return u.CPU, u.MemoryBytes })
		})
		result, err := next(context.WithValue(actx, callInfoKey{}, ci), method, req)
		var killed *activity.Killed
		killedBy := ""
		if errors.As(context.Cause(actx), &killed) && ctx.Err() == nil {
			// Its record says who stopped it.
			killedBy = killed.Error()
			if res, ok := result.(*mcp.CallToolResult); ok && res != nil {
				res.Content = append(res.Content, &mcp.TextContent{Text: "This call was " + killed.Error() + "."})
			}
		}
		end()
		res, _ := result.(*mcp.CallToolResult)
		ci.mu.Lock()
		rec.Decision, rec.Reason = ci.decision, ci.reason
		rule := ci.rule
		profileRun, profileRefused, profileStatus := ci.run, ci.refused, ci.status
		ci.mu.Unlock()
		if rec.Decision == "" {
			rec.Decision = "allow"
		}
		if killedBy != "" {
			rec.Reason = killedBy
		}
		ran := true
		switch {
		case res != nil && res.InputRequests != nil:
			// The first pass of an approval: nothing ran yet, and the
			// retry will be counted.
			rec.Decision = "approval_requested"
			reservation.Cancel()
			ran = false
		case rec.Decision == "declined":
			// Nothing ran, but the user was asked: that counts, so the
			// limits also bound how often an agent can ask.
			ran = false
			g.metrics.Denied(tool, rule)
		case rec.Decision != "allow" && rec.Decision != "approved":
			// Refused by a package rule, or approval impossible: nothing
			// ran and nobody was bothered.
			reservation.Cancel()
			ran = false
			g.metrics.Denied(tool, rule)
		}
		if profileStatus != "" && err == nil {
			rec.Status, rec.Error = profileStatus, cutAt(profileRefused, 2000)
			return g.finishRecorded(rec, result, nil, start, ran)
		}
		if profileRun != nil || profileRefused != "" {
			// A profile's result is its peer's text: record what pysandbox
			// measured instead.
			return g.finishProfile(rec, result, err, start, ran, profileRun, profileRefused)
		}
		return g.finish(rec, result, err, start, ran)
	}
}

// finishProfile is finish for a profile's tool whose call made a run.
func (g *governor) finishProfile(rec *audit.Record, result mcp.Result, callErr error, start time.Time, ran bool, run *engine.Result, refused string) (mcp.Result, error) {
	if callErr == nil && run != nil {
		raw, _ := json.Marshal(run)
		synth := &mcp.CallToolResult{IsError: run.Status != engine.StatusSuccess, StructuredContent: json.RawMessage(raw)}
		outcome(rec, synth)
		if ran {
			// Recorded here; finish must not overwrite it from the text.
			return g.finishRecorded(rec, result, nil, start, ran)
		}
	}
	if callErr == nil && run == nil && refused != "" {
		rec.Status, rec.Error = "refused", cutAt(refused, 2000)
		return g.finishRecorded(rec, result, nil, start, ran)
	}
	return g.finish(rec, result, callErr, start, ran)
}

// finishRecorded is finish once rec has its outcome: the console is
// told, and the record written before the client gets the result.
func (g *governor) finishRecorded(rec *audit.Record, result mcp.Result, callErr error, start time.Time, ran bool) (mcp.Result, error) {
	g.activity.Finish(activity.Done{ID: rec.CallID, Identity: rec.Identity, Tool: rec.Tool, Decision: rec.Decision,
		Status: rec.Status, DurationMS: time.Since(start).Milliseconds()})
	if err := g.record(rec, start, ran); err != nil {
		// Fail closed: a result that could not be recorded is withheld.
		return errorResult("The call could not be recorded in the server's audit log (" + err.Error() + "), so its result is withheld. Tell the server's operator."), nil
	}
	return result, callErr
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

// rateHit names a rate limit in a record's limits_hit, e.g. rate:runs/minute.
func rateHit(e *policy.Exceeded) string { return "rate:" + e.Limit.Counter + "/" + e.Limit.Window }

// sessionURIPrefix starts the URIs of session files.
const sessionURIPrefix = "pysandbox://sessions/"

// readResource governs resources/read of session files with
// download_file's rule, since it reads the same files: a policy that
// denies or rate-limits download_file cannot be side-stepped this way.
// Resources have no tool-error result, so refusals are protocol errors.
func (g *governor) readResource(ctx context.Context, method string, req *mcp.ReadResourceRequest, next mcp.MethodHandler) (mcp.Result, error) {
	const tool = "download_file"
	start := time.Now()
	// The URI as every argument is recorded: bounded (a long one as its
	// size and digest), or one read could write a line of any length.
	raw, _ := json.Marshal(map[string]string{"uri": req.Params.URI})
	args, _ := auditArgs(tool, raw)
	rec := &audit.Record{Event: "call", Identity: identity(req), Tool: tool, Arguments: args}
	if len(req.Params.URI) > maxResourceURI {
		msg := fmt.Sprintf("the URI is %d bytes, more than any of this server's resources (%d at most)", len(req.Params.URI), maxResourceURI)
		rec.Decision, rec.Reason, rec.Error = "deny", msg, msg
		g.record(rec, start, false)
		return nil, errors.New(msg)
	}
	refuse := func(decision, rule, msg string) (mcp.Result, error) {
		rec.Decision, rec.Reason, rec.Error = decision, msg, msg
		if rule != "" {
			g.metrics.Denied(tool, rule)
		}
		g.record(rec, start, false) // refused either way
		return nil, errors.New(msg)
	}
	if err := g.brokenErr(); err != nil {
		return nil, errors.New("this server cannot record calls in its audit log, so it refuses them")
	}
	d := g.policy().Decide(tool)
	switch d.Action {
	case policy.Deny:
		return refuse("deny", "tool", "the server's policy does not allow reading session files (download_file is denied)")
	case policy.Approve:
		return refuse("deny", "approval", "reading session files needs the user's approval under this server's policy; use the download_file tool, which asks")
	}
	reservation, exceeded, err := g.limiter.Reserve(ctx, d.Limits, rec.Identity)
	if err != nil {
		return refuse("error", "", fmt.Sprintf("refused: %v; retry in a moment", err))
	}
	if exceeded != nil {
		rec.LimitsHit = []string{rateHit(exceeded)}
		g.metrics.RateLimited(tool, exceeded.Limit.Counter)
		return refuse("rate_limited", "", "refused: the server's "+exceeded.Error())
	}
	res, err := next(ctx, method, req)
	rec.Decision, rec.Status = "allow", "ok"
	if err != nil {
		reservation.Cancel()
		rec.Status, rec.Error = "error", err.Error()
	}
	if g.record(rec, start, err == nil) != nil {
		return nil, errors.New("the read could not be recorded in the server's audit log, so its result is withheld")
	}
	return res, err
}

// finish fills in a tool call's outcome and records it; a result that
// could not be recorded is withheld.
func (g *governor) finish(rec *audit.Record, result mcp.Result, callErr error, start time.Time, ran bool) (mcp.Result, error) {
	res, _ := result.(*mcp.CallToolResult)
	switch {
	case callErr != nil:
		rec.Status, rec.Error = "protocol_error", callErr.Error()
	case res != nil && res.InputRequests == nil && ran:
		outcome(rec, res)
	case res != nil && res.IsError:
		// Refused: nothing ran, so there is no status, only what the
		// client was told.
		rec.Error = resultText(res)
	}
	return g.finishRecorded(rec, result, callErr, start, ran)
}

// record counts a call and writes its audit record, which is on disk
// before the client gets the result. After a failed write every later
// call is refused.
func (g *governor) record(rec *audit.Record, start time.Time, ran bool) error {
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
	if g.audit == nil {
		return nil
	}
	err := g.audit.Append(rec)
	if err != nil {
		g.mu.Lock()
		if g.broken == nil {
			g.broken = err
		}
		g.mu.Unlock()
		g.log.Error("audit log write failed; refusing every call from now on", "err", err)
	}
	return err
}

func (g *governor) brokenErr() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.broken
}

// outcome copies what a result says about the run into the record.
func outcome(rec *audit.Record, res *mcp.CallToolResult) {
	var out struct {
		Status          string `json:"status"`
		ExitCode        *int   `json:"exit_code"`
		PeakMemoryBytes int64  `json:"peak_memory_bytes"`
		CPUTimeMS       int64  `json:"cpu_time_ms"`
		StdoutTruncated bool   `json:"stdout_truncated"`
		StderrTruncated bool   `json:"stderr_truncated"`
	}
	if raw, ok := res.StructuredContent.(json.RawMessage); ok {
		json.Unmarshal(raw, &out)
	}
	rec.Status, rec.ExitCode, rec.PeakMemoryBytes, rec.CPUTimeMS = out.Status, out.ExitCode, out.PeakMemoryBytes, out.CPUTimeMS
	if rec.Status == "" {
		rec.Status = "ok"
		if res.IsError {
			rec.Status = "error"
		}
	}
	switch engine.Status(out.Status) {
	case engine.StatusTimeout:
		rec.LimitsHit = append(rec.LimitsHit, "timeout")
	case engine.StatusMemoryLimit:
		rec.LimitsHit = append(rec.LimitsHit, "memory")
	case engine.StatusOutputLimit:
		rec.LimitsHit = append(rec.LimitsHit, "output")
	default:
		if out.StdoutTruncated || out.StderrTruncated {
			rec.LimitsHit = append(rec.LimitsHit, "output")
		}
	}
	if res.IsError {
		rec.Error = resultText(res)
	}
}

// maxResourceURI bounds a resources/read URI: a session id and a
// workspace path (4 KiB at most, percent-encoded) fit well within it.
const maxResourceURI = 16 << 10

// maxAuditValue is the largest argument recorded verbatim, apart from the
// code; larger ones (inputs data, file contents) are recorded as their
// size and SHA-256, which still proves what was sent.
const maxAuditValue = 64 << 10

// auditArgs returns the arguments as recorded: compact JSON with the code
// in full and bulky values replaced by digests, and the code's SHA-256.
func auditArgs(tool string, raw json.RawMessage) (json.RawMessage, string) {
	if len(raw) == 0 {
		return nil, ""
	}
	var args map[string]json.RawMessage
	if err := json.Unmarshal(raw, &args); err != nil {
		return digestJSON(raw), ""
	}
	codeSum := ""
	for k, v := range args {
		if k == "code" {
			var code string
			if json.Unmarshal(v, &code) == nil {
				sum := sha256.Sum256([]byte(code))
				codeSum = hex.EncodeToString(sum[:])
				if len(code) <= MaxCodeBytes {
					continue
				}
			}
		}
		if len(v) > maxAuditValue || (tool == "upload_file" && (k == "content" || k == "content_base64")) {
			args[k] = digestJSON(v)
		}
	}
	// The rest together is bounded too: many values just under the bound
	// would make one record (and one line) of any size.
	total := 0
	for k, v := range args {
		if k != "code" {
			total += len(v)
		}
	}
	for k, v := range args {
		if total <= maxAuditArgs {
			break
		}
		if k != "code" && len(v) > 256 {
			total -= len(v)
			args[k] = digestJSON(v)
		}
	}
	b, err := PlainJSON(args, "")
	if err != nil {
		return digestJSON(raw), codeSum
	}
	return b, codeSum
}

// PlainJSON is v as JSON without HTML escapes (json.Marshal would write
// every <, > and & of code or output as six bytes), indented by indent
// when it is not "", without a final newline.
func PlainJSON(v any, indent string) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if indent != "" {
		enc.SetIndent("", indent)
	}
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// maxAuditArgs bounds what a record keeps of a call's arguments besides
// its code; larger values are digested.
const maxAuditArgs = 256 << 10

func digestJSON(v []byte) json.RawMessage {
	sum := sha256.Sum256(v)
	b, _ := json.Marshal(map[string]any{"omitted_bytes": len(v), "sha256": hex.EncodeToString(sum[:])})
	return b
}

// gated wraps a tool's handler with the checks that need its parsed
// input: the package rules, before anything is installed or anyone is
// asked, and the approval of a human when the policy requires one.
func gated[In, Out any](s *server, tool string, h mcp.ToolHandlerFor[In, Out]) mcp.ToolHandlerFor[In, Out] {
	return func(ctx context.Context, req *mcp.CallToolRequest, in In) (*mcp.CallToolResult, Out, error) {
		var zero Out
		if res := s.gov.check(ctx, req, tool, in); res != nil {
			return res, zero, nil
		}
		return h(ctx, req, in)
	}
}

func (g *governor) check(ctx context.Context, req *mcp.CallToolRequest, tool string, in any) *mcp.CallToolResult {
	ctx, span := tracing.Tracer().Start(ctx, "policy.check")
	defer span.End()
	if gv, ok := in.(Governed); ok {
		// A profile's tool is judged as the native call it amounts to.
		in = gv.Governed()
	}
	pol := g.policy()
	pkgs := requestedPackages(in)
	for _, p := range pkgs {
		if err := pol.Packages.Check(p.name); err != nil {
			return packageRefusal(ctx, err)
		}
	}
	d := pol.Decide(tool)
	if d.Action != policy.Approve {
		return nil
	}
	if d.By == policy.ApproveByOperator {
		return g.operatorApproval(ctx, req, tool, in, pkgs)
	}
	return g.approve(ctx, req, tool, in, pkgs)
}

// operatorWait bounds how long a call waits for an operator.
const operatorWait = 10 * time.Minute

// operatorApproval implements approve with by: operator: the call waits,
// telling its client so (progress notifications), until an operator
// decides in the console. It works for any client, headless ones
// included; the answer is bound to this call and used once.
func (g *governor) operatorApproval(ctx context.Context, req *mcp.CallToolRequest, tool string, in any, pkgs []requested) *mcp.CallToolResult {
	if g.activity == nil {
		noteDecision(ctx, "deny", "approval by an operator required, and this server has no console", "approval")
		return refusal(engine.StatusDenied, fmt.Sprintf("The server's policy requires an operator to approve each %s call, and this server has no operator console (--console). Nothing was run; tell the server's operator.", tool))
	}
	wctx, cancel := context.WithTimeout(ctx, operatorWait)
	defer cancel()
	if tok := req.Params.GetProgressToken(); tok != nil && req.Session != nil {
		// Until the decision: the client (and its user) knows why the
		// call takes time.
		go func() {
			t := time.NewTicker(5 * time.Second)
			defer t.Stop()
			for n := 1.0; ; n++ {
				req.Session.NotifyProgress(wctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: n,
					Message: "waiting for an operator to approve this " + tool + " call in the pysandbox console"})
				select {
				case <-wctx.Done():
					return
				case <-t.C:
				}
			}
		}()
	}
	facts, code, detail := g.approvalParts(tool, in, pkgs)
	digest := sha256.Sum256(req.Params.Arguments)
	a := activity.Approval{ID: callIDOf(ctx), Identity: identity(req), Tool: tool, Facts: facts,
		Code: strings.ToValidUTF8(code, "\ufffd"), Detail: strings.ToValidUTF8(detail, "\ufffd"), Digest: hex.EncodeToString(digest[:])}
	if len(a.Detail) > maxApprovalDetail {
		a.Detail, a.DetailCut = clip(a.Detail, maxApprovalDetail, detail), true
	}
	if !authenticated(req) {
		// Callers without a token are told apart only by their MCP
		// session, which costs nothing to open: together, they get one
		// identity's share of the operators' queue.
		a.Group = "unauthenticated"
	}
	ok, by, err := g.activity.Await(wctx, a)
	switch {
	case errors.Is(err, activity.ErrTooManyWaiting):
		noteDecision(ctx, "deny", err.Error(), "approval")
		return refusal(engine.StatusBusy, fmt.Sprintf("Refused: %v. Nothing was run; wait until an operator has decided your earlier calls.", err))
	case err != nil && ctx.Err() != nil:
		noteDecision(ctx, "declined", "the call was cancelled while it waited for an operator", "approval")
		return refusal(engine.StatusCancelled, "The call was cancelled while it waited for an operator's approval. Nothing was run.")
	case err != nil:
		noteDecision(ctx, "declined", "no operator decided within "+operatorWait.String(), "approval")
		return refusal(engine.StatusDenied, fmt.Sprintf("No operator approved this %s call within %s. Nothing was run; ask the server's operator.", tool, operatorWait))
	case !ok:
		noteDecision(ctx, "declined", "operator "+by+" declined it", "approval")
		return refusal(engine.StatusDenied, fmt.Sprintf("Operator %s declined this %s call. Nothing was run. Do not retry it unless asked to.", by, tool))
	}
	noteDecision(ctx, "approved", "approved by operator "+by, "")
	return nil
}

// packageRefusal reports a package the policy refuses.
func packageRefusal(ctx context.Context, err error) *mcp.CallToolResult {
	noteDecision(ctx, "deny", err.Error(), "package")
	return refusal(engine.StatusDenied, fmt.Sprintf("Refused by the server's package policy: %v. Nothing was installed or run; use only packages the policy allows (check_environment lists the rules).", err))
}

// deniedError turns an engine refusal of a package (one pulled in as a
// dependency, found after the install) into the same refusal.
func deniedError(ctx context.Context, err error) (*mcp.CallToolResult, bool) {
	var denied *engine.PackageDeniedError
	if !errors.As(err, &denied) {
		return nil, false
	}
	return packageRefusal(ctx, denied.Err), true
}

// approve implements action "approve": nothing with side effects happens
// until the user accepted this exact request.
func (g *governor) approve(ctx context.Context, req *mcp.CallToolRequest, tool string, in any, pkgs []requested) *mcp.CallToolResult {
	id := identity(req)
	args := []byte(req.Params.Arguments)
	if g.sealer == nil {
		noteDecision(ctx, "deny", "approvals are unavailable", "approval")
		return refusal(engine.StatusDenied, "This call needs a user's approval, and this server cannot issue approvals right now. Nothing was run.")
	}
	if req.Params.RequestState != "" || len(req.Params.InputResponses) > 0 {
		// An answer, genuine only if its state opens and matches.
		err := g.sealer.Open(req.Params.RequestState, tool, id, args)
		if err == nil {
			answer, _ := req.Params.InputResponses[approvalKey].(*mcp.ElicitResult)
			switch {
			case answer != nil && answer.Action == "accept":
				noteDecision(ctx, "approved", "the user approved it", "")
				return nil
			case answer != nil:
				noteDecision(ctx, "declined", "the user answered "+answer.Action, "approval")
				return refusal(engine.StatusDenied, fmt.Sprintf("The user did not approve this %s call (%s). Nothing was run. Do not retry the same call unless the user asks for it.", tool, answer.Action))
			}
			err = errors.New("the answer to the approval request is missing")
		}
		// A made-up, stale or reused answer is not an approval: ask the
		// user properly instead.
		g.log.Warn("ignored an approval answer", "tool", tool, "identity", id, "err", err)
	}
	if !canElicit(req) {
		noteDecision(ctx, "deny", "approval required, but the client cannot ask the user (no elicitation support)", "approval")
		return refusal(engine.StatusDenied, fmt.Sprintf("The server's policy requires the user to approve each %s call, and this client cannot ask the user (it does not support MCP elicitation). Nothing was run. Use a client that supports elicitation, or ask the user to change the server's policy.", tool))
	}
	state, err := g.sealer.Seal(tool, id, args)
	if err != nil {
		noteDecision(ctx, "deny", "could not seal the approval request: "+err.Error(), "approval")
		return refusal(engine.StatusBusy, "The approval request could not be prepared. Nothing was run; try again.")
	}
	noteDecision(ctx, "approval_requested", "", "")
	return &mcp.CallToolResult{
		InputRequests: mcp.InputRequestMap{approvalKey: &mcp.ElicitParams{
			Message:         g.approvalMessage(tool, in, pkgs),
			RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{}},
		}},
		RequestState: state,
	}
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

// maxApprovalCode is how much code the approval message shows; the rest
// is summarised (the full code is in the audit log).
const maxApprovalCode = 8 << 10

// approvalMessage tells the user what they are approving: the tool, the
// code or packages, and the limits it will run under.
func (g *governor) approvalMessage(tool string, in any, pkgs []requested) string {
	facts, code, detail := g.approvalParts(tool, in, pkgs)
	var b strings.Builder
	fmt.Fprintf(&b, "An AI agent wants to call %s on pysandbox. Approve?\n", tool)
	// The facts first: a long program cannot push them out of view.
	b.WriteString(facts)
	if detail != "" {
		b.WriteString("\n" + clip("Values:\n"+detail, maxApprovalCode, detail))
	}
	if code != "" || isRun(in) {
		b.WriteString("\n" + clip("Code:\n"+strings.ToValidUTF8(code, "?"), maxApprovalCode, code))
	}
	return b.String()
}

// clip cuts text to n bytes, saying how much is not shown and the SHA-256
// of what it stands for.
func clip(text string, n int, of string) string {
	if len(text) <= n {
		return text
	}
	head := engine.Head(text, n)
	return head + fmt.Sprintf("\n... (%d more bytes not shown; SHA-256 %s)", len(text)-len(head), shortSum(of))
}

func isRun(in any) bool { _, ok := in.(RunPythonInput); return ok }

// maxApprovalDetail bounds the values an operator is shown whole (a
// longer one is cut, and the console says so).
const maxApprovalDetail = 256 << 10

// approvalParts are what a call will do: its facts (session, Python,
// inputs, packages, limits), one per line; its code; and the values of
// its other arguments (a run's inputs, which become variables the code
// uses; an upload's path and content), as indented JSON.
func (g *governor) approvalParts(tool string, in any, pkgs []requested) (facts, code, detail string) {
	var b strings.Builder
	switch v := in.(type) {
	case RunPythonInput:
		if v.SessionID != "" {
			fmt.Fprintf(&b, "Session: %s (its variables and files persist)\n", oneLine(v.SessionID))
		}
		if v.PythonVersion != "" {
			fmt.Fprintf(&b, "Python: %s\n", oneLine(v.PythonVersion))
		}
		code = v.Code
		if len(v.Inputs) > 0 {
			keys := make([]string, 0, len(v.Inputs))
			for k := range v.Inputs {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			fmt.Fprintf(&b, "Inputs (global variables of the code): %s\n", oneLine(strings.Join(keys, ", ")))
			detail = indented(v.Inputs)
		}
	case ValidateScriptInput:
		code = v.Code
		b.WriteString("Checks the code without running it\n")
		if len(v.Dependencies) > 0 {
			fmt.Fprintf(&b, "Dependencies to check: %s\n", oneLine(strings.Join(v.Dependencies, ", ")))
		}
	case InstallPackageInput:
		fmt.Fprintf(&b, "Session: %s\n", oneLine(v.SessionID))
	case CreateSessionInput:
		if v.PythonVersion != "" {
			fmt.Fprintf(&b, "Python: %s\n", oneLine(v.PythonVersion))
		}
	default:
		detail = indented(v)
	}
	if len(pkgs) > 0 {
		names := make([]string, len(pkgs))
		for i, p := range pkgs {
			names[i] = p.spec
		}
		fmt.Fprintf(&b, "Packages to install: %s\n", oneLine(strings.Join(names, ", ")))
	}
	b.WriteString("Limits: " + g.limitsText(in))
	if d := g.policy().Decide(tool); len(d.Limits) > 0 {
		var ls []string
		for _, l := range d.Limits {
			ls = append(ls, l.String())
		}
		fmt.Fprintf(&b, "\nRate limits: %s", strings.Join(ls, "; "))
	}
	return b.String(), code, detail
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

func (g *governor) limitsText(in any) string {
	cfg := g.eng.Config()
	timeout := cfg.DefaultTimeout
	if v, ok := in.(RunPythonInput); ok && v.TimeoutSeconds > 0 {
		timeout = time.Duration(v.TimeoutSeconds * float64(time.Second))
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
		parts = append(parts, g.netWords(), "no access to the host's files ("+string(cfg.Backend.Kind())+" sandbox)")
	}
	return strings.Join(parts, ", ")
}

func shortSum(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:16]
}

// requested is a package a call asks for.
type requested struct{ name, spec string }

// requestedPackages lists the packages a call would install: the
// dependencies parameter, the code's PEP 723 block, install_package's
// packages. Unparsable entries are left for the engine to report.
func requestedPackages(in any) []requested {
	var specs []string
	switch v := in.(type) {
	case RunPythonInput:
		specs = append(specs, v.Dependencies...)
		if meta, err := pep.ParseScriptMetadata(v.Code); err == nil && meta != nil {
			specs = append(specs, meta.Dependencies...)
		}
	case CreateSessionInput:
		specs = v.Dependencies
	case InstallPackageInput:
		specs = v.Packages
	}
	var out []requested
	for _, s := range specs {
		if r, err := pep.ParseRequirement(s); err == nil {
			out = append(out, requested{name: r.Normalized, spec: r.String()})
		}
	}
	return out
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
