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
	"time"

	_ "embed"
)

// Source is worker.py, the program run by `python3 -I -B worker.py`. It must
// not be modified.
//
//go:embed worker.py
var Source []byte

// Command returns the argv that starts the worker: python is the interpreter,
// scriptPath where Source was placed. A one-shot worker exits after its first
// run with that run's exit code.
func Command(python, scriptPath string, oneshot bool, sites ...string) []string {
	argv := []string{python, "-I", "-B", scriptPath}
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
const maxLineBytes = MaxFiguresTotalBytes*4/3 + 2<<20

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

	// turn is a one-slot semaphore that can be waited on with a context, and
	// guards the fields below.
	turn   chan struct{}
	r      *bufio.Reader
	ready  *Ready
	nextID uint64
	err    error // sticky

	closeOnce sync.Once
	closeErr  error
}

// NewConn returns a Conn speaking the worker protocol over c, typically the
// parent's end of a socketpair obtained with net.FileConn.
func NewConn(c net.Conn) *Conn {
	return &Conn{
		conn:    c,
		maxLine: maxLineBytes,
		turn:    make(chan struct{}, 1),
		r:       bufio.NewReaderSize(c, 64<<10),
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
func (c *Conn) Run(ctx context.Context, req Request) (*Result, error) {
	req.Op = OpRun
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

	var line []byte
	err = c.interruptible(ctx, func() error {
		if _, err := c.conn.Write(data); err != nil {
			return fmt.Errorf("worker: send request: %w", err)
		}
		var err error
		line, err = c.readLine()
		if err != nil {
			return fmt.Errorf("worker: read reply: %w", err)
		}
		return nil
	})
	if errors.Is(err, errLineTooLong) {
		return c.violation(err)
	}
	if err != nil {
		return c.fail(err)
	}

	var env struct {
		Op string `json:"op"`
		ID string `json:"id"`
	}
	if err := json.Unmarshal(line, &env); err != nil {
		return c.violation(fmt.Errorf("worker: bad reply: %w", err))
	}
	if env.ID != req.ID {
		return c.violation(fmt.Errorf("worker: reply id %q does not match request id %q", clip(env.ID), req.ID))
	}
	if env.Op == OpError {
		var e ErrorReply
		if err := json.Unmarshal(line, &e); err != nil {
			return c.violation(fmt.Errorf("worker: bad reply: %w", err))
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
		c.conn.SetDeadline(time.Unix(1, 0))
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
		c.conn.SetDeadline(time.Time{})
		return nil
	}
	return fmt.Errorf("worker: %w", ctx.Err())
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
