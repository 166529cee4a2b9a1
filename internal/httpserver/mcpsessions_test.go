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
	code, _, body := open(t, ctx, url, aliceToken)
	if code != http.StatusTooManyRequests || !strings.Contains(body, "alice has 2 open") || !strings.Contains(body, "--max-mcp-sessions-per-caller") || !strings.Contains(body, `"jsonrpc":"2.0"`) {
		t.Errorf("alice's third: %d %s", code, body)
	}
	// Bob has his own cap; then the server's is reached.
	if code, _, body := open(t, ctx, url, "bob-0123456789abcdef00"); code != http.StatusOK {
		t.Errorf("bob's first: %d %s", code, body)
	}
	if code, _, body := open(t, ctx, url, "bob-0123456789abcdef00"); code != http.StatusTooManyRequests || !strings.Contains(body, "this server has 3 open") {
		t.Errorf("past the server's cap: %d %s", code, body)
	}
	end(t, url, aliceToken, ids[0])
	if code, _, body := open(t, ctx, url, aliceToken); code != http.StatusOK {
		t.Errorf("after a DELETE: %d %s", code, body)
	}
	// Sessionless requests (2026-07-28) open no session and are not capped.
	if who, err := whoami(t, url, aliceToken); err != nil || who != "alice" {
		t.Errorf("a sessionless call past the cap: %q %v", who, err)
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
		code, _, body := open(t, context.Background(), url, "")
		switch {
		case code == http.StatusOK:
			i++
		case time.Now().After(deadline):
			t.Fatalf("session %d: %d %s", i, code, body)
		default:
			time.Sleep(50 * time.Millisecond)
		}
	}
	code, _, body := open(t, context.Background(), url, "")
	if code != http.StatusTooManyRequests || !strings.Contains(body, "callers without a token") {
		t.Errorf("past the shared cap: %d %s", code, body)
	}
	// Idle sessions end by themselves: fill a cap, then wait for a place
	// (the deadlines are hang guards only).
	url = startCapped(t, nil, SessionLimits{PerCaller: 2, Total: 100, Idle: 2 * time.Second})
	deadline = time.Now().Add(time.Minute)
	for {
		code, _, body := open(t, context.Background(), url, "")
		if code == http.StatusTooManyRequests {
			break
		}
		if code != http.StatusOK || time.Now().After(deadline) {
			t.Fatalf("filling the cap: %d %s", code, body)
		}
	}
	for {
		code, _, body := open(t, context.Background(), url, "")
		if code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("idle sessions never ended: %d %s", code, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
