package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/govern"
)

// This file is where the MCP layer meets governance (internal/govern),
// and the one place a call and its result are converted: a request to a
// govern.Call, a parsed input to a govern.Subject, a handler's output to
// a govern.Outcome, a govern.Refusal to a tool result.
//
// Tools are registered with the SDK as raw handlers, so that every call
// of a governed tool passes through one function: admitted, its
// arguments parsed and validated against the tool's schema, checked,
// run, and recorded, in order, with nothing carried through the context.

// approvalKey names the one input request of an approval.
const approvalKey = "approval"

// handler is a tool's typed handler. A call refused before anything ran
// returns a *govern.Refusal as its error (see refusal): its result then
// says the status and what to do, in text and in structured form.
type handler[In, Out any] = mcp.ToolHandlerFor[In, Out]

// outcomer is an output that says how its call went, for the record: an
// install's status, say. Outputs without it are "ok" (or "error" when
// the result is an error).
type outcomer interface{ outcome() govern.Outcome }

// schemas are a tool's input and output schemas, and the structured
// result of a refusal: the output type's zero value with its status and
// message set, so that it still matches the output schema.
type schemas struct {
	in      *jsonschema.Resolved
	inProps map[string]bool // the input schema's properties
	outZero map[string]any  // nil: no output schema
	props   map[string]bool // the output schema's properties
}

func schemasFor[In, Out any](t *mcp.Tool) (*schemas, error) {
	sc := &schemas{}
	it := reflect.TypeFor[In]()
	if t.InputSchema == nil {
		s, err := jsonschema.ForType(it, &jsonschema.ForOptions{})
		if err != nil {
			return nil, fmt.Errorf("input schema of %s: %w", t.Name, err)
		}
		t.InputSchema = s
	}
	s, err := asSchema(t.InputSchema)
	if err != nil {
		return nil, fmt.Errorf("input schema of %s: %w", t.Name, err)
	}
	r, err := s.Resolve(&jsonschema.ResolveOptions{ValidateDefaults: true})
	if err != nil {
		return nil, fmt.Errorf("input schema of %s: %w", t.Name, err)
	}
	sc.in = r
	sc.inProps = map[string]bool{}
	for k := range s.Properties {
		sc.inProps[k] = true
	}
	ot := reflect.TypeFor[Out]()
	if ot == reflect.TypeFor[any]() {
		return sc, nil
	}
	if ot.Kind() == reflect.Pointer {
		ot = ot.Elem()
	}
	if t.OutputSchema == nil {
		s, err := jsonschema.ForType(ot, &jsonschema.ForOptions{})
		if err != nil {
			return nil, fmt.Errorf("output schema of %s: %w", t.Name, err)
		}
		t.OutputSchema = s
	}
	if os, err := asSchema(t.OutputSchema); err == nil {
		sc.props = map[string]bool{}
		for k := range os.Properties {
			sc.props[k] = true
		}
	}
	zero, _ := json.Marshal(reflect.Zero(ot).Interface())
	json.Unmarshal(zero, &sc.outZero)
	if sc.outZero == nil {
		sc.outZero = map[string]any{}
	}
	return sc, nil
}

