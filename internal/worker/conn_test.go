package worker

import (
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
