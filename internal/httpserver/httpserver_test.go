package httpserver

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/testutil"
)

// whoami is a tool that reports the caller's identity as the server saw it.
func testServer() *mcp.Server {
	srv := mcp.NewServer(&mcp.Implementation{Name: "t", Version: "1"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "whoami"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		who := "anonymous"
		if ti := req.Extra.TokenInfo; ti != nil {
			who = ti.UserID
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: who}}}, nil, nil
	})
	// block holds its call until the call's context ends, then says so on
	// blockEnded.
	mcp.AddTool(srv, &mcp.Tool{Name: "block"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		blockStarted <- struct{}{}
		select {
		case <-ctx.Done():
			blockEnded <- struct{}{}
		case <-blockRelease:
		}
		return nil, nil, ctx.Err()
	})
	return srv
}

var (
	blockStarted, blockEnded = make(chan struct{}, 8), make(chan struct{}, 8)
	// blockRelease ends a block call that its cancel did not: the test
	// fails rather than hang in the server's Close.
	blockRelease = make(chan struct{})
)

// TestCancelEndsTheCall: a client that cancels a call ends the handler's
// work on both protocols: on the sessionful one by its
// notifications/cancelled, on the sessionless one by ending its request
// (the SDK leaves that to an option, without which a cancelled run went
// on to its timeout).
func TestCancelEndsTheCall(t *testing.T) {
	url := start(t, nil)
	for _, proto := range []string{"", "2025-06-18"} {
		client := mcp.NewClient(&mcp.Implementation{Name: "c", Version: "1"}, nil)
		cs, err := client.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url + "/mcp"}, &mcp.ClientSessionOptions{ProtocolVersion: proto})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		go cs.CallTool(ctx, &mcp.CallToolParams{Name: "block"})
		<-blockStarted
		cancel()
		select {
		case <-blockEnded:
		case <-time.After(time.Minute):
			close(blockRelease)
			t.Fatalf("protocol %q: the call went on a minute after the client cancelled it", proto)
		}
		cs.Close()
	}
}

const aliceToken = "alice-0123456789abcdef"

func start(t *testing.T, tokens *Tokens, allowed ...string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h, err := Handler(Config{Server: testServer(), Tokens: tokens, Listen: ln.Addr(), AllowedHosts: allowed,
		Metrics: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "pysandbox_up 1\n") }),
		Health:  map[string]string{"backend": "native"}})
	if err != nil {
		t.Fatal(err)
	}
	hs := &httptest.Server{Listener: ln, Config: &http.Server{Handler: h}}
	hs.Start()
	t.Cleanup(hs.Close)
	return hs.URL
}

func whoami(t *testing.T, url, token string) (string, error) {
	t.Helper()
	client := mcp.NewClient(&mcp.Implementation{Name: "c", Version: "1"}, nil)
	tr := &mcp.StreamableClientTransport{Endpoint: url + "/mcp", HTTPClient: &http.Client{Transport: testutil.Bearer(token, nil)}}
	cs, err := client.Connect(context.Background(), tr, nil)
	if err != nil {
		return "", err
	}
	defer cs.Close()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "whoami"})
	if err != nil {
		return "", err
	}
	return res.Content[0].(*mcp.TextContent).Text, nil
}

func post(t *testing.T, url string, header map[string]string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range header {
		if k == "Host" {
			req.Host = v
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

func TestBearerAuth(t *testing.T) {
	tokens, err := ParseTokens([]byte("# team tokens\nalice "+aliceToken+"\nbob:bob-0123456789abcdef0\n"), "tokens")
	if err != nil {
		t.Fatal(err)
	}
	url := start(t, tokens)
	for _, tc := range []struct {
		name   string
		header map[string]string
	}{
		{"no token", nil},
		{"wrong token", map[string]string{"Authorization": "Bearer alice-0123456789abcdeX"}},
		{"not bearer", map[string]string{"Authorization": "Basic " + aliceToken}},
	} {
		resp := post(t, url+"/mcp", tc.header)
		if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("%s: %d %q", tc.name, resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
		}
	}
	if _, err := whoami(t, url, "wrong-token-0123456789"); err == nil {
		t.Error("an MCP client with a wrong token connected")
	}
	for token, want := range map[string]string{aliceToken: "alice", "bob-0123456789abcdef0": "bob"} {
		got, err := whoami(t, url, token)
		if err != nil || got != want {
			t.Errorf("identity %q, %v; want %q", got, err, want)
		}
	}
	// /metrics needs the token too; /healthz does not.
	resp, err := http.Get(url + "/metrics")
	if err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("/metrics without a token: %v %v", resp.StatusCode, err)
	}
	req, _ := http.NewRequest("GET", url+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+aliceToken)
	resp, err = http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/metrics with a token: %v %v", resp.StatusCode, err)
	}
	resp, err = http.Get(url + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/healthz: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), `"status":"ok"`) || !strings.Contains(string(body), `"backend":"native"`) {
		t.Errorf("/healthz says %s", body)
	}
}

