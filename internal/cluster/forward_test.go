package cluster_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/cluster"
	"github.com/pysandbox/pysandbox/internal/testutil/redisserver"
)

// TestForwarder: a call and a read forwarded to an owner's internal
// endpoint carry the caller's identity; what comes back has no trace of
// the owner's internal server (its serverInfo) and no internal address;
// an owner's own error answer (a resource not found) comes back as it
// was, and an owner that cannot be reached is ErrUnreachable.
func TestForwarder(t *testing.T) {
	const token = "0123456789abcdef0123456789abcdef-replicas"
	owner := mcp.NewServer(&mcp.Implementation{Name: "pysandbox-internal", Version: "1"}, nil)
	who := func(meta mcp.Meta) string {
		id, _ := meta[cluster.MetaIdentity].(string)
		callID, _ := meta[cluster.MetaCallID].(string)
		return id + " " + callID
	}
	owner.AddTool(&mcp.Tool{Name: "whoami", InputSchema: map[string]any{"type": "object"}}, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: who(req.Params.GetMeta())}}}, nil
	})
	owner.AddResourceTemplate(&mcp.ResourceTemplate{Name: "figure", URITemplate: "pysandbox://figures/{id}"}, func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		if strings.HasSuffix(req.Params.URI, "missing") {
			return nil, mcp.ResourceNotFoundError(req.Params.URI)
		}
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: req.Params.URI, Text: who(req.Params.GetMeta())}}}, nil
	})
	var logs syncBuffer
	a, err := cluster.Join(context.Background(), store(t, redisserver.Start(t)).Directory(), "replica-a", "http://127.0.0.1:1", "http://127.0.0.1:1", key, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Leave)
	f := a.NewForwarder(token)
	defer f.Close()
	ctx := context.Background()

	// Served statelessly, as replicas serve their internal endpoint (where
	// an invalid-params error, "not found" among them, comes with HTTP
	// 400), and with the SDK's defaults.
	for i, opts := range []*mcp.StreamableHTTPOptions{{Stateless: true}, nil} {
		mux := http.NewServeMux()
		mux.Handle(cluster.InternalPath, cluster.InternalAuth(token, mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return owner }, opts)))
		hs := httptest.NewServer(mux)
		// After the forwarder's deferred Close: a server closes only once
		// the client's event stream of a stateful session has ended.
		t.Cleanup(hs.Close)
		m := cluster.Member{Name: "replica-b", Incarnation: fmt.Sprintf("0000abc%d", i), Internal: hs.URL}

		res, err := f.Call(ctx, m, &mcp.CallToolParams{Name: "whoami", Arguments: map[string]any{}}, "alice", "call-1", 2)
		if err != nil || len(res.Content) != 1 || res.Content[0].(*mcp.TextContent).Text != "alice call-1" {
			t.Fatalf("%d: a forwarded call: %v %+v", i, err, res)
		}
		rr, err := f.ReadResource(ctx, m, "pysandbox://figures/x.png", "bob")
		if err != nil || len(rr.Contents) != 1 || rr.Contents[0].Text != "bob " {
			t.Fatalf("%d: a forwarded read: %v %+v", i, err, rr)
		}
		for _, meta := range []mcp.Meta{res.Meta, rr.Meta} {
			if meta != nil {
				t.Errorf("%d: a forwarded result keeps the internal server's _meta: %v", i, meta)
			}
		}
		_, err = f.ReadResource(ctx, m, "pysandbox://figures/missing", "bob")
		var answered *jsonrpc.Error
		if !errors.As(err, &answered) || answered.Code != jsonrpc.CodeInvalidParams || answered.Message != "Resource not found" || errors.Is(err, cluster.ErrUnreachable) {
			t.Errorf("%d: the owner's not found: %v", i, err)
		}
	}

	// An owner that does not answer: said so, without its address, which
	// is logged instead.
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	gone := cluster.Member{Name: "replica-c", Incarnation: "0000abce", Internal: dead.URL}
	for _, err := range []error{
		func() error {
			_, err := f.Call(ctx, gone, &mcp.CallToolParams{Name: "whoami"}, "alice", "call-2", 1)
			return err
		}(),
		func() error { _, err := f.ReadResource(ctx, gone, "pysandbox://figures/x.png", "alice"); return err }(),
	} {
		if !errors.Is(err, cluster.ErrUnreachable) || strings.Contains(err.Error(), strings.TrimPrefix(dead.URL, "http://")) {
			t.Errorf("an owner that does not answer: %v", err)
		}
	}
	if !bytes.Contains([]byte(logs.String()), []byte(strings.TrimPrefix(dead.URL, "http://"))) {
		t.Errorf("the failure is not logged with its cause:\n%s", logs.String())
	}
}

