package worker

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"
)

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
