package worker

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	_ "embed"
)

// Source is worker.py, the program run by `python3 -I -B worker.py`. It must
// not be modified.
//
//go:embed worker.py
var Source []byte

// ToolsSource is sandbox_tools.py, the module that code in a run with
// Request.Tools imports as "tools" (or "pysandbox_tools"). Place it next
// to worker.py, named ToolsFile: the worker reads it from there when a
// run first imports it.
//
//go:embed sandbox_tools.py
var ToolsSource []byte

// CodeFactsSource is codefacts.py, Python's parser on a program without
// running it (internal/codefacts): the worker loads it from next to
// worker.py, named CodeFactsFile, to gate a run on its code's facts.
//
//go:embed codefacts.py
var CodeFactsSource []byte

// CodeFactsFile is the name CodeFactsSource must have in worker.py's
// directory.
const CodeFactsFile = "codefacts.py"

// ToolsFile is the name ToolsSource must have in worker.py's directory.
const ToolsFile = "sandbox_tools.py"

// bootstrap runs worker.py (sys.argv[1]) as the main module through
// compile(). Python keeps a script's whole syntax tree until the script
// returns, and a worker's main loop never does: run as `python worker.py`,
// about 5 MiB of parser memory stayed in every worker and zygote (a lean
// zygote's heap was 6.7 MiB, and is 1.9 MiB now), so each fork copied, and
// each pooled run's exit tore down, some 1 400 page table entries more
// than it needed. compile() frees the tree before a line of the worker
// runs.
const bootstrap = "import sys;exec(compile(open(sys.argv[1],'rb').read(),sys.argv[1],'exec'))"

// Command returns the argv that starts the worker: python is the interpreter,
// scriptPath where Source was placed. A one-shot worker exits after its first
// run with that run's exit code.
func Command(python, scriptPath string, oneshot bool, sites ...string) []string {
	argv := []string{python, "-I", "-B", "-c", bootstrap, scriptPath}
	for _, s := range sites {
		argv = append(argv, "--site", s)
	}
	if oneshot {
		argv = append(argv, "--oneshot")
	}
	return argv
}

// maxLineBytes bounds a single message from the worker. The worker lives in
// the sandbox with the user's code, so it must not be able to make the server
// buffer without limit. The largest legitimate message is a result with
// MaxFiguresTotalBytes of PNG in base64 (4/3 of it) and every other field at
// its bound, JSON-escaped: just under 23 MiB.
const maxLineBytes = MaxFiguresTotalBytes*4/3 + MaxDisplaysTotalBytes + 2<<20

// ErrProtocol marks a message from the worker that breaks the protocol: too
// long, malformed, out of its bounds, or for another request. User code
// can write to the control channel, so this is how a forged reply ends.
var ErrProtocol = errors.New("worker: protocol violation")

// Conn is the Go end of a worker's control channel.
//
// Requests are sent one at a time; concurrent calls wait their turn. Any
// failure that may leave the stream out of step (I/O errors, cancellation
// during an exchange, a malformed reply) makes the Conn unusable: later calls
// return the same error. The caller should then kill the worker.
type Conn struct {
	conn    net.Conn
	maxLine int
	// toolMsgs and toolBytes bound the tool messages of one run
	// (MaxToolMessagesPerRun and MaxToolBytesPerRun unless a test sets
	// smaller ones before the first exchange, so that it can prove the
	// bound without sending half a gigabyte).
	toolMsgs, toolBytes int

	// turn is a one-slot semaphore that can be waited on with a context, and
	// guards the fields below.
	turn   chan struct{}
	r      *bufio.Reader
	ready  *Ready
	nextID uint64
	err    error // sticky

	// wmu serializes writes: during a run with Tools, the answers to its
	// tool messages are written by goroutines of their own.
	wmu sync.Mutex
	// dmu guards cut, set while interruptible has moved the connection's
	// deadline into the past, which nothing else may then move back.
	dmu sync.Mutex
	cut bool

	closeOnce sync.Once
	closeErr  error
}

// NewConn returns a Conn speaking the worker protocol over c, typically the
// parent's end of a socketpair obtained with net.FileConn.
func NewConn(c net.Conn) *Conn {
	return &Conn{
		conn:      c,
		maxLine:   maxLineBytes,
		toolMsgs:  MaxToolMessagesPerRun,
		toolBytes: MaxToolBytesPerRun,
		turn:      make(chan struct{}, 1),
		r:         bufio.NewReaderSize(c, 64<<10),
	}
}

