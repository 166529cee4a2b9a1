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
