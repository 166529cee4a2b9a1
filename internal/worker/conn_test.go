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
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// A worker that dies in the middle of a run must produce an error, not a
// hang, and the Conn must stay failed afterwards.
func TestWorkerDiesMidRun(t *testing.T) {
	for _, code := range []string{
		"import os\nprint('bye')\nos._exit(7)",
		"import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
	} {
		w := startPython(t, systemPython, false)
		start := time.Now()
		_, err := w.conn.Run(testContext(t), Request{Code: code})
		if !errors.Is(err, io.ErrUnexpectedEOF) || !strings.HasPrefix(err.Error(), "worker: read reply: ") {
			t.Errorf("Run(%q) error = %v, want unexpected EOF", code, err)
		}
		if d := time.Since(start); d > 60*time.Second {
			t.Errorf("took %v", d)
		}
		if _, err2 := w.conn.Run(testContext(t), Request{Code: "1"}); !errors.Is(err2, io.ErrUnexpectedEOF) {
			t.Errorf("second Run error = %v, want the first error again", err2)
		}
	}
}

func TestContextCancelsRun(t *testing.T) {
	w := startPython(t, systemPython, false)
	if _, err := w.conn.Ready(testContext(t)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := w.conn.Run(ctx, Request{Code: "import time\ntime.sleep(30)"})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error = %v, want deadline exceeded", err)
	}
	// Well under the 30 s sleep: the context, not the code, ended it.
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("cancellation took %v", d)
	}
	// The reply to the abandoned run would arrive later: the Conn must not
	// be reused.
	if _, err := w.conn.Probe(testContext(t), nil, nil); err == nil {
		t.Error("Conn usable after a cancelled exchange")
	}
}