// Close closes the connection, which also unblocks a pending call. A worker
// in the default mode exits when its control channel is closed.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() { c.closeErr = c.conn.Close() })
	return c.closeErr
}

// Ready waits for the worker's first message. Calling it is optional: the
// other methods wait for it if needed. Later calls return the same value.
func (c *Conn) Ready(ctx context.Context) (*Ready, error) {
	if err := c.lock(ctx); err != nil {
		return nil, err
	}
	defer c.unlock()
	if err := c.awaitReady(ctx); err != nil {
		return nil, err
	}
	r := *c.ready
	return &r, nil
}

// Run executes code in the worker. Op and ID of req are set by Run. A
// non-nil error means the exchange itself failed; errors in the user's code
// are reported in the Result.
//
// In a serving worker, runs share one session (see the package comment). To
// stop a run that takes too long without losing the session, send SIGINT to
// the worker and keep waiting: the run ends with a KeyboardInterrupt error.
// Cancelling ctx instead makes the Conn unusable.
//
// With req.Tools set, the run's code may call tools (see OpToolCall): Run
// serves its calls until the run's result is read, each in a goroutine of
// its own, and returns once they have all returned. Their ctx is derived
// from req.ToolsCtx (or ctx) and is cancelled when the result is read. A
// reply the worker did not read whole (see lateReplyGrace) leaves the
// stream out of step: Run still returns the run's result, and the Conn is
// unusable from then on.
func (c *Conn) Run(ctx context.Context, req Request) (*Result, error) {
	req.Op = OpRun
	req.ToolsOn = req.Tools != nil
	req.GateOn = req.Gate != nil
	var res Result
	maxReturn := req.MaxReturnBytes
	if maxReturn <= 0 {
		maxReturn = DefaultMaxReturnBytes
	}
	if err := c.callChecked(ctx, &req, OpResult, &res, func() error { return res.check(maxReturn) }); err != nil {
		return nil, err
	}
	if len(res.ReturnValue) == 0 {
		res.ReturnValue = json.RawMessage("null")
	}
	return &res, nil
}

// check rejects results no well-behaved worker sends: every field within
// the bounds the worker keeps to (see worker.py), so that a result forged
// by user code costs the server no more than a real one.
func (res *Result) check(maxReturn int) error {
	// The worker's JSON is ASCII (ensure_ascii), so its length is its size;
	// a little room for the truncation mark of a repr.
	if len(res.ReturnValue) > maxReturn+64 {
		return fmt.Errorf("worker: return value of %d bytes (the bound is %d)", len(res.ReturnValue), maxReturn)
	}
	if len(res.ReturnText) > MaxReturnTextBytes+64 {
		return fmt.Errorf("worker: return text of %d bytes (the bound is %d)", len(res.ReturnText), MaxReturnTextBytes)
	}
	if e := res.Error; e != nil {
		// Characters, up to 4 bytes each in UTF-8.
		limit := 4 * (MaxErrorChars + 64)
		if len(e.Type) > MaxErrorTypeBytes || len(e.Message) > limit || len(e.Traceback) > limit {
			return fmt.Errorf("worker: error of %d+%d+%d bytes (the bound is %d each)", len(e.Type), len(e.Message), len(e.Traceback), limit)
		}
	}
	switch res.Status {
	case "success", "error":
	default:
		return fmt.Errorf("worker: bad result status %q", clip(res.Status))
	}
	if res.ExitCode < 0 || res.ExitCode > 255 {
		return fmt.Errorf("worker: bad exit code %d", res.ExitCode)
	}
	if len(res.Figures) > MaxFigures || res.FiguresOmitted < 0 {
		return fmt.Errorf("worker: bad figure count %d (+%d omitted)", len(res.Figures), res.FiguresOmitted)
	}
	if len(res.Displays) > MaxDisplays || res.DisplaysOmitted < 0 {
		return fmt.Errorf("worker: bad display count %d (+%d omitted)", len(res.Displays), res.DisplaysOmitted)
	}
	// The worker's own bounds are advice only (code in the sandbox can
	// change any of its globals): these are the server's.
	shown := 0
	for i, d := range res.Displays {
		text, ok := d.Data["text/plain"]
		if !ok || len(d.Data) > len(DisplayMIMETypes) {
			return fmt.Errorf("worker: display %d has no text/plain or too many types", i)
		}
		if len(text) > 4*(MaxDisplayTextBytes+64) {
			return fmt.Errorf("worker: display %d has a text of %d bytes", i, len(text))
		}
		for mime, v := range d.Data {
			if _, ok := DisplayMIMETypes[mime]; !ok {
				return fmt.Errorf("worker: display %d has type %q", i, clip(mime))
			}
			if len(v) > MaxDisplayItemBytes*4/3+64 {
				return fmt.Errorf("worker: display %d as %s has %d bytes", i, clip(mime), len(v))
			}
			shown += len(v)
			if shown > MaxDisplaysTotalBytes {
				return fmt.Errorf("worker: displays of more than %d bytes", MaxDisplaysTotalBytes)
			}
		}
	}
	total := 0
	for i, f := range res.Figures {
		total += len(f.PNG)
		if f.Width < 0 || f.Height < 0 || !(f.DPI >= 0) || len(f.PNG) > MaxFigurePNGBytes || total > MaxFiguresTotalBytes {
			return fmt.Errorf("worker: bad figure %d (%dx%d, dpi %g, %d bytes)", i, f.Width, f.Height, f.DPI, len(f.PNG))
		}
	}
	return nil
}