// asSchema is a schema a tool was given (a profile writes its peer's
// as JSON) as a *jsonschema.Schema.
func asSchema(v any) (*jsonschema.Schema, error) {
	if s, ok := v.(*jsonschema.Schema); ok {
		return s, nil
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var s jsonschema.Schema
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// addTool registers a governed tool.
func addTool[In, Out any](s *server, srv *mcp.Server, t *mcp.Tool, h handler[In, Out]) {
	if s.gov.Policy().Hidden(t.Name) {
		// Never listed, not even for the moment between adding it and
		// register's removal of hidden tools (a policy reload re-adds
		// every tool, and clients re-list on each tools/list_changed).
		srv.RemoveTools(t.Name)
		return
	}
	tt := *t
	sc, err := schemasFor[In, Out](&tt)
	if err != nil {
		// A programming error: every tool's types are fixed.
		panic(err)
	}
	h = routed(s, tt.Name, h)
	if in, err := asSchema(tt.InputSchema); err == nil {
		props := map[string]bool{}
		for k := range in.Properties {
			props[k] = true
		}
		s.argNames.Store(tt.Name, props)
	}
	srv.AddTool(&tt, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return callTool(ctx, s, req, sc, h)
	})
}

// callTool is one call of a governed tool, from its arrival to its
// record.
func callTool[In, Out any](ctx context.Context, s *server, req *mcp.CallToolRequest, sc *schemas, h handler[In, Out]) (*mcp.CallToolResult, error) {
	tool := req.Params.Name
	actx, t, ref := s.gov.Admit(ctx, callOf(req))
	if ref != nil {
		return s.refused(t, sc, ref, govern.Outcome{Refused: ref})
	}
	in, ref := decodeInput[In](tool, req.Params.Arguments, sc)
	if ref != nil {
		return s.refused(t, sc, ref, govern.Outcome{Refused: ref})
	}
	v := t.Check(actx, s.subjectOf(in), approverOf(actx, req))
	switch {
	case v.Refusal != nil:
		return s.refused(t, sc, v.Refusal, govern.Outcome{Refused: v.Refusal})
	case v.Ask != nil:
		return asked(t, v.Ask)
	}
	// In flight: an operator may look at its resources or stop it.
	actx = engine.WithUsageObserver(actx, func(probe engine.UsageProbe) {
		s.gov.Activity().SetProbe(t.ID(), func() (time.Duration, int64) { u := probe(); return u.CPU, u.MemoryBytes })
	})
	actx = withCallID(actx, t.ID())
	call := &inflight{ticket: t, gate: v.Gate}
	s.inflight.Store(req, call)
	res, out, err := h(actx, req, in)
	after := t.AfterRun(actx, err == nil && !call.refusedRun())
	if after != nil && after.Rerun {
		// An operator approved it while its sandbox was let go: again.
		call.reset()
		res, out, err = h(actx, req, in)
		after = t.AfterRun(actx, err == nil && !call.refusedRun())
	}
	s.inflight.Delete(req)
	if after != nil {
		// The code's facts decided, in its sandbox, before any of it ran.
		if after.Ask != nil {
			return asked(t, after.Ask)
		}
		if after.Refusal != nil {
			return s.refused(t, sc, after.Refusal, govern.Outcome{Refused: after.Refusal})
		}
	}
	var o govern.Outcome
	var r *govern.Refusal
	switch {
	case errors.As(err, &r):
		o.Refused = r
	case err != nil:
		o.Failed = err
	default:
		o = call.outcome(any(out), res)
	}
	o.Killed = govern.KilledBy(actx, ctx)
	if r != nil {
		return s.refused(t, sc, r, o)
	}
	if err != nil {
		if endErr := t.End(o); endErr != nil {
			return withheld(endErr), nil
		}
		return nil, err
	}
	call.mu.Lock()
	resumed := call.resumed
	call.mu.Unlock()
	if rs, ok := any(out).(resumedSetter); ok && resumed != "" {
		// A file call or an install that resumed its session says so,
		// and what did not come back, as run_python does.
		rs.setResumed(resumed)
		if res != nil {
			res.Content = append([]mcp.Content{&mcp.TextContent{Text: resumed + "."}}, res.Content...)
		}
	}
	res, err = reply(sc, res, out)
	if err != nil {
		t.End(govern.Outcome{Failed: err})
		return nil, err
	}
	if o.Killed != "" {
		res.Content = append(res.Content, &mcp.TextContent{Text: "This call was " + o.Killed + "."})
	}
	if err := t.End(o); err != nil {
		return withheld(err), nil
	}
	return res, nil
}

// resumedSetter is an output that can say its call resumed its session.
type resumedSetter interface{ setResumed(string) }

// reply is a handler's result with its output as structured content
// (and as text, when the handler gave none).
func reply(sc *schemas, res *mcp.CallToolResult, out any) (*mcp.CallToolResult, error) {
	if res == nil {
		res = &mcp.CallToolResult{}
	}
	if sc.outZero != nil && !isNil(out) {
		raw, err := govern.PlainJSON(out, "")
		if err != nil {
			return nil, fmt.Errorf("marshaling output: %w", err)
		}
		res.StructuredContent = json.RawMessage(raw)
		if res.Content == nil {
			res.Content = []mcp.Content{&mcp.TextContent{Text: string(raw)}}
		}
	}
	if res.Content == nil {
		res.Content = []mcp.Content{}
	}
	return res, nil
}

// addInternal registers a tool of the internal endpoint other replicas
// forward to: not governed here (the forwarding replica decided and
// records), but answered as a governed tool is.
func addInternal[In, Out any](srv *mcp.Server, t *mcp.Tool, h handler[In, Out]) {
	tt := *t
	sc, err := schemasFor[In, Out](&tt)
	if err != nil {
		panic(err)
	}
	srv.AddTool(&tt, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		in, ref := decodeInput[In](tt.Name, req.Params.Arguments, sc)
		if ref == nil {
			var res *mcp.CallToolResult
			var out Out
			res, out, err := h(ctx, req, in)
			if !errors.As(err, &ref) {
				if err != nil {
					return nil, err
				}
				return reply(sc, res, out)
			}
		}
		return refusalResult(sc, ref), nil
	})
}

