package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// maxPendingAnswers bounds the answers that are not calls (catalogs,
// refusals) waiting to be written: beyond it the Conn stops reading until
// one is written, so a worker that sends without reading cannot make the
// server hold more.
const maxPendingAnswers = 32

// lateReplyGrace bounds the write of a reply that was under way when the
// run's result was read. A worker reads (and drops) it at once; one that
// does not makes the Conn unusable. A variable for tests.
var lateReplyGrace = 5 * time.Second

// toolServer serves the tool messages of one run (Request.Tools).
type toolServer struct {
	c     *Conn
	tools Tools
	// ctx bounds the calls; cancel is called when the run's result is
	// read, or the exchange fails.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// calls holds a slot per call in flight: from the moment it is read
	// until its reply is written or dropped, so that at most
	// MaxToolCallsInFlight replies are ever held.
	calls chan struct{}
	// answers holds a slot per other answer being made or written.
	answers chan struct{}

	catalogOnce sync.Once
	catalog     []byte // the catalog answer's JSON after its op and id

	// ending is set once the run's result is read (or the exchange
	// failed): no answer starts to be written from then on.
	ending atomic.Bool
	// Guarded by c.wmu.
	closed bool  // nothing more may be written for this run
	broken error // a reply was cut short: the stream is out of step
}

func (c *Conn) newToolServer(ctx context.Context, req *Request) *toolServer {
	base := req.ToolsCtx
	if base == nil {
		base = ctx
	}
	tctx, cancel := context.WithCancel(base)
	return &toolServer{
		c: c, tools: req.Tools, ctx: tctx, cancel: cancel,
		calls:   make(chan struct{}, MaxToolCallsInFlight),
		answers: make(chan struct{}, maxPendingAnswers),
	}
}

// toolMessage answers one OpToolCall or OpToolCatalog message. ts is nil
// outside a run with Tools, where the message is refused (refusal says
// why). The error ends the exchange.
func (c *Conn) toolMessage(line []byte, env envelope, ts *toolServer, refusal string) error {
	if env.ID == "" || len(env.ID) > MaxToolIDBytes {
		return violationError{fmt.Errorf("worker: %s message with an id of %d bytes (the bounds are 1 and %d)", env.Op, len(env.ID), MaxToolIDBytes)}
	}
	if ts == nil {
		// Written at once: only code that writes to the control channel
		// itself sends these, and a worker that does not read them is
		// stopped by ctx like any other.
		data := failureLine(env.Op, env.ID, ToolFailCancelled, refusal)
		c.wmu.Lock()
		_, err := c.conn.Write(data)
		c.wmu.Unlock()
		if err != nil {
			return fmt.Errorf("worker: send tool answer: %w", err)
		}
		return nil
	}
	if env.Op == OpToolCatalog {
		ts.answer(func() []byte {
			ts.catalogOnce.Do(ts.makeCatalog)
			id, _ := json.Marshal(env.ID)
			data := make([]byte, 0, len(ts.catalog)+len(id)+32)
			data = append(data, `{"op":"tool_catalog","id":`...)
			data = append(data, id...)
			return append(data, ts.catalog...)
		})
		return nil
	}
	var call ToolCall
	if err := json.Unmarshal(line, &call); err != nil {
		ts.refuse(env.ID, ToolFailBadRequest, fmt.Sprintf("malformed tool call: %v", err))
		return nil
	}
	if msg := checkCall(&call); msg != "" {
		ts.refuse(env.ID, ToolFailBadRequest, msg)
		return nil
	}
	select {
	case ts.calls <- struct{}{}:
	default:
		ts.refuse(env.ID, ToolFailLimit, fmt.Sprintf("%s: this run already has %d tool calls in flight, the most at once; wait for some to finish", call.Name, MaxToolCallsInFlight))
		return nil
	}
	ts.wg.Add(1)
	go func() {
		defer ts.wg.Done()
		// The slot is given back just before the reply is written (or
		// dropped): once the worker can read it, it may send its next
		// call, which must find the slot free.
		var once sync.Once
		release := func() { once.Do(func() { <-ts.calls }) }
		defer release()
		reply := ts.tools.Call(ts.ctx, call.Name, call.Arguments)
		reply.Op, reply.ID = OpToolResult, call.ID
		data, err := json.Marshal(reply)
		if err != nil {
			data = failureLine(OpToolCall, call.ID, ToolFailUnavailable, fmt.Sprintf("%s: its result could not be encoded: %v", call.Name, err))
		} else {
			data = append(data, '\n')
		}
		ts.writeReleasing(data, release)
	}()
	return nil
}

// checkCall says what is wrong with a call, or "".
func checkCall(call *ToolCall) string {
	switch {
	case call.Name == "":
		return "tool call without a name"
	case len(call.Name) > MaxToolNameBytes:
		return fmt.Sprintf("tool name of %d bytes (the bound is %d)", len(call.Name), MaxToolNameBytes)
	case len(call.Arguments) > MaxToolArgsBytes:
		return fmt.Sprintf("%s: arguments of %d bytes (the bound is %d)", clip(call.Name), len(call.Arguments), MaxToolArgsBytes)
	}
	if args := bytes.TrimLeft(call.Arguments, " \t\r\n"); len(args) == 0 || args[0] != '{' {
		return fmt.Sprintf("%s: arguments must be a JSON object", clip(call.Name))
	}
	return ""
}

