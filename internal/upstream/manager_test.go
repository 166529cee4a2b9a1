package upstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
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

// TestStdioAndHTTP: the reference servers on stdio and on streamable
// HTTP, listed and called; one that never starts is a clear failure
// that leaves the others working.
func TestStdioAndHTTP(t *testing.T) {
	evCmd, evArgs := refservers.Everything(t)
	memCmd, memArgs := refservers.Memory(t, filepath.Join(t.TempDir(), "memory.jsonl"))
	url := refservers.EverythingHTTP(t)
	t.Setenv("UPSTREAM_TEST_SECRET", "not-for-upstreams")
	var logBuf testutil.SyncBuffer
	m := start(t, map[string]any{
		"everything": map[string]any{"command": evCmd, "args": evArgs, "env": map[string]string{"GIVEN": "${UPSTREAM_TEST_SECRET}"}},
		"memory":     map[string]any{"command": memCmd, "args": memArgs},
		"remote":     map[string]any{"url": url},
		"missing":    map[string]any{"command": "/nonexistent/mcp-server"},
		"exits":      map[string]any{"command": "sh", "args": []string{"-c", "echo 'cannot open the database' >&2; exit 3"}},
	}, Options{Log: slog.New(slog.NewTextHandler(&logBuf, nil))})
	for _, name := range []string{"everything", "memory", "remote"} {
		if st := status(m, name); st.State != StateReady || st.Tools == 0 {
			t.Errorf("%s: %+v", name, st)
		}
	}
	// It failed, and may already be in its next attempt (the restart
	// delay is short here, and a loaded machine can take longer than it
	// to ready the others): either way it is not ready and says why.
	if st := status(m, "missing"); st.State == StateReady || !strings.Contains(st.Error, "/nonexistent/mcp-server") {
		t.Errorf("missing: %+v", st)
	}
	// What a server prints is the operator's to read (the log), not the
	// agent's or the code's.
	if st := status(m, "exits"); st.State == StateReady || strings.Contains(st.Error, "cannot open the database") || !strings.Contains(st.Error, "server's log") {
		t.Errorf("a server that exits at once: %+v", st)
	}
	if !strings.Contains(logBuf.String(), "cannot open the database") {
		t.Errorf("the log does not say what the server printed:\n%s", logBuf.String())
	}
	ctx := context.Background()
	// A stdio server gets what it needs of the environment and what the
	// file gives it, not every variable of this server.
	res, err := m.Call(ctx, "everything.get-env", json.RawMessage(`{}`))
	if err != nil || strings.Count(text(res), "not-for-upstreams") != 1 || !strings.Contains(text(res), `"GIVEN"`) || !strings.Contains(text(res), `"PATH"`) {
		t.Errorf("the upstream's environment: %v %v", text(res), err)
	}
	for _, name := range []string{"everything.get-sum", "remote.get-sum"} {
		if _, ok := m.Lookup(name); !ok {
			t.Fatalf("no %s among %d tools", name, len(m.Tools()))
		}
		res, err := m.Call(ctx, name, json.RawMessage(`{"a": 2, "b": 40}`))
		if err != nil || !strings.Contains(text(res), "42") {
			t.Errorf("%s: %v %v", name, res, err)
		}
	}
	res, err = m.Call(ctx, "memory.read_graph", json.RawMessage(`{}`))
	if err != nil || res.StructuredContent == nil {
		t.Errorf("memory.read_graph: %+v %v", res, err)
	}
	// A tool's own error is a result, not a failure of the call.
	res, err = m.Call(ctx, "everything.get-sum", json.RawMessage(`{"a": "x"}`))
	if err != nil || !res.IsError {
		t.Errorf("bad arguments upstream: %+v %v", res, err)
	}
	for _, c := range []struct{ name, args, want string }{
		{"everything.get-sum", `{"a": "two", "b": 1}`, "do not match the tool's input schema"},
		{"everything.get-sum", `{"b": 1}`, "do not match"},
		{"everything.get-sum", `[1]`, "must be a JSON object"},
		{"everything.get-sum", `{`, "not JSON"},
	} {
		if err := m.Validate(c.name, json.RawMessage(c.args)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate(%s, %s) = %v, want %q", c.name, c.args, err, c.want)
		}
	}
	if err := m.Validate("everything.get-sum", json.RawMessage(`{"a": 1, "b": 2}`)); err != nil {
		t.Errorf("good arguments: %v", err)
	}
	for _, name := range []string{"everything.nope", "nope.get-sum", "missing.tool", "nodot", ""} {
		if _, err := m.Call(ctx, name, json.RawMessage(`{}`)); err == nil {
			t.Errorf("%q: no error", name)
		} else if name != "missing.tool" && !errors.Is(err, ErrUnknownTool) {
			t.Errorf("%q: %v", name, err)
		}
	}
	if _, err := m.Call(ctx, "missing.tool", json.RawMessage(`{}`)); err == nil || !strings.Contains(err.Error(), `"missing" failed`) {
		t.Errorf("a call to a failed server: %v", err)
	}
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

// TestHostileCatalog: what a server lists is bounded: too many tools,
// names that are not names, schemas too large, duplicates.
func TestHostileCatalog(t *testing.T) {
	srv := mcp.NewServer(&mcp.Implementation{Name: "hostile", Version: "1"}, nil)
	h := func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{}, nil
	}
	obj := map[string]any{"type": "object"}
	for i := 0; i < MaxTools+20; i++ {
		srv.AddTool(&mcp.Tool{Name: fmt.Sprintf("t%04d", i), InputSchema: obj}, h)
	}
	big := map[string]any{"type": "object", "description": strings.Repeat("x", MaxSchema)}
	srv.AddTool(&mcp.Tool{Name: "a-big", InputSchema: big}, h)
	srv.AddTool(&mcp.Tool{Name: "a-long-description", InputSchema: obj, Description: strings.Repeat("é", MaxDescription)}, h)
	m := start(t, map[string]any{"hostile": map[string]any{"command": "unused"}}, Options{Wrap: func(string, mcp.Transport) mcp.Transport {
		ct, st := mcp.NewInMemoryTransports()
		srv.Connect(context.Background(), st, nil)
		return ct
	}})
	tools := m.Tools()
	if len(tools) != MaxTools {
		t.Errorf("%d tools, want the first %d", len(tools), MaxTools)
	}
	if _, ok := m.Lookup("hostile.a-big"); ok {
		t.Error("a tool with a schema over the bound was kept")
	}
	if tl, ok := m.Lookup("hostile.a-long-description"); !ok || len(tl.Description) > MaxDescription+3 || !strings.HasSuffix(tl.Description, "é...") {
		t.Errorf("long description: %v %d", ok, len(tl.Description))
	}
}

