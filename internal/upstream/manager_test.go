package upstream

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/testutil"
	"github.com/pysandbox/pysandbox/internal/testutil/refservers"
)

// A deadline that only guards against a hang.
const hang = 2 * time.Minute

func start(t *testing.T, servers map[string]any, o Options) *Manager {
	t.Helper()
	doc, _ := json.Marshal(map[string]any{"mcpServers": servers})
	cfg, err := Parse(doc, "test.json")
	if err != nil {
		t.Fatal(err)
	}
	if o.RestartDelay == 0 {
		o.RestartDelay = 50 * time.Millisecond
	}
	m := Start(cfg, o)
	t.Cleanup(func() { m.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	m.WaitReady(ctx)
	return m
}

func status(m *Manager, name string) Status {
	for _, st := range m.Status() {
		if st.Name == name {
			return st
		}
	}
	return Status{}
}

// waitFor polls until cond holds (a guard against a hang, not a timing).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(hang)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func text(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// TestCrashMidCall: an upstream killed during a call fails that call
// with a clear error, and is started again.
func TestCrashMidCall(t *testing.T) {
	evCmd, evArgs := refservers.Everything(t)
	var wire testutil.SyncBuffer
	m := start(t, map[string]any{"everything": map[string]any{"command": evCmd, "args": evArgs}}, Options{Wrap: func(_ string, tr mcp.Transport) mcp.Transport {
		return &mcp.LoggingTransport{Transport: tr, Writer: &wire}
	}})
	s := m.byName["everything"]
	s.mu.Lock()
	pid := s.pid
	s.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		_, err := m.Call(context.Background(), "everything.trigger-long-running-operation", json.RawMessage(`{"duration": 60, "steps": 60}`))
		done <- err
	}()
	// Once the call reached the server: one made after the kill would
	// wait for the restart, and run.
	waitFor(t, "the call to be sent", func() bool {
		return strings.Contains(wire.String(), `trigger-long-running-operation","arguments`)
	})
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), `"everything" stopped during the call`) {
			t.Errorf("the call: %v", err)
		}
	case <-time.After(hang):
		t.Fatal("the call did not end when its server died")
	}
	waitFor(t, "the server to be started again", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.state == StateReady && s.pid != pid
	})
	res, err := m.Call(context.Background(), "everything.echo", json.RawMessage(`{"message": "back"}`))
	if err != nil || !strings.Contains(text(res), "back") {
		t.Errorf("after the restart: %v %v", res, err)
	}
}

// TestCloseStopsChildren: Close ends a stdio server and what it started.
func TestCloseStopsChildren(t *testing.T) {
	evCmd, evArgs := refservers.Everything(t)
	pidFile := filepath.Join(t.TempDir(), "sleep.pid")
	// A shell that leaves a grandchild behind, as npx does.
	script := fmt.Sprintf(`sleep 1000 & echo $! > %s; exec "$0" "$@"`, pidFile)
	m := start(t, map[string]any{"everything": map[string]any{"command": "sh", "args": append([]string{"-c", script, evCmd}, evArgs...)}}, Options{})
	if st := status(m, "everything"); st.State != StateReady {
		t.Fatalf("%+v", st)
	}
	data, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	sleepPid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	s := m.byName["everything"]
	s.mu.Lock()
	pid := s.pid
	s.mu.Unlock()
	m.Close()
	for _, p := range []int{pid, sleepPid} {
		waitFor(t, fmt.Sprintf("pid %d to be gone", p), func() bool { return gone(p) })
	}
}

// gone reports whether pid is no longer running (a zombie that nobody
// here reaps counts as gone).
func gone(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	return len(f) > 0 && f[0] == "Z"
}

// TestListChanged: tools added and removed by a server (the SDK's own
// server, over an in-memory transport) are followed.
func TestListChanged(t *testing.T) {
	srv := mcp.NewServer(&mcp.Implementation{Name: "changing", Version: "1"}, nil)
	add := func(name string) {
		mcp.AddTool(srv, &mcp.Tool{Name: name, Description: "adds"}, func(ctx context.Context, req *mcp.CallToolRequest, in struct {
			A int `json:"a"`
		}) (*mcp.CallToolResult, struct{}, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: name + " " + strconv.Itoa(in.A)}}}, struct{}{}, nil
		})
	}
	add("one")
	m := start(t, map[string]any{"changing": map[string]any{"command": "unused"}}, Options{Wrap: func(name string, _ mcp.Transport) mcp.Transport {
		ct, st := mcp.NewInMemoryTransports()
		if _, err := srv.Connect(context.Background(), st, nil); err != nil {
			t.Error(err)
		}
		return ct
	}})
	if _, ok := m.Lookup("changing.one"); !ok {
		t.Fatalf("tools: %+v status %+v", m.Tools(), m.Status())
	}
	add("two")
	waitFor(t, "the new tool", func() bool { _, ok := m.Lookup("changing.two"); return ok })
	srv.RemoveTools("one")
	waitFor(t, "the removed tool to go", func() bool { _, ok := m.Lookup("changing.one"); return !ok })
	res, err := m.Call(context.Background(), "changing.two", json.RawMessage(`{"a": 5}`))
	if err != nil || text(res) != "two 5" {
		t.Errorf("%v %v", res, err)
	}
}
