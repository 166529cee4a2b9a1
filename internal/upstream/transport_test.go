package upstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/testutil"
	"github.com/pysandbox/pysandbox/internal/testutil/refservers"
)

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