func TestNoAuthIdentity(t *testing.T) {
	url := start(t, nil)
	if got, err := whoami(t, url, ""); err != nil || got != "anonymous" {
		t.Errorf("%q %v", got, err)
	}
}

func TestHostAndOrigin(t *testing.T) {
	url := start(t, nil, "sandbox.example.com")
	port := url[strings.LastIndex(url, ":")+1:]
	for _, tc := range []struct {
		header map[string]string
		want   int
	}{
		{map[string]string{"Host": "evil.example:" + port}, http.StatusForbidden},
		{map[string]string{"Host": "127.0.0.1.evil.example"}, http.StatusForbidden},
		{map[string]string{"Origin": "http://evil.example"}, http.StatusForbidden},
		{map[string]string{"Origin": "null"}, http.StatusForbidden},
		{map[string]string{"Host": "localhost:" + port, "Origin": "http://localhost:" + port}, http.StatusOK},
		{map[string]string{"Host": "[::1]:" + port}, http.StatusOK},
		{map[string]string{"Host": "Sandbox.Example.COM", "Origin": "https://sandbox.example.com"}, http.StatusOK},
	} {
		if resp := post(t, url+"/mcp", tc.header); resp.StatusCode != tc.want {
			t.Errorf("%v: %d, want %d", tc.header, resp.StatusCode, tc.want)
		}
	}
	req, _ := http.NewRequest("GET", url+"/healthz", nil)
	req.Host = "evil.example"
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("/healthz with a foreign Host: %v", resp.StatusCode)
	}
}

func TestParseTokensErrors(t *testing.T) {
	for _, tc := range []struct{ data, want string }{
		{"", "no tokens"},
		{"# only a comment\n", "no tokens"},
		{"alice short", "at least 16"},
		{"alice", "want NAME TOKEN"},
		{"alice a b c", "want NAME TOKEN"},
		{"al ice x:" + aliceToken, "want NAME TOKEN"},
		{"-alice " + aliceToken, "name \"-alice\""},
		{"alice " + aliceToken + "\nalice other-0123456789abcdef", `name "alice" appears twice`},
		{"stdio " + aliceToken, `the name "stdio" is reserved`},
		{"alice " + aliceToken + "\nbob " + aliceToken, "also another name's token"},
		{"alice tok\x01en0123456789abcdef", "printable"},
	} {
		_, err := ParseTokens([]byte(tc.data), "f")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.data, err, tc.want)
		}
	}
}

func TestLoadTokensModes(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "tokens")
	os.WriteFile(p, []byte("alice "+aliceToken+"\n"), 0o600)
	tok, err := LoadTokens(p)
	if err != nil || tok.Warning != "" || strings.Join(tok.Names(), ",") != "alice" {
		t.Fatalf("%v %+v", err, tok)
	}
	os.Chmod(p, 0o644)
	if tok, err := LoadTokens(p); err != nil || !strings.Contains(tok.Warning, "readable by every user") {
		t.Errorf("world-readable: %v %+v", err, tok)
	}
	os.Chmod(p, 0o666)
	if _, err := LoadTokens(p); err == nil || !strings.Contains(err.Error(), "writable by other users") {
		t.Errorf("world-writable: %v", err)
	}
	if _, err := LoadTokens(dir); err == nil {
		t.Error("a directory was accepted")
	}
}
