package tools

import (
	"context"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/engine"
)

// liveCode prints, then keeps running: what it printed first must reach
// the client while it still runs.
const liveCode = "import sys, time\nprint('first line', flush=True)\nprint('to stderr', file=sys.stderr, flush=True)\ntime.sleep(4)\nprint('last line')\n"

// TestLiveOutput: a real client sees a run's output while it runs, as
// progress notifications (it sent a progress token) or as log
// notifications (it set a log level), and the result is still whole.
func TestLiveOutput(t *testing.T) {
	var (
		mu       sync.Mutex
		progress []string
		logs     []string
		returned atomic.Bool
		early    atomic.Bool
	)
	copts := &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			mu.Lock()
			progress = append(progress, r.Params.Message)
			mu.Unlock()
			if strings.Contains(r.Params.Message, "first line") && !returned.Load() {
				early.Store(true)
			}
		},
		//lint:ignore SA1019 the live output of pre-2026-07-28 clients is log notifications
		LoggingMessageHandler: func(_ context.Context, r *mcp.LoggingMessageRequest) {
			mu.Lock()
			logs = append(logs, string(r.Params.Level)+" "+r.Params.Logger+" "+r.Params.Data.(string))
			mu.Unlock()
			if strings.Contains(r.Params.Data.(string), "first line") && !returned.Load() {
				early.Store(true)
			}
		},
	}
	cs := connectWith(t, nil, nil, copts)
	ctx := context.Background()

	params := &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": liveCode}}
	params.SetProgressToken("live-1")
	res, err := cs.CallTool(ctx, params)
	returned.Store(true)
	if err != nil || res.IsError || !strings.Contains(text(res), "first line") || !strings.Contains(text(res), "last line") {
		t.Fatalf("the result: %v %s", err, text(res))
	}
	mu.Lock()
	got := strings.Join(progress, "\n")
	mu.Unlock()
	if !early.Load() || !strings.Contains(got, "stdout: first line") || !strings.Contains(got, "stderr: to stderr") {
		t.Errorf("progress while running (early %v): %q", early.Load(), got)
	}

	// Without a token, as log notifications once the client set a level
	// (protocol versions before 2026-07-28, which deprecates logging).
	early.Store(false)
	returned.Store(false)
	cs = connectFull(t, nil, nil, copts, &mcp.ClientSessionOptions{ProtocolVersion: "2025-06-18"})
	//lint:ignore SA1019 the live output of pre-2026-07-28 clients is log notifications
	if err := cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "info"}); err != nil {
		t.Fatal(err)
	}
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": liveCode}})
	returned.Store(true)
	if err != nil || res.IsError {
		t.Fatalf("%v %+v", err, res)
	}
	time.Sleep(100 * time.Millisecond) // notifications are handled concurrently
	mu.Lock()
	got = strings.Join(logs, "\n")
	mu.Unlock()
	if !early.Load() || !strings.Contains(got, "info stdout first line") || !strings.Contains(got, "warning stderr to stderr") {
		t.Errorf("log notifications while running (early %v): %q", early.Load(), got)
	}
}

// TestLiveOutputBounded: a flood reaches the client only up to the bound,
// with one notice; the result is as complete as ever.
func TestLiveOutputBounded(t *testing.T) {
	var total atomic.Int64
	var notice atomic.Bool
	cs := connectWith(t, nil, nil, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			total.Add(int64(len(r.Params.Message)))
			if strings.Contains(r.Params.Message, "live output stops here") {
				notice.Store(true)
			}
		},
	})
	params := &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "for i in range(40000): print('x' * 60)"}}
	params.SetProgressToken("flood")
	if _, err := cs.CallTool(context.Background(), params); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if n := total.Load(); n > liveTotal+64<<10 || !notice.Load() {
		t.Errorf("%d bytes of live output, notice %v", n, notice.Load())
	}
}

// TestLiveOutputInvalidUTF8: a byte that is not UTF-8 does not stop the
// live output; it goes as U+FFFD.
func TestLiveOutputInvalidUTF8(t *testing.T) {
	var mu sync.Mutex
	var got []string
	cs := connectWith(t, nil, nil, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			mu.Lock()
			got = append(got, r.Params.Message)
			mu.Unlock()
		},
	})
	params := &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "import os, time, sys\nos.write(1, b'\\xff')\nfor i in range(3):\n    print('line', i, 'é', flush=True)\n    time.sleep(0.3)\n"}}
	params.SetProgressToken("bad")
	if _, err := cs.CallTool(context.Background(), params); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	mu.Lock()
	all := strings.Join(got, "")
	mu.Unlock()
	if !strings.Contains(all, "\ufffd") || !strings.Contains(all, "line 2 é") {
		t.Errorf("live output after a bad byte: %q", all)
	}
}

// TestIncompleteTail: what a flush holds back of a chunk (engine.Head):
// only a character cut at its end.
func TestIncompleteTail(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
	}{{"abc", 0}, {"ab\xc3", 1}, {"ab\xe2\x82", 2}, {"é", 0}, {"\xff", 0}, {"a\xf0\x9f\x90", 3}, {"🐍", 0}} {
		if got := len(tc.in) - len(engine.Head(tc.in, len(tc.in))); got != tc.want {
			t.Errorf("%q: %d, want %d", tc.in, got, tc.want)
		}
	}
}

// BenchmarkLiveOutput compares a run that prints with and without a
// progress token (its output then streamed as notifications), and with
// spawning python3, in the same run.
func BenchmarkLiveOutput(b *testing.B) {
	cs := connectFull(b, nil, nil, &mcp.ClientOptions{ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) {}}, nil)
	code := "for i in range(20): print('line', i)"
	for _, streamed := range []bool{false, true} {
		name := "plain"
		if streamed {
			name = "streamed"
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				p := &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": code}}
				if streamed {
					p.SetProgressToken("b")
				}
				if res, err := cs.CallTool(context.Background(), p); err != nil || res.IsError {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("python3 -c", func(b *testing.B) {
		for b.Loop() {
			if err := exec.Command("/usr/bin/python3", "-c", code).Run(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