// Validate compiles code without running it.
func (c *Conn) Validate(ctx context.Context, code, filename string) (*Validation, error) {
	var v Validation
	req := Request{Op: OpValidate, Code: code, Filename: filename}
	if err := c.call(ctx, &req, OpValidated, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// Probe asks the worker to report its isolation as seen from inside.
// hidden are paths that should read as empty or not exist, readOnly paths
// that should be on read-only mounts; the reply names those that are not.
func (c *Conn) Probe(ctx context.Context, hidden, readOnly []string) (*Probe, error) {
	var p Probe
	req := Request{Op: OpProbe, Hidden: hidden, ReadOnly: readOnly}
	if err := c.call(ctx, &req, OpProbed, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// Sync writes marker and a newline to the worker's stdout and stderr, after
// everything Python code in the worker has printed so far, and returns once
// both are written. Reading either stream up to the marker line then yields
// all the output produced before the call (output written directly to the
// file descriptors by threads or child processes may still interleave).
// The marker must be 16 to 128 characters of [A-Za-z0-9_-], and should be
// unpredictable to the user's code.
func (c *Conn) Sync(ctx context.Context, marker string) error {
	if !ValidMarker(marker) {
		return fmt.Errorf("worker: invalid sync marker %q", clip(marker))
	}
	var s Synced
	req := Request{Op: OpSync, Marker: marker}
	return c.call(ctx, &req, OpSynced, &s)
}

// ValidMarker reports whether marker can be used with Sync.
func ValidMarker(marker string) bool {
	if len(marker) < 16 || len(marker) > 128 {
		return false
	}
	for i := 0; i < len(marker); i++ {
		switch b := marker[i]; {
		case 'a' <= b && b <= 'z', 'A' <= b && b <= 'Z', '0' <= b && b <= '9', b == '_', b == '-':
		default:
			return false
		}
	}
	return true
}

// lock waits for the turn to use the connection. It fails without touching
// the connection if ctx is done, so that an already-cancelled call does not
// make the Conn unusable.
func (c *Conn) lock(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return fmt.Errorf("worker: %w", ctx.Err())
	case c.turn <- struct{}{}:
	}
	if err := ctx.Err(); err != nil {
		c.unlock()
		return fmt.Errorf("worker: %w", err)
	}
	return nil
}

func (c *Conn) unlock() { <-c.turn }

// fail records err as the Conn's sticky error. Called with the lock held.
// violation fails the Conn with a protocol violation (see ErrProtocol).
func (c *Conn) violation(err error) error {
	return c.fail(fmt.Errorf("%w (%w)", err, ErrProtocol))
}

func (c *Conn) fail(err error) error {
	if c.err == nil {
		c.err = err
	}
	return err
}

// call sends req (assigning its ID) and decodes the matching reply of type
// wantOp into reply.
func (c *Conn) call(ctx context.Context, req *Request, wantOp string, reply any) error {
	return c.callChecked(ctx, req, wantOp, reply, nil)
}

// callChecked is call, then check (if not nil) on the decoded reply; an
// error from check makes the Conn unusable.
func (c *Conn) callChecked(ctx context.Context, req *Request, wantOp string, reply any, check func() error) error {
	return c.exchange(ctx, req, wantOp, reply, exchangeOpts{check: check})
}

// exchangeOpts are what an exchange does beyond one request line and one
// reply line (snapshots).
type exchangeOpts struct {
	// check, when set, runs on the decoded reply; an error from it makes
	// the Conn unusable.
	check func() error
	// body, when set, writes what follows the request line (a restore's
	// raw bytes), with c.wmu held. Its error makes the Conn unusable,
	// unless it is a bodyError, which is returned once the reply is in.
	body func() error
	// data, when set, takes the messages of op OpSnapshotData that come
	// before the reply (id already checked), and reads what follows them.
	data func(line []byte) error
}

// bodyError is an error of exchangeOpts.body that left the stream in step.
type bodyError struct{ error }

// exchange is callChecked with opts.
func (c *Conn) exchange(ctx context.Context, req *Request, wantOp string, reply any, opts exchangeOpts) error {
	check := opts.check
	if err := c.lock(ctx); err != nil {
		return err
	}
	defer c.unlock()
	if err := c.awaitReady(ctx); err != nil {
		return err
	}
	c.nextID++
	req.ID = strconv.FormatUint(c.nextID, 10)
	data, err := json.Marshal(req)
	if err != nil {
		// Nothing was sent; the Conn is still usable.
		return fmt.Errorf("worker: encode request: %w", err)
	}
	data = append(data, '\n')

	// Tool messages are served only for a run that has Tools; any other
	// exchange answers them with a refusal.
	var ts *toolServer
	refusal := "tool calls are answered only while a run is in flight"
	if req.Op == OpRun {
		if req.Tools != nil {
			ts = c.newToolServer(ctx, req)
		} else {
			refusal = "this run cannot call tools"
		}
	}
	var line []byte
	var env envelope
	var bodyErr error
	err = c.interruptible(ctx, func() error {
		if ts != nil {
			defer ts.finish()
		}
		c.wmu.Lock()
		_, err := c.conn.Write(data)
		if err == nil && opts.body != nil {
			err = opts.body()
			var be bodyError
			if errors.As(err, &be) {
				bodyErr, err = be.error, nil
			}
		}
		c.wmu.Unlock()
		if err != nil {
			return fmt.Errorf("worker: send request: %w", err)
		}
		var toolMsgs, toolBytes int
		gated := false
		for {
			l, err := c.readLine()
			if err != nil {
				return fmt.Errorf("worker: read reply: %w", err)
			}
			env = envelope{}
			if err := json.Unmarshal(l, &env); err != nil {
				return violationError{fmt.Errorf("worker: bad reply: %w", err)}
			}
			if env.Op == OpSnapshotData && opts.data != nil {
				if env.ID != req.ID {
					return violationError{fmt.Errorf("worker: %s message id %q does not match request id %q", env.Op, clip(env.ID), req.ID)}
				}
				if err := opts.data(l); err != nil {
					return err
				}
				continue
			}
			if env.Op != OpToolCall && env.Op != OpToolCatalog && env.Op != OpCodeFacts {
				line = l
				return nil
			}
			// Each message costs the server CPU, refused or not, and
			// nothing charges a run for it: bound what one exchange may
			// send.
			toolMsgs++
			toolBytes += len(l)
			if toolMsgs > c.toolMsgs || toolBytes > c.toolBytes {
				return violationError{fmt.Errorf("worker: the run sent more than %d tool messages or %d bytes of them, the most one run may send", c.toolMsgs, c.toolBytes)}
			}
			if env.Op == OpCodeFacts {
				if err := c.gate(ctx, l, env, req, &gated); err != nil {
					return err
				}
				continue
			}
			if err := c.toolMessage(l, env, ts, refusal); err != nil {
				return err
			}
		}
	})
	if ts != nil && ts.broken != nil {
		// A reply cut short leaves the worker reading half a line: nothing
		// more can be exchanged, but the run's own answer may be good.
		c.fail(ts.broken)
	}
	var ve violationError
	if errors.Is(err, errLineTooLong) {
		return c.violation(err)
	}
	if errors.As(err, &ve) {
		return c.violation(ve.error)
	}
	if err != nil {
		return c.fail(err)
	}

	if env.ID != req.ID {
		return c.violation(fmt.Errorf("worker: reply id %q does not match request id %q", clip(env.ID), req.ID))
	}
	if env.Op == OpError {
		var e ErrorReply
		if err := json.Unmarshal(line, &e); err != nil {
			return c.violation(fmt.Errorf("worker: bad reply: %w", err))
		}
		if bodyErr != nil {
			return bodyErr
		}
		// A well-formed refusal: the stream is still in step.
		return &e
	}
	if env.Op != wantOp {
		return c.violation(fmt.Errorf("worker: got %q reply, want %q", clip(env.Op), wantOp))
	}
	if err := json.Unmarshal(line, reply); err != nil {
		return c.violation(fmt.Errorf("worker: bad %s reply: %w", wantOp, err))
	}
	if check != nil {
		if err := check(); err != nil {
			return c.violation(err)
		}
	}
	if bodyErr != nil {
		return bodyErr
	}
	return nil
}

// awaitReady reads the worker's greeting if it has not been read yet. Called
// with the lock held.
func (c *Conn) awaitReady(ctx context.Context) error {
	if c.err != nil {
		return c.err
	}
	if c.ready != nil {
		return nil
	}
	var line []byte
	err := c.interruptible(ctx, func() error {
		var err error
		line, err = c.readLine()
		if err != nil {
			return fmt.Errorf("worker: read ready: %w", err)
		}
		return nil
	})
	if err != nil {
		return c.fail(err)
	}
	var r Ready
	if err := json.Unmarshal(line, &r); err != nil {
		return c.violation(fmt.Errorf("worker: bad ready message: %w", err))
	}
	if r.Op != OpReady {
		return c.violation(fmt.Errorf("worker: got %q message, want %q", clip(r.Op), OpReady))
	}
	c.ready = &r
	return nil
}

// interruptible runs f, which does blocking I/O on the connection, such that
// cancelling ctx makes that I/O fail (by moving the deadline into the past).
func (c *Conn) interruptible(ctx context.Context, f func() error) error {
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		c.dmu.Lock()
		c.cut = true
		c.conn.SetDeadline(time.Unix(1, 0))
		c.dmu.Unlock()
		close(fired)
	})
	err := f()
	if stop() {
		return err
	}
	<-fired
	if err == nil {
		// The exchange finished just as ctx was cancelled: keep its result
		// and make the connection usable again.
		c.dmu.Lock()
		c.cut = false
		c.conn.SetDeadline(time.Time{})
		c.dmu.Unlock()
		return nil
	}
	return fmt.Errorf("worker: %w", ctx.Err())
}

// setWriteDeadline moves the write deadline unless interruptible has cut
// the connection: a cancellation always wins.
func (c *Conn) setWriteDeadline(t time.Time) {
	c.dmu.Lock()
	defer c.dmu.Unlock()
	if !c.cut {
		c.conn.SetWriteDeadline(t)
	}
}

var errLineTooLong = errors.New("message too long")

// readLine returns the next message without its trailing newline.
func (c *Conn) readLine() ([]byte, error) {
	var line []byte
	for {
		frag, err := c.r.ReadSlice('\n')
		if len(line)+len(frag) > c.maxLine+1 { // +1 for the newline
			return nil, errLineTooLong
		}
		line = append(line, frag...)
		switch {
		case err == nil:
			return bytes.TrimSuffix(line, []byte("\n")), nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF):
			// The worker exited or closed the channel, possibly mid-message.
			return nil, io.ErrUnexpectedEOF
		default:
			return nil, err
		}
	}
}

// clip shortens a string from the worker for use in an error message.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// envelope is what every message from the worker starts with.
type envelope struct {
	Op string `json:"op"`
	ID string `json:"id"`
}

// violationError marks an error found inside an exchange as a protocol
// violation (see Conn.violation).
type violationError struct{ error }

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