// failureLine is the answer to a tool message of op that refuses it.
// gate answers a run's OpCodeFacts: the first of a run with Gate is
// decided by it, while the worker waits and none of the code has run;
// any other (code writing to the control channel) is refused.
func (c *Conn) gate(ctx context.Context, line []byte, env envelope, req *Request, gated *bool) error {
	if env.ID == "" || len(env.ID) > MaxToolIDBytes {
		return violationError{fmt.Errorf("worker: %s message with an id of %d bytes (the bounds are 1 and %d)", env.Op, len(env.ID), MaxToolIDBytes)}
	}
	var data []byte
	switch {
	case req.Op != OpRun || req.Gate == nil || *gated:
		data = failureLine(OpToolResult, env.ID, ToolFailCancelled, "code facts are taken only once, before a run's code")
	case len(line) > MaxFactsBytes:
		return violationError{fmt.Errorf("worker: code facts of %d bytes (the bound is %d)", len(line), MaxFactsBytes)}
	default:
		*gated = true
		var m struct {
			Arguments json.RawMessage `json:"arguments"`
		}
		if err := json.Unmarshal(line, &m); err != nil {
			return violationError{fmt.Errorf("worker: bad code facts: %w", err)}
		}
		if why := req.Gate(ctx, req.Code, m.Arguments); why != "" {
			data = failureLine(OpToolResult, env.ID, ToolFailDenied, why)
		} else {
			id, _ := json.Marshal(env.ID)
			data = append(append(append([]byte(`{"op":"tool_result","id":`), id...), `,"structured":{"run":true}}`...), '\n')
		}
	}
	c.wmu.Lock()
	_, err := c.conn.Write(data)
	c.wmu.Unlock()
	if err != nil {
		return fmt.Errorf("worker: send the gate's answer: %w", err)
	}
	return nil
}

func failureLine(op, id, kind, message string) []byte {
	f := &ToolFailure{Kind: kind, Message: message}
	var v any = ToolReply{Op: OpToolResult, ID: id, Error: f}
	if op == OpToolCatalog {
		v = ToolCatalog{Op: OpToolCatalog, ID: id, Tools: []ToolSpec{}, Servers: []ServerStatus{}, Error: f}
	}
	data, _ := json.Marshal(v) // strings only: cannot fail
	return append(data, '\n')
}

func (ts *toolServer) refuse(id, kind, message string) {
	ts.answer(func() []byte { return failureLine(OpToolCall, id, kind, message) })
}

// answer writes what build returns from a goroutine of its own, so that
// reading goes on meanwhile; it waits (and so stops reading) while
// maxPendingAnswers answers are under way.
func (ts *toolServer) answer(build func() []byte) {
	ts.answers <- struct{}{}
	ts.wg.Add(1)
	go func() {
		defer ts.wg.Done()
		defer func() { <-ts.answers }()
		ts.write(build())
	}()
}

// makeCatalog asks Tools for the catalog, once per run: a worker may ask
// as often as it likes without costing more than the writes.
func (ts *toolServer) makeCatalog() {
	specs, servers := ts.tools.Catalog(ts.ctx)
	if specs == nil {
		specs = []ToolSpec{}
	}
	if servers == nil {
		servers = []ServerStatus{}
	}
	body, err := json.Marshal(struct {
		Tools   []ToolSpec     `json:"tools"`
		Servers []ServerStatus `json:"servers"`
	}{specs, servers})
	if err != nil {
		f, _ := json.Marshal(&ToolFailure{Kind: ToolFailUnavailable, Message: fmt.Sprintf("the tool catalog could not be encoded: %v", err)})
		body = append(append([]byte(`{"tools":[],"servers":[],"error":`), f...), '}')
	}
	// What follows the id: the body without its opening brace.
	ts.catalog = append(append([]byte{','}, body[1:]...), '\n')
}

// write sends one answer, unless the run is over. A failed write ends the
// run's answers; one cut short also makes the Conn unusable.
func (ts *toolServer) write(data []byte) { ts.writeReleasing(data, nil) }

// writeReleasing is write, calling release (when not nil) once it holds
// the connection, before the answer can reach the worker.
func (ts *toolServer) writeReleasing(data []byte, release func()) {
	c := ts.c
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if release != nil {
		release()
	}
	if ts.closed || ts.ending.Load() {
		return
	}
	n, err := c.conn.Write(data)
	if err != nil {
		ts.closed = true
		if n > 0 {
			ts.broken = fmt.Errorf("worker: send tool reply: %w (cut after %d of %d bytes)", err, n, len(data))
		}
	}
}

// finish ends the run's tool calls once its exchange is over: their ctx
// is cancelled, a reply being written gets lateReplyGrace to complete,
// and no other is written. It returns once every goroutine of the run
// has returned (Tools.Call must return promptly once its ctx is done).
func (ts *toolServer) finish() {
	// Before the cancellation: a call it ends must not write its reply.
	ts.ending.Store(true)
	ts.cancel()
	c := ts.c
	c.setWriteDeadline(time.Now().Add(lateReplyGrace))
	c.wmu.Lock()
	ts.closed = true
	c.wmu.Unlock()
	ts.wg.Wait()
	c.setWriteDeadline(time.Time{})
}
