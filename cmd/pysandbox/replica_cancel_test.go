package main

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/testutil"
)

// TestReplicaCancel: a call on another replica's session gets the owner's
// progress notifications (its live output, and so its heartbeat), and one
// that its client cancels stops the run at the owner too, as a cancelled
// call on the owner itself does: the session is free for the next call at
// once, not when the abandoned run would have ended.
func TestReplicaCancel(t *testing.T) {
	rs := startReplicas(t, 2)
	ctx := context.Background()
	alice0 := connectHTTP(ctx, t, rs.urls[0], "alice-0123456789abcdef")
	// The call through replica 1 says, by its live output, that the run
	// has started at the owner.
	started := make(chan struct{})
	var once sync.Once
	client := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			if strings.Contains(r.Params.Message, "started") {
				once.Do(func() { close(started) })
			}
		}})
	alice1, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: rs.urls[1] + "/mcp", HTTPClient: &http.Client{Transport: testutil.Bearer("alice-0123456789abcdef", nil)}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer alice1.Close()
	_, out := callTool(t, alice0, "create_session", nil)
	id, _ := out["session_id"].(string)
	callTool(t, alice0, "run_python", map[string]any{"session_id": id, "code": "x = 41"})

	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		p := &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{
			"session_id": id, "code": "import time\nprint('started', flush=True)\ntime.sleep(600)", "timeout_seconds": 300}}
		p.SetProgressToken("t1")
		_, err := alice1.CallTool(cctx, p)
		done <- err
	}()
	select {
	case <-started:
	case <-time.After(time.Minute):
		t.Fatal("no live output from the run in a minute")
	}
	cancel()
	<-done
	start := time.Now()
	for {
		res, out := callTool(t, alice0, "run_python", map[string]any{"session_id": id, "code": "x + 1"})
		if !res.IsError && out["return_value"] == float64(42) {
			break
		}
		if time.Since(start) > time.Minute {
			t.Fatalf("the session is still taken a minute after its call was cancelled: %s", toolText(res))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("the session was free %v after the cancel", time.Since(start).Round(time.Millisecond))
}