// TestHeaders: an HTTP server gets the configured headers, with ${VAR}
// taken from the environment; a wrong token is a clear failure.
func TestHeaders(t *testing.T) {
	t.Setenv("UPSTREAM_TEST_TOKEN", "right")
	srv := mcp.NewServer(&mcp.Implementation{Name: "authed", Version: "1"}, nil)
	srv.AddTool(&mcp.Tool{Name: "whoami", InputSchema: map[string]any{"type": "object"}}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil
	})
	handler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	var refused atomic.Int32
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer right" {
			refused.Add(1)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		handler.ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)
	m := start(t, map[string]any{
		"good": map[string]any{"url": hs.URL, "headers": map[string]string{"Authorization": "Bearer ${UPSTREAM_TEST_TOKEN}"}},
		"bad":  map[string]any{"url": hs.URL, "headers": map[string]string{"Authorization": "Bearer wrong"}},
	}, Options{})
	if st := status(m, "good"); st.State != StateReady {
		t.Errorf("good: %+v", st)
	}
	// Failed, or already in its next attempt after the short restart delay.
	if st := status(m, "bad"); st.State == StateReady || !strings.Contains(st.Error, "401") && !strings.Contains(strings.ToLower(st.Error), "unauthorized") {
		t.Errorf("bad: %+v", st)
	}
	if res, err := m.Call(context.Background(), "good.whoami", json.RawMessage(`{}`)); err != nil || text(res) != "ok" {
		t.Errorf("%v %v", res, err)
	}
	if refused.Load() == 0 {
		t.Error("the wrong token never reached the server")
	}
}

// TestHTTPReplyBounded: an HTTP upstream that answers in one JSON
// document is read up to MaxHTTPReply, whatever code asks it for; the
// call fails and the next works.
func TestHTTPReplyBounded(t *testing.T) {
	srv := mcp.NewServer(&mcp.Implementation{Name: "big", Version: "1"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "blob"}, func(ctx context.Context, req *mcp.CallToolRequest, in struct {
		N int `json:"n"`
	}) (*mcp.CallToolResult, struct{}, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.Repeat("x", in.N)}}}, struct{}{}, nil
	})
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{JSONResponse: true}))
	t.Cleanup(hs.Close)
	m := start(t, map[string]any{"big": map[string]any{"url": hs.URL}}, Options{})
	ctx := context.Background()
	if _, err := m.Call(ctx, "big.blob", json.RawMessage(fmt.Sprintf(`{"n": %d}`, MaxHTTPReply+1000))); err == nil || !strings.Contains(err.Error(), "this server reads") {
		t.Errorf("a reply over the bound: %v", err)
	}
	// The SDK drops the connection with the reply it could not read; the
	// server is connected again.
	waitFor(t, "a call to work again", func() bool {
		res, err := m.Call(ctx, "big.blob", json.RawMessage(`{"n": 1000}`))
		return err == nil && len(text(res)) == 1000
	})
	// Arguments the schema does not name are refused before anything is
	// sent.
	if err := m.Validate("big.blob", json.RawMessage(`{"n": 1, "extra": 2}`)); err == nil || !strings.Contains(err.Error(), `takes no argument "extra"`) {
		t.Errorf("undeclared argument: %v", err)
	}
}
