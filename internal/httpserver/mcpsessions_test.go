package httpserver

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/testutil"
)

// startCapped serves testServer with the given MCP-session limits.
func startCapped(t *testing.T, tokens *Tokens, lim SessionLimits) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h, err := Handler(Config{Server: testServer(), Tokens: tokens, Listen: ln.Addr(), Sessions: lim})
	if err != nil {
		t.Fatal(err)
	}
	hs := &httptest.Server{Listener: ln, Config: &http.Server{Handler: h}}
	hs.Start()
	t.Cleanup(hs.Close)
	return hs.URL
}

// open sends an initialize: a new MCP session.
func open(t *testing.T, ctx context.Context, url, token string) (int, string, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Mcp-Session-Id"), string(body)
}

func end(t *testing.T, url, token, id string) {
	t.Helper()
	req, _ := http.NewRequest("DELETE", url+"/mcp", nil)
	req.Header.Set("Mcp-Session-Id", id)
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
}

// TestSessionCapsPerCaller: each token has its own cap, a DELETE frees a
// place at once, and the refusal is HTTP 429 saying which cap and what to
// do.
func TestSessionCapsPerCaller(t *testing.T) {
	tokens, err := ParseTokens([]byte("alice "+aliceToken+"\nbob bob-0123456789abcdef00\n"), "tokens")
	if err != nil {
		t.Fatal(err)
	}
	url := startCapped(t, tokens, SessionLimits{PerCaller: 2, Total: 3})
	ctx := context.Background()
	var ids []string
	for i := 0; i < 2; i++ {
		code, id, body := open(t, ctx, url, aliceToken)
		if code != http.StatusOK || id == "" {
			t.Fatalf("alice's session %d: %d %s", i, code, body)
		}
		ids = append(ids, id)
	}
	code, id, body := open(t, ctx, url, aliceToken)
	if !refused(code, id, body) || !strings.Contains(body, "alice has 2 open") || !strings.Contains(body, "--max-mcp-sessions-per-caller") || !strings.Contains(body, `"jsonrpc":"2.0"`) {
		t.Errorf("alice's third: %d %s", code, body)
	}
	// Bob has his own cap; then the server's is reached.
	if code, id, body := open(t, ctx, url, "bob-0123456789abcdef00"); code != http.StatusOK || id == "" {
		t.Errorf("bob's first: %d %s", code, body)
	}
	if code, id, body := open(t, ctx, url, "bob-0123456789abcdef00"); !refused(code, id, body) || !strings.Contains(body, "this server has 3 open") {
		t.Errorf("past the server's cap: %d %s", code, body)
	}
	end(t, url, aliceToken, ids[0])
	if code, id, body := open(t, ctx, url, aliceToken); code != http.StatusOK || id == "" {
		t.Errorf("after a DELETE: %d %s", code, body)
	}
	// A sessionless request (2026-07-28) holds as much as a session: at
	// her cap, alice is refused those too, with the reason; once she ends
	// a session, they pass.
	if _, err := whoami(t, url, aliceToken); err == nil || !strings.Contains(err.Error(), "alice has 2 open") {
		t.Errorf("a sessionless call at the cap: %v", err)
	}
	end(t, url, aliceToken, ids[1])
	if who, err := whoami(t, url, aliceToken); err != nil || who != "alice" {
		t.Errorf("a sessionless call below the cap: %q %v", who, err)
	}
}