func TestCloseUnblocksRun(t *testing.T) {
	w := startPython(t, systemPython, false)
	errc := make(chan error, 1)
	go func() {
		_, err := w.conn.Run(context.Background(), Request{Code: "import time\ntime.sleep(30)"})
		errc <- err
	}()
	time.Sleep(200 * time.Millisecond)
	w.conn.Close()
	select {
	case err := <-errc:
		if err == nil {
			t.Error("Run succeeded after Close")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not unblock Run")
	}
}

func TestCancelledBeforeStart(t *testing.T) {
	w := startPython(t, systemPython, false)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := w.conn.Run(ctx, Request{Code: "1"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("error = %v", err)
	}
	// Nothing was exchanged, so the Conn is still fine.
	res, _, _ := w.run(t, Request{Code: "2"})
	jsonEqual(t, res.ReturnValue, "2")
}

func TestUnknownOp(t *testing.T) {
	w := startPython(t, systemPython, false)
	err := w.conn.call(testContext(t), &Request{Op: "bogus"}, "bogus-reply", new(struct{}))
	var er *ErrorReply
	if !errors.As(err, &er) || !strings.Contains(er.Message, "bogus") || er.ID != "1" {
		t.Fatalf("error = %v, want an ErrorReply", err)
	}
	// A refusal keeps the stream in step.
	res, _, _ := w.run(t, Request{Code: "'ok'"})
	jsonEqual(t, res.ReturnValue, `"ok"`)
}

func TestConcurrentCallsAreSerialized(t *testing.T) {
	w := startPython(t, systemPython, false)
	ctx := testContext(t)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := w.conn.Run(ctx, Request{Code: "n * 2", Inputs: map[string]json.RawMessage{"n": json.RawMessage(fmt.Sprint(i))}})
			if err == nil && string(res.ReturnValue) != fmt.Sprint(i*2) {
				err = fmt.Errorf("run %d returned %s", i, res.ReturnValue)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// User code shares the worker's process and can write to the control socket,
// so everything read from it is hostile input: the Conn must fail cleanly.
func TestHostileReplies(t *testing.T) {
	for _, c := range []struct {
		name, payload, wantErr string
	}{
		{"not json", `b"\xff not json\n"`, "bad reply"},
		{"wrong id", `b'{"op":"result","id":"999","status":"success"}\n'`, "does not match"},
		{"wrong op", `b'{"op":"probed","id":"1"}\n'`, "want \"result\""},
		{"bad status", `b'{"op":"result","id":"1","status":"pwned"}\n'`, "bad result status"},
		{"bad exit code", `b'{"op":"result","id":"1","status":"error","exit_code":-5}\n'`, "bad exit code"},
		{"bad field type", `b'{"op":"result","id":"1","status":1}\n'`, "bad result reply"},
		{"figure not base64", `b'{"op":"result","id":"1","status":"success","figures":[{"png":"!!"}]}\n'`, "bad result reply"},
		{"negative figure size", `b'{"op":"result","id":"1","status":"success","figures":[{"png":"","width":-1,"height":1,"dpi":1}]}\n'`, "bad figure 0"},
		{"too many figures", `b'{"op":"result","id":"1","status":"success","figures":[' + b','.join([b'{"png":""}'] * 17) + b']}\n'`, "bad figure count"},
		{"negative figures omitted", `b'{"op":"result","id":"1","status":"success","figures_omitted":-1}\n'`, "bad figure count"},
		{"deep nesting", `b'{"op":"result","id":"1","status":"success","return_value":' + b'[' * 100000 + b'\n'`, "bad reply"},
		{"too long", `b'{"op":"result","id":"1","x":"' + b'x' * (2 << 20)`, "message too long"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			w := startPython(t, systemPython, false)
			w.conn.maxLine = 1 << 20
			code := "import os\ndata = " + c.payload + "\nwhile data:\n    data = data[os.write(3, data):]\nimport time\ntime.sleep(30)"
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := w.conn.Run(ctx, Request{Code: code})
			if err == nil || !strings.Contains(err.Error(), c.wantErr) || !strings.HasPrefix(err.Error(), "worker: ") {
				t.Fatalf("error = %v, want %q", err, c.wantErr)
			}
			if _, err2 := w.conn.Probe(ctx, nil, nil); err2 == nil {
				t.Error("Conn usable after a hostile reply")
			}
		})
	}
}

func TestBadReadyMessage(t *testing.T) {
	requirePython(t, systemPython)
	for _, c := range []struct{ script, wantErr string }{
		{`import os; os.write(3, b'{"op":"result"}\n')`, `want "ready"`},
		{`import os; os.write(3, b'{"op":"ready"')`, "unexpected EOF"},
		{`pass`, "unexpected EOF"},
	} {
		w := startWorker(t, []string{systemPython, "-I", "-c", c.script + "\nimport time; time.sleep(0.1)"})
		_, err := w.conn.Ready(testContext(t))
		if err == nil || !strings.Contains(err.Error(), c.wantErr) {
			t.Errorf("%s: error = %v, want %q", c.script, err, c.wantErr)
		}
		if _, err := w.conn.Run(testContext(t), Request{Code: "1"}); err == nil {
			t.Errorf("%s: Run succeeded after a bad greeting", c.script)
		}
	}
}

func TestValidMarker(t *testing.T) {
	for m, want := range map[string]bool{
		"0123456789abcdef":       true,
		strings.Repeat("A", 128): true,
		"A-B_C-D_0123456789-z":   true,
		"0123456789abcde":        false,
		strings.Repeat("A", 129): false,
		"0123456789abcdef\n":     false,
		"0123456789 abcdef":      false,
		"0123456789abcdef.":      false,
		"0123456789abcdéf":       false,
		"":                       false,
	} {
		if got := ValidMarker(m); got != want {
			t.Errorf("ValidMarker(%q) = %v, want %v", m, got, want)
		}
	}
}

// pairConn returns a Conn over a socketpair and the other end, for a
// worker played by the test.
func pairConn(t *testing.T) (*Conn, *net.UnixConn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) net.Conn {
		f := os.NewFile(uintptr(fd), "pair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	c := NewConn(conn(fds[0]))
	return c, conn(fds[1]).(*net.UnixConn)
}

// bigTools answers every call with size bytes of text.
type bigTools struct{ size int }

func (b bigTools) Catalog(context.Context) ([]ToolSpec, []ServerStatus) { return nil, nil }

func (b bigTools) Call(ctx context.Context, name string, args json.RawMessage) ToolReply {
	data, _ := json.Marshal([]map[string]string{{"type": "text", "text": strings.Repeat("x", b.size)}})
	return ToolReply{Content: data}
}

// fakeWorker plays a worker that sends a tool call during its run, and
// waits until the reply has begun to arrive without reading it (8 MiB do
// not fit in the socket's buffer, so the Conn is in the middle of writing
// it). It returns the reader it read the run request with.
func fakeWorker(wc *net.UnixConn) (*bufio.Reader, error) {
	r := bufio.NewReader(wc)
	if _, err := wc.Write([]byte(`{"op":"ready","python":"3.11.0","version":[3,11],"pid":1}` + "\n")); err != nil {
		return nil, err
	}
	if _, err := r.ReadBytes('\n'); err != nil {
		return nil, err
	}
	if _, err := wc.Write([]byte(`{"op":"tool_call","id":"t1","name":"a.b","arguments":{}}` + "\n")); err != nil {
		return nil, err
	}
	raw, err := wc.SyscallConn()
	if err != nil {
		return nil, err
	}
	buf := make([]byte, 1)
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		n := 0
		raw.Read(func(fd uintptr) bool {
			n, _, _ = syscall.Recvfrom(int(fd), buf, syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			return true
		})
		if n > 0 {
			return r, nil
		}
	}
	return nil, errors.New("the reply never began")
}

const runResult = `{"op":"result","id":"1","status":"success","exit_code":0,"return_value":1}` + "\n"

// A reply under way when the result is read is completed: the worker
// reads it (and drops it) after its result, and the stream stays in step.
func TestLateToolReplyCompleted(t *testing.T) {
	c, wc := pairConn(t)
	done := make(chan error, 1)
	go func() {
		done <- func() error {
			r, err := fakeWorker(wc)
			if err != nil {
				return err
			}
			wc.Write([]byte(runResult))
			line, err := r.ReadBytes('\n')
			if err != nil || !bytes.HasPrefix(line, []byte(`{"op":"tool_result","id":"t1"`)) || len(line) < 8<<20 {
				return fmt.Errorf("late reply of %d bytes: %v", len(line), err)
			}
			if _, err := r.ReadBytes('\n'); err != nil { // validate
				return err
			}
			_, err = wc.Write([]byte(`{"op":"validated","id":"2","valid":true}` + "\n"))
			return err
		}()
	}()
	res, err := c.Run(testContext(t), Request{Code: "1", Tools: bigTools{8 << 20}})
	if err != nil || res.Status != "success" {
		t.Fatalf("Run: %+v, %v", res, err)
	}
	if v, err := c.Validate(testContext(t), "1", ""); err != nil || !v.Valid {
		t.Fatalf("Validate after the run: %+v, %v", v, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A worker that does not read the reply under way when its result comes
// cannot hold the Conn: the write is cut after lateReplyGrace, the run's
// result is returned, and the Conn is unusable (half a line was sent).
func TestLateToolReplyCut(t *testing.T) {
	defer func(d time.Duration) { lateReplyGrace = d }(lateReplyGrace)
	lateReplyGrace = 200 * time.Millisecond
	c, wc := pairConn(t)
	done := make(chan error, 1)
	go func() {
		_, err := fakeWorker(wc)
		if err == nil {
			_, err = wc.Write([]byte(runResult))
		}
		done <- err
	}()
	defer func() {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	start := time.Now()
	res, err := c.Run(testContext(t), Request{Code: "1", Tools: bigTools{8 << 20}})
	if err != nil || res.Status != "success" {
		t.Fatalf("Run: %+v, %v", res, err)
	}
	if d := time.Since(start); d > hangGuard {
		t.Errorf("Run took %v", d)
	}
	if _, err := c.Validate(testContext(t), "1", ""); err == nil || !strings.Contains(err.Error(), "cut after") {
		t.Fatalf("Validate after a cut reply: %v", err)
	}
}

// Cancelling ctx ends a run whose tool reply is stuck in a write to a
// worker that reads nothing: the cut deadline wins over the writes'.
func TestCancelRunWithStuckToolReply(t *testing.T) {
	c, wc := pairConn(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		fakeWorker(wc) // fails once the test closes its end: no matter
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := c.Run(ctx, Request{Code: "1", Tools: bigTools{8 << 20}})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v", err)
	}
	wc.Close()
	<-done
}

// TestToolBoundsDefaults: a Conn as the server makes it has the per-run
// tool-message bounds docs/upstream.md documents (tests prove the mechanism with
// smaller ones, see TestToolsHostile).
func TestToolBoundsDefaults(t *testing.T) {
	c := NewConn(nil)
	if c.toolMsgs != 200_000 || c.toolBytes != 512<<20 {
		t.Fatalf("a new Conn bounds a run to %d tool messages and %d bytes, want 200000 and 512 MiB", c.toolMsgs, c.toolBytes)
	}
	readme, err := os.ReadFile("../../docs/upstream.md")
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("more than %d %03d tool messages or %d MiB of them in one run", c.toolMsgs/1000, c.toolMsgs%1000, c.toolBytes>>20)
	if !bytes.Contains(readme, []byte(want)) {
		t.Errorf("docs/upstream.md does not say %q", want)
	}
}