// TestForwarderShare: a caller's forwarded calls hold at most its share
// of the bytes in flight (a call holds them until the owner answers), so
// another caller's calls still go through.
func TestForwarderShare(t *testing.T) {
	const token = "0123456789abcdef0123456789abcdef-replicas"
	owner := mcp.NewServer(&mcp.Implementation{Name: "owner", Version: "1"}, nil)
	release, started := make(chan struct{}), make(chan struct{}, 4)
	owner.AddTool(&mcp.Tool{Name: "hold", InputSchema: map[string]any{"type": "object"}}, func(ctx context.Context, _ *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		started <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil
	})
	a, err := cluster.Join(context.Background(), store(t, redisserver.Start(t)).Directory(), "replica-a", "http://127.0.0.1:1", "http://127.0.0.1:1", key, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Leave)
	f := a.NewForwarder(token)
	mux := http.NewServeMux()
	mux.Handle(cluster.InternalPath, cluster.InternalAuth(token, mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return owner }, &mcp.StreamableHTTPOptions{Stateless: true})))
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	t.Cleanup(f.Close)
	m := cluster.Member{Name: "replica-b", Incarnation: "0000abcd", Internal: hs.URL}
	ctx := context.Background()
	held := make(chan error, 1)
	go func() {
		_, err := f.Call(ctx, m, &mcp.CallToolParams{Name: "hold", Arguments: map[string]any{}}, "alice", "c1", 30<<20)
		held <- err
	}()
	// Once alice's first call is at the owner (holding its bytes), a
	// second is refused at once.
	<-started
	if _, err := f.Call(ctx, m, &mcp.CallToolParams{Name: "hold", Arguments: map[string]any{}}, "alice", "c2", 10<<20); !errors.Is(err, cluster.ErrBusy) || !strings.Contains(err.Error(), "the most one caller may have") {
		t.Fatalf("alice's second call: %v", err)
	}
	// Bob's goes through beside it.
	done := make(chan error, 1)
	go func() {
		_, err := f.Call(ctx, m, &mcp.CallToolParams{Name: "hold", Arguments: map[string]any{}}, "bob", "c3", 30<<20)
		done <- err
	}()
	<-started
	close(release)
	for _, ch := range []chan error{held, done} {
		if err := <-ch; err != nil {
			t.Errorf("a held call: %v", err)
		}
	}
}

// TestForwarderInAServedCall: a call forwarded while this replica serves
// a client's call (its context carries that request's) reaches the owner
// as a request of the forwarder's own, in the forwarder's protocol
// version, whatever the client's (the sessionless 2026-07-28 one here).
func TestForwarderInAServedCall(t *testing.T) {
	const token = "0123456789abcdef0123456789abcdef-replicas"
	owner := mcp.NewServer(&mcp.Implementation{Name: "pysandbox-internal", Version: "1"}, nil)
	owner.AddTool(&mcp.Tool{Name: "version", InputSchema: map[string]any{"type": "object"}}, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		id, _ := req.Params.GetMeta()[cluster.MetaIdentity].(string)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: id + " " + req.Session.InitializeParams().ProtocolVersion}}}, nil
	})
	mux := http.NewServeMux()
	mux.Handle(cluster.InternalPath, cluster.InternalAuth(token, mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return owner }, &mcp.StreamableHTTPOptions{Stateless: true})))
	internal := httptest.NewServer(mux)
	t.Cleanup(internal.Close)
	a, err := cluster.Join(context.Background(), store(t, redisserver.Start(t)).Directory(), "replica-a", "http://127.0.0.1:1", "http://127.0.0.1:1", key, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Leave)
	f := a.NewForwarder(token)
	t.Cleanup(f.Close)
	m := cluster.Member{Name: "replica-b", Incarnation: "0000abcd", Internal: internal.URL}

	// This replica's public server: its tool forwards the call.
	public := mcp.NewServer(&mcp.Implementation{Name: "pysandbox", Version: "1"}, nil)
	public.AddTool(&mcp.Tool{Name: "relay", InputSchema: map[string]any{"type": "object"}}, func(ctx context.Context, _ *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return f.Call(ctx, m, &mcp.CallToolParams{Name: "version", Arguments: map[string]any{}}, "alice", "call-1", 1)
	})
	front := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return public }, &mcp.StreamableHTTPOptions{Stateless: true}))
	t.Cleanup(front.Close)
	ctx := context.Background()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: front.URL}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if v := cs.InitializeResult().ProtocolVersion; v != "2026-07-28" {
		t.Logf("the client speaks %s, not the sessionless protocol this test is about", v)
	}
	for i := range 2 {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "relay", Arguments: map[string]any{}})
		if err != nil || res.IsError || len(res.Content) != 1 {
			t.Fatalf("%d: a call forwarded while serving one: %v %+v", i, err, res)
		}
		if got := res.Content[0].(*mcp.TextContent).Text; got != "alice 2025-11-25" {
			t.Errorf("%d: the owner saw %q, want alice's call in 2025-11-25", i, got)
		}
	}
}