// TestSessionCapsAnonymousAndIdle: callers without a token share one cap;
// an idle session ends by itself; aborted initialize requests leave no
// reservation behind.
func TestSessionCapsAnonymousAndIdle(t *testing.T) {
	url := startCapped(t, nil, SessionLimits{PerCaller: 4, Total: 100})
	// Requests abandoned mid-way (the body cut short), many at once:
	// none may keep a place.
	host := strings.TrimPrefix(url, "http://")
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", host)
			if err != nil {
				t.Error(err)
				return
			}
			io.WriteString(c, "POST /mcp HTTP/1.1\r\nHost: "+host+"\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: 1000\r\n\r\n{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\"")
			time.Sleep(50 * time.Millisecond)
			c.Close()
		}()
	}
	wg.Wait()
	// The server notices the cut requests soon, not at once: a leaked
	// reservation would refuse these for ever (a hang guard only).
	deadline := time.Now().Add(time.Minute)
	for i := 0; i < 4; {
		code, id, body := open(t, context.Background(), url, "")
		switch {
		case code == http.StatusOK && id != "":
			i++
		case time.Now().After(deadline):
			t.Fatalf("session %d: %d %s", i, code, body)
		default:
			time.Sleep(50 * time.Millisecond)
		}
	}
	code, id, body := open(t, context.Background(), url, "")
	if !refused(code, id, body) || !strings.Contains(body, "callers without a token") {
		t.Errorf("past the shared cap: %d %s", code, body)
	}
	// Idle sessions end by themselves: fill a cap, then wait for a place
	// (the deadlines are hang guards only).
	url = startCapped(t, nil, SessionLimits{PerCaller: 2, Total: 100, Idle: 2 * time.Second})
	deadline = time.Now().Add(time.Minute)
	for {
		code, id, body := open(t, context.Background(), url, "")
		if refused(code, id, body) {
			break
		}
		if code != http.StatusOK || time.Now().After(deadline) {
			t.Fatalf("filling the cap: %d %s", code, body)
		}
	}
	for {
		code, id, body := open(t, context.Background(), url, "")
		if code == http.StatusOK && id != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("idle sessions never ended: %d %s", code, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestSessionKeptByEventStream: an MCP session whose client holds its
// event stream open is not idle, however long it calls nothing; once the
// stream closes it ends after the timeout, and a request on it then gets
// a JSON-RPC error saying what happened and what to do.
func TestSessionKeptByEventStream(t *testing.T) {
	url := startCapped(t, nil, SessionLimits{Idle: 500 * time.Millisecond})
	code, id, body := open(t, context.Background(), url, "")
	if code != http.StatusOK {
		t.Fatalf("initialize: %d %s", code, body)
	}
	post := func(msg string) (int, string) {
		req, _ := http.NewRequest("POST", url+"/mcp", strings.NewReader(msg))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Session-Id", id)
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := post(`{"jsonrpc":"2.0","method":"notifications/initialized"}`); code >= 300 {
		t.Fatalf("initialized: %d %s", code, body)
	}
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", url+"/mcp", nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", id)
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("event stream: %v %v", resp, err)
	}
	// Six timeouts with the stream open: still there.
	time.Sleep(3 * time.Second)
	if code, body := post(`{"jsonrpc":"2.0","id":2,"method":"ping"}`); code != http.StatusOK {
		t.Fatalf("a session with its event stream open ended: %d %s", code, body)
	}
	cancel()
	resp.Body.Close()
	// Each request is activity: ask only every four timeouts.
	deadline := time.Now().Add(time.Minute)
	for {
		time.Sleep(2 * time.Second)
		code, body := post(`{"jsonrpc":"2.0","id":3,"method":"ping"}`)
		if code == http.StatusNotFound {
			if !strings.Contains(body, `"jsonrpc":"2.0"`) || !strings.Contains(body, "this MCP session has ended") || !strings.Contains(body, "initialize a new one") {
				t.Errorf("the answer for an ended session: %s", body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("an idle session without a stream never ended: %d %s", code, body)
		}
	}
}

// TestSessionlessRequestsBounded: requests of the sessionless protocol
// in flight are bounded per caller as sessions are; others still pass.
func TestSessionlessRequestsBounded(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 16)
	srv := testServer()
	mcp.AddTool(srv, &mcp.Tool{Name: "wait"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		select {
		case entered <- struct{}{}:
		default:
		}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil, nil
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tokens, _ := ParseTokens([]byte("alice "+aliceToken+"\nbob bob-0123456789abcdef00\n"), "tokens")
	h, err := Handler(Config{Server: srv, Tokens: tokens, Listen: ln.Addr(), Sessions: SessionLimits{PerCaller: 2, Total: 10}})
	if err != nil {
		t.Fatal(err)
	}
	hs := &httptest.Server{Listener: ln, Config: &http.Server{Handler: h}}
	hs.Start()
	t.Cleanup(hs.Close)
	connect := func(token string) *mcp.ClientSession {
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "c", Version: "1"}, nil).Connect(context.Background(),
			&mcp.StreamableClientTransport{Endpoint: hs.URL + "/mcp", HTTPClient: &http.Client{Transport: testutil.Bearer(token, nil)}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cs.Close() })
		return cs
	}
	alice := connect(aliceToken)
	if v := alice.InitializeResult().ProtocolVersion; v != "2026-07-28" {
		t.Fatalf("protocol %s", v)
	}
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A request's slot is freed after its answer is written, so
			// the client can send the next one first: a call refused
			// for that moment's overlap is sent again.
			for {
				_, err := alice.CallTool(context.Background(), &mcp.CallToolParams{Name: "wait"})
				if err == nil || !strings.Contains(err.Error(), "too many requests in flight") {
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	defer func() { close(release); wg.Wait() }()
	// Both are in flight before a third is tried: otherwise a third could
	// take one's place, and the count would drop when it gave up.
	for range 2 {
		select {
		case <-entered:
		case <-time.After(time.Minute): // a hang guard only
			t.Fatal("the two waits never reached the server")
		}
	}
	// Once both wait, a third is refused (a hang guard only).
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		// Another wait: refused at once, or held until the context ends
		// (whoami would do, but the client may answer a repeated call
		// from its cache without asking the server).
		_, err := alice.CallTool(ctx, &mcp.CallToolParams{Name: "wait"})
		cancel()
		if err != nil && strings.Contains(err.Error(), "too many requests in flight: alice has 2 MCP sessions and sessionless requests open") && strings.Contains(err.Error(), "--max-mcp-sessions-per-caller") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a third request in flight: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if who, err := whoami(t, hs.URL, "bob-0123456789abcdef00"); err != nil || who != "bob" {
		t.Errorf("bob while alice is at her cap: %q %v", who, err)
	}
	// Her requests in flight count against her MCP sessions too.
	if code, id, body := open(t, context.Background(), hs.URL, aliceToken); !refused(code, id, body) || !strings.Contains(body, "alice has 2 open (sessionless requests in flight included)") {
		t.Errorf("an MCP session beside two requests in flight: %d %s", code, body)
	}
}

// TestUnauthenticatedConnectionsClose: a request without a valid token
// gets its 401 and the connection closes, so it cannot be held open.
func TestUnauthenticatedConnectionsClose(t *testing.T) {
	tokens, _ := ParseTokens([]byte("alice "+aliceToken+"\n"), "tokens")
	url := startCapped(t, tokens, SessionLimits{})
	resp, err := http.Get(url + "/mcp")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !resp.Close {
		t.Errorf("%s, connection kept: %v", resp.Status, !resp.Close)
	}
}

// refused reports whether an initialize was refused: the JSON-RPC error
// answering it, and no session.
func refused(code int, id, body string) bool {
	return code == http.StatusOK && id == "" && strings.Contains(body, `"error"`) && strings.Contains(body, `"id":1`)
}