func isNil(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	return (rv.Kind() == reflect.Pointer || rv.Kind() == reflect.Map || rv.Kind() == reflect.Slice) && rv.IsNil()
}

// asked ends the first pass of a call the user must approve and answers
// it with the request for approval.
func asked(t *govern.Ticket, ask *govern.Ask) (*mcp.CallToolResult, error) {
	res := &mcp.CallToolResult{
		InputRequests: mcp.InputRequestMap{approvalKey: &mcp.ElicitParams{
			Message:         ask.Message,
			RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{}},
		}},
		RequestState: ask.State,
	}
	if err := t.End(govern.Outcome{}); err != nil {
		return withheld(err), nil
	}
	return res, nil
}

// withheld answers a call whose record could not be written.
func withheld(err error) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "The call could not be recorded in the server's audit log (" + err.Error() + "), so its result is withheld. Tell the server's operator."}}}
}

// refused ends a refused call and answers it.
func (s *server) refused(t *govern.Ticket, sc *schemas, ref *govern.Refusal, o govern.Outcome) (*mcp.CallToolResult, error) {
	if err := t.End(o); err != nil {
		return withheld(err), nil
	}
	return refusalResult(sc, ref), nil
}

// refusalResult is a refused call's result: the message, and a
// structured result whose status says what happened.
func refusalResult(sc *schemas, ref *govern.Refusal) *mcp.CallToolResult {
	res := &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: ref.Message}}}
	// Only an output with a status or a message can say it was refused;
	// any other (check_environment's) would be zero values that read as
	// facts (every layer off), so the refusal is its text alone.
	if sc != nil && sc.outZero != nil && (sc.props["status"] || sc.props["message"]) {
		out := make(map[string]any, len(sc.outZero)+2)
		for k, v := range sc.outZero {
			out[k] = v
		}
		if sc.props["status"] {
			out["status"] = string(ref.Status)
		}
		if sc.props["message"] {
			out["message"] = ref.Message
		}
		// Nothing ran, so no exit code: a zero would read as code that
		// ran and exited cleanly. -1 is what a run that never reached an
		// exit of its own reports (timed out, cancelled).
		if sc.props["exit_code"] {
			out["exit_code"] = -1
		}
		raw, _ := govern.PlainJSON(out, "")
		res.StructuredContent = json.RawMessage(raw)
	}
	return res
}

// decodeInput parses and validates a call's arguments: a failure is a
// plain sentence, with status invalid_request.
func decodeInput[In any](tool string, raw json.RawMessage, sc *schemas) (In, *govern.Refusal) {
	var in In
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		msg := fmt.Sprintf("The arguments of %s must be a JSON object. Nothing was run.", tool)
		var obj map[string]json.RawMessage
		if err != nil && json.Unmarshal(raw, &obj) == nil {
			// An object, with a value this server cannot read (a number
			// beyond a 64-bit float's range, 1e400).
			msg = fmt.Sprintf("The arguments of %s are not valid: %s. Nothing was run; send numbers within a 64-bit float's range (a string holds any number).", tool, shortErr(err.Error()))
		}
		return in, &govern.Refusal{Status: govern.StatusInvalidRequest, Message: msg}
	}
	if err := sc.in.Validate(&m); err != nil {
		return in, &govern.Refusal{Status: govern.StatusInvalidRequest, Message: fmt.Sprintf("The arguments of %s are not valid: %s. Nothing was run; fix them (the tool's input schema says what each takes).", tool, plainError(err))}
	}
	// Only the schema's own names, exactly: encoding/json would also fill
	// a field from a key that differs in case ("Script", "ſcript"), which
	// the policy's rules, reading keys as they are, would not see.
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err == nil && sc.inProps != nil {
		for k := range fields {
			if !sc.inProps[k] {
				delete(fields, k)
			}
		}
		raw, _ = json.Marshal(fields)
	}
	if err := json.Unmarshal(raw, &in); err != nil {
		return in, &govern.Refusal{Status: govern.StatusInvalidRequest, Message: fmt.Sprintf("The arguments of %s are not valid: %s. Nothing was run; fix them.", tool, shortErr(err.Error()))}
	}
	return in, nil
}

// plainError shortens a schema validation error to its last, most
// specific line.
func plainError(err error) string {
	msg := strings.TrimSpace(err.Error())
	if i := strings.LastIndex(msg, "\n"); i >= 0 {
		msg = strings.TrimSpace(msg[i+1:])
	}
	return shortErr(msg)
}

// shortErr bounds an error that may quote the caller's value (a number
// of a million digits would come back whole, twice).
func shortErr(msg string) string {
	const most = 300
	if len(msg) <= most {
		return msg
	}
	return strings.ToValidUTF8(msg[:most], "") + fmt.Sprintf("... (%d more bytes)", len(msg)-most)
}

// inflight is a governed call while its handler runs. A profile's tool
// answers in its peer's format, so the run it made through its Host is
// the call's outcome: the Host finds the call by its request.
type inflight struct {
	ticket *govern.Ticket
	// gate decides the call's code from its facts, in its run's sandbox
	// (engine.RunRequest.Gate); nil: decided already.
	gate    func(ctx context.Context, code string, facts json.RawMessage) string
	mu      sync.Mutex
	run     *engine.Result
	refused *govern.Refusal
	other   *govern.Outcome
	// resumed says what came back when the call resumed its paused
	// session first (ownAwake); the reply says it.
	resumed string
}

// refusedRun says a profile's run of the call was refused before it ran.
func (c *inflight) refusedRun() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.refused != nil && c.run == nil
}

// reset forgets what a run of the call reported, before it runs again.
func (c *inflight) reset() {
	c.mu.Lock()
	c.run, c.refused, c.other = nil, nil, nil
	c.mu.Unlock()
}

// gateOf is the gate of the call req is, for its run (nil: none).
func (s *server) gateOf(req *mcp.CallToolRequest) func(ctx context.Context, code string, facts json.RawMessage) string {
	if c, ok := s.inflight.Load(req); ok {
		return c.(*inflight).gate
	}
	return nil
}

// outcome is what the handler's output says happened.
func (c *inflight) outcome(out any, res *mcp.CallToolResult) govern.Outcome {
	c.mu.Lock()
	run, refused, other := c.run, c.refused, c.other
	c.mu.Unlock()
	switch v := out.(type) {
	case *RunPythonOutput:
		if v != nil {
			return runOutcome(v, res)
		}
	case outcomer:
		if !isNil(v) {
			return v.outcome()
		}
	}
	switch {
	case other != nil:
		return *other
	case run != nil:
		return runOutcome(run, res)
	case refused != nil:
		return govern.Outcome{Refused: refused}
	}
	o := govern.Outcome{Status: "ok"}
	if res != nil && res.IsError {
		o.Status, o.Error = "error", resultText(res)
	}
	return o
}

// runOutcome is what a run measured, for its record: from run_python's
// output as it went to the client, or from the run a profile's tool made.
func runOutcome[R *RunPythonOutput | *engine.Result](run R, res *mcp.CallToolResult) govern.Outcome {
	var r *RunPythonOutput
	// A run that completed with its output cut is recorded as the client
	// was told of it: without an error.
	var failed bool
	switch v := any(run).(type) {
	case *RunPythonOutput:
		r = v
		failed = r.Status != engine.StatusSuccess && (res == nil || res.IsError)
	case *engine.Result:
		r = runPythonOutput(v, runUsage{})
		failed = !v.Completed()
	}
	exit := r.ExitCode
	o := govern.Outcome{Status: string(r.Status), ExitCode: &exit, PeakMemoryBytes: r.PeakMemoryBytes, CPUTimeMS: r.CPUTimeMS}
	switch r.Status {
	case engine.StatusTimeout:
		o.LimitsHit = append(o.LimitsHit, govern.HitTimeout)
	case engine.StatusMemoryLimit:
		o.LimitsHit = append(o.LimitsHit, govern.HitMemory)
	case engine.StatusOutputLimit:
		o.LimitsHit = append(o.LimitsHit, govern.HitOutput)
	default:
		if r.StdoutTruncated || r.StderrTruncated {
			o.LimitsHit = append(o.LimitsHit, govern.HitOutput)
		}
	}
	if failed && res != nil {
		o.Error = resultText(res)
	}
	return o
}
