package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/testutil"
	"github.com/pysandbox/pysandbox/internal/testutil/refservers"
)

// Tenancy over HTTP (docs/governance.md: "Who a caller is"), through real clients on
// the wire: the Go SDK's on 2026-07-28 (sessionless) and the TypeScript
// SDK's on 2025-06-18 (an MCP session per connection).

// goClient connects the Go SDK's client; protocol "" is its default
// (2026-07-28, sessionless); token "" sends none.
func goClient(t *testing.T, url, token, protocol string) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tr := &mcp.StreamableClientTransport{Endpoint: url + "/mcp"}
	if token != "" {
		tr.HTTPClient = &http.Client{Transport: testutil.Bearer(token, nil)}
	}
	var opts *mcp.ClientSessionOptions
	if protocol != "" {
		opts = &mcp.ClientSessionOptions{ProtocolVersion: protocol}
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "go-test-client", Version: "1"}, nil).Connect(ctx, tr, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// tryCall calls a tool, returning its result (nil on a protocol error)
// and structured content.
func tryCall(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) (*mcp.CallToolResult, map[string]any, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		return nil, nil, err.Error()
	}
	out, _ := res.StructuredContent.(map[string]any)
	var text strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			text.WriteString(tc.Text)
		}
	}
	return res, out, text.String()
}

// tsStep is one line testdata/tsclient.mjs printed.
type tsStep struct {
	IsError    bool           `json:"isError"`
	Structured map[string]any `json:"structured"`
	Text       string         `json:"text"`
	Contents   []any          `json:"contents"`
	Error      string         `json:"error"`
	MCPSession string         `json:"mcpSession"`
	Protocol   string         `json:"protocol"`
	Size       int            `json:"size"` // the result as JSON, as the client has it
}

// tsClient runs the TypeScript SDK's client through steps (see
// testdata/tsclient.mjs) on a connection of its own, on 2025-06-18; the
// last element is its MCP session and protocol.
func tsClient(t *testing.T, url, token string, steps ...map[string]any) []tsStep {
	t.Helper()
	data, _ := json.Marshal(steps)
	script, _ := filepath.Abs("testdata/tsclient.mjs")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, refservers.Node(t), script, refservers.TypeScriptSDK(t), url+"/mcp", string(data))
	cmd.Env = append(os.Environ(), "TOKEN="+token)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the TypeScript client: %v\n%s\n%s", err, out, stderr.String())
	}
	var got []tsStep
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var s tsStep
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			t.Fatalf("the TypeScript client printed %q: %v", sc.Text(), err)
		}
		got = append(got, s)
	}
	if len(got) != len(steps)+1 || got[len(got)-1].Protocol != "2025-06-18" {
		t.Fatalf("the TypeScript client: %d lines for %d steps: %s", len(got), len(steps), out)
	}
	return got
}

func tool(name string, args map[string]any) map[string]any {
	return map[string]any{"tool": name, "args": args}
}

// otherID is a well-formed session id that is not id: what an attacker
// who learnt how ids look could try.
func otherID(id string) string {
	last := id[len(id)-1]
	swap := byte('0')
	if last == '0' {
		swap = '1'
	}
	return id[:len(id)-1] + string(swap)
}

// TestTenancyWithoutTokens: on a server without tokens, every caller is
// "http:anonymous", so a session is owned by its id, which nobody else is
// shown: a second caller cannot list or reach it, its maker reaches it
// from any new connection and either protocol, a session whose connection
// ended stops counting against the shared quota (and is the first to go
// when the server is full), and the quota's refusal says how to get out.
func TestTenancyWithoutTokens(t *testing.T) {
	addr := freePort(t)
	url := "http://" + addr
	startServe(t, addr, url, nil, "--max-sessions", "3", "--max-sessions-per-caller", "2", "--pool-size", "0")

	// Alice on 2026-07-28: no MCP session at all.
	alice := goClient(t, url, "", "")
	if v := alice.InitializeResult().ProtocolVersion; v != "2026-07-28" {
		t.Fatalf("the Go client negotiated %s", v)
	}
	res, out, txt := tryCall(t, alice, "create_session", nil)
	if res == nil || res.IsError {
		t.Fatalf("create_session: %s", txt)
	}
	a1 := out["session_id"].(string)
	if len(a1) < 2+32 {
		t.Errorf("session id %q: fewer than 128 random bits", a1)
	}
	if res, _, txt := tryCall(t, alice, "upload_file", map[string]any{"session_id": a1, "path": "key.txt", "content": "alice's API key"}); res == nil || res.IsError {
		t.Fatal(txt)
	}
	if res, _, txt := tryCall(t, alice, "run_python", map[string]any{"session_id": a1, "code": "API_KEY = open('key.txt').read()"}); res == nil || res.IsError {
		t.Fatal(txt)
	}

	// Bob, on the same protocol and then on 2025-06-18, lists nothing of
	// hers and reaches nothing with an id that is not hers.
	bob := goClient(t, url, "", "")
	_, out, txt = tryCall(t, bob, "list_sessions", nil)
	if strings.Contains(txt, a1) || len(out["sessions"].([]any)) != 0 || !strings.Contains(txt, "1 session(s) of callers without a token exist") || !strings.Contains(txt, "it came without an MCP session (the sessionless protocol") {
		t.Errorf("bob's list_sessions: %s", txt)
	}
	guess := otherID(a1)
	for _, tc := range []struct {
		tool string
		args map[string]any
	}{
		{"run_python", map[string]any{"session_id": guess, "code": "API_KEY"}},
		{"download_file", map[string]any{"session_id": guess, "path": "key.txt"}},
		{"list_files", map[string]any{"session_id": guess}},
		{"close_session", map[string]any{"session_id": guess}},
		{"run_python", map[string]any{"session_id": a1[:len(a1)-4], "code": "API_KEY"}},
	} {
		res, _, txt := tryCall(t, bob, tc.tool, tc.args)
		if res == nil || !res.IsError || !strings.Contains(txt, "Unknown session") {
			t.Errorf("bob's %s on a guessed id: %s", tc.tool, txt)
		}
	}
	if _, err := bob.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "pysandbox://sessions/" + guess + "/files/key.txt"}); err == nil {
		t.Error("bob read a file of a guessed session")
	}
	ts := tsClient(t, url, "", tool("list_sessions", nil), tool("run_python", map[string]any{"session_id": guess, "code": "API_KEY"}))
	if strings.Contains(ts[0].Text, a1) || !ts[1].IsError || !strings.Contains(ts[1].Text, "Unknown session") {
		t.Errorf("bob on 2025-06-18: %+v", ts)
	}

	// Alice "reconnects": a new client, and then the other protocol,
	// with the id she kept.
	alice2 := goClient(t, url, "", "")
	if _, out, txt := tryCall(t, alice2, "run_python", map[string]any{"session_id": a1, "code": "API_KEY"}); out["return_value"] != "alice's API key" {
		t.Errorf("alice's session from a new connection: %s", txt)
	}
	ts = tsClient(t, url, "", tool("run_python", map[string]any{"session_id": a1, "code": "API_KEY"}), map[string]any{"read": "pysandbox://sessions/" + a1 + "/files/key.txt"})
	if ts[0].Structured["return_value"] != "alice's API key" || len(ts[1].Contents) != 1 {
		t.Errorf("alice's session over 2025-06-18: %+v", ts)
	}

	// Carol on 2025-06-18 makes a session and ends her MCP session
	// (HTTP DELETE): it stops counting against the shared quota of 2
	// (alice's is the other), so her next connection may make another...
	ts = tsClient(t, url, "", tool("create_session", nil), tool("list_sessions", nil), map[string]any{"delete": true})
	c1 := ts[0].Structured["session_id"].(string)
	if !strings.Contains(ts[1].Text, c1) {
		t.Errorf("carol's own connection does not list her session: %s", ts[1].Text)
	}
	ts = tsClient(t, url, "", tool("create_session", nil), tool("create_session", nil), map[string]any{"delete": true})
	if ts[0].IsError {
		t.Fatalf("a session whose connection ended still counts: %s", ts[0].Text)
	}
	c2 := ts[0].Structured["session_id"].(string)
	// ...but not a third while two count, and the refusal says why and
	// how to get out.
	if !ts[1].IsError || ts[1].Structured["status"] != "quota" || !strings.Contains(ts[1].Text, "Close a session you no longer need with close_session") ||
		!strings.Contains(ts[1].Text, "so they share it") || !strings.Contains(ts[1].Text, "expires at") || !strings.Contains(ts[1].Text, "--auth-token-file") {
		t.Errorf("over the shared quota: %+v", ts[1])
	}
	// The server is full (alice's, c1, c2): a new session takes the place
	// of the one idle longest whose connection has ended (c1).
	ts = tsClient(t, url, "", tool("create_session", nil), tool("run_python", map[string]any{"session_id": c1, "code": "1"}),
		tool("run_python", map[string]any{"session_id": c2, "code": "'still here'"}), tool("list_sessions", nil))
	if ts[0].IsError || !strings.Contains(ts[1].Text, "closed to make room") || ts[2].Structured["return_value"] != "still here" {
		t.Errorf("a full server: %+v", ts)
	}
	// Using c2 attached it to that connection, which lists it.
	if !strings.Contains(ts[3].Text, c2) || strings.Contains(ts[3].Text, a1) {
		t.Errorf("list_sessions after reconnecting: %s", ts[3].Text)
	}
}

// TestTenancyWithTokens: with tokens, everything a caller makes is its
// token's, across connections and protocols, and nobody else's even
// with its id.
func TestTenancyWithTokens(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	os.WriteFile(tokens, []byte("alice alice-0123456789abcdef\nbob bob-0123456789abcdef00\n"), 0o600)
	addr := freePort(t)
	url := "http://" + addr
	startServe(t, addr, url, nil, "--auth-token-file", tokens, "--pool-size", "0")

	alice := goClient(t, url, "alice-0123456789abcdef", "")
	_, out, txt := tryCall(t, alice, "create_session", nil)
	id, _ := out["session_id"].(string)
	if id == "" {
		t.Fatal(txt)
	}
	tryCall(t, alice, "upload_file", map[string]any{"session_id": id, "path": "key.txt", "content": "alice's API key"})

	bob := goClient(t, url, "bob-0123456789abcdef00", "")
	for _, tc := range []struct {
		tool string
		args map[string]any
	}{
		{"run_python", map[string]any{"session_id": id, "code": "open('key.txt').read()"}},
		{"download_file", map[string]any{"session_id": id, "path": "key.txt"}},
		{"list_files", map[string]any{"session_id": id}},
		{"upload_file", map[string]any{"session_id": id, "path": "x", "content": "x"}},
		{"close_session", map[string]any{"session_id": id}},
	} {
		if res, _, txt := tryCall(t, bob, tc.tool, tc.args); res == nil || !res.IsError || !strings.Contains(txt, "Unknown session") || strings.Contains(txt, "API key") {
			t.Errorf("bob's %s on alice's session: %s", tc.tool, txt)
		}
	}
	if _, err := bob.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "pysandbox://sessions/" + id + "/files/key.txt"}); err == nil {
		t.Error("bob read alice's file as a resource")
	}
	ts := tsClient(t, url, "bob-0123456789abcdef00", tool("list_sessions", nil), tool("run_python", map[string]any{"session_id": id, "code": "1"}),
		map[string]any{"read": "pysandbox://sessions/" + id + "/files/key.txt"})
	if strings.Contains(ts[0].Text, id) || !ts[1].IsError || ts[2].Error == "" {
		t.Errorf("bob on 2025-06-18: %+v", ts)
	}
	// Alice from the other SDK and protocol: hers, listed and usable.
	ts = tsClient(t, url, "alice-0123456789abcdef", tool("list_sessions", nil), tool("run_python", map[string]any{"session_id": id, "code": "open('key.txt').read()"}))
	if !strings.Contains(ts[0].Text, id) || ts[1].Structured["return_value"] != "alice's API key" {
		t.Errorf("alice on 2025-06-18: %+v", ts)
	}
}

// initialize sends one raw initialize request (a new MCP session) and
// returns the status, the session id and the body.
func initialize(client *http.Client, url, token string) (int, string, string, error) {
	req, _ := http.NewRequest("POST", url+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"flood","version":"1"}}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, resp.Header.Get("Mcp-Session-Id"), string(body), nil
}

// rss is a process's resident memory in bytes.
func rss(t *testing.T, pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// TestMCPSessionBounds: 20 000 initialize requests from one caller leave
// the server's memory flat; past the caps initialize is refused with
// HTTP 429 and a message saying what to do; others are still served; an
// idle session ends by itself and an ended one frees its place.
func TestMCPSessionBounds(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	os.WriteFile(tokens, []byte("flood flood-0123456789abcdef\nnext next-0123456789abcdef00\n"), 0o600)
	addr := freePort(t)
	url := "http://" + addr
	// 1024 sessions are really made: the caller's cap, below the
	// server's here, so another caller still has room.
	cmd, _ := startServe(t, addr, url, nil, "--auth-token-file", tokens, "--max-mcp-sessions-per-caller", "1024", "--max-mcp-sessions", "1100", "--pool-size", "0")
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	before := rss(t, cmd.Process.Pid)
	var made, refused atomic.Int64
	var firstRefusal atomic.Value
	var wg sync.WaitGroup
	const n, workers = 20000, 8
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < n/workers; i++ {
				code, id, body, err := initialize(client, url, "flood-0123456789abcdef")
				switch {
				case err != nil:
					t.Errorf("initialize: %v", err)
					return
				case code == http.StatusOK && id != "":
					made.Add(1)
				case code == http.StatusOK && strings.Contains(body, `"error"`):
					refused.Add(1)
					firstRefusal.CompareAndSwap(nil, body)
				default:
					t.Errorf("initialize: %d %s", code, body)
					return
				}
			}
		}()
	}
	wg.Wait()
	after := rss(t, cmd.Process.Pid)
	t.Logf("%d sessions made, %d refused; RSS %d MiB before, %d MiB after", made.Load(), refused.Load(), before>>20, after>>20)
	if made.Load() != 1024 || refused.Load() != n-1024 {
		t.Errorf("%d sessions made and %d refused, want 1024 and %d", made.Load(), refused.Load(), n-1024)
	}
	if after-before > 120<<20 {
		t.Errorf("RSS grew by %d MiB", (after-before)>>20)
	}
	if body, _ := firstRefusal.Load().(string); !strings.Contains(body, "too many MCP sessions: flood has 1024 open (sessionless requests in flight included), the most one caller may have (--max-mcp-sessions-per-caller)") {
		t.Errorf("the refusal: %s", body)
	}
	// The next caller is served, on either protocol.
	next := goClient(t, url, "next-0123456789abcdef00", "")
	if res, _, txt := tryCall(t, next, "run_python", map[string]any{"code": "6*7"}); res == nil || res.IsError {
		t.Errorf("the next caller: %s", txt)
	}
	if ts := tsClient(t, url, "next-0123456789abcdef00", tool("run_python", map[string]any{"code": "6*7"})); ts[0].Structured["return_value"] != float64(42) {
		t.Errorf("the next caller on 2025-06-18: %+v", ts)
	}

	// A smaller server: a cap per caller, idle sessions ending.
	addr = freePort(t)
	url = "http://" + addr
	startServe(t, addr, url, nil, "--auth-token-file", tokens, "--max-mcp-sessions-per-caller", "3", "--mcp-session-idle", "5s", "--pool-size", "0")
	var ids []string
	for i := 0; i < 3; i++ {
		code, id, body, err := initialize(client, url, "flood-0123456789abcdef")
		if err != nil || code != http.StatusOK {
			t.Fatalf("initialize %d: %d %s %v", i, code, body, err)
		}
		ids = append(ids, id)
	}
	code, id, body, _ := initialize(client, url, "flood-0123456789abcdef")
	if code != http.StatusOK || id != "" || !strings.Contains(body, "flood has 3 open (sessionless requests in flight included), the most one caller may have (--max-mcp-sessions-per-caller)") || !strings.Contains(body, "HTTP DELETE") {
		t.Errorf("past the caller's cap: %d %s", code, body)
	}
	// Another caller is not affected; one the TypeScript SDK connects.
	if ts := tsClient(t, url, "next-0123456789abcdef00", tool("run_python", map[string]any{"code": "6*7"})); ts[0].Structured["return_value"] != float64(42) {
		t.Errorf("another caller: %+v", ts)
	}
	// Ending one (HTTP DELETE) frees its place at once.
	req, _ := http.NewRequest("DELETE", url+"/mcp", nil)
	req.Header.Set("Authorization", "Bearer flood-0123456789abcdef")
	req.Header.Set("Mcp-Session-Id", ids[0])
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	if resp, err := client.Do(req); err != nil || resp.StatusCode >= 300 {
		t.Fatalf("DELETE: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if code, id, body, _ := initialize(client, url, "flood-0123456789abcdef"); code != http.StatusOK || id == "" {
		t.Errorf("after a DELETE: %d %s", code, body)
	}
	// Idle sessions end by themselves (5 s here): the cap frees up.
	deadline := time.Now().Add(time.Minute)
	for {
		code, id, body, _ := initialize(client, url, "flood-0123456789abcdef")
		if code == http.StatusOK && id != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("idle sessions never ended: %d %s", code, body)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestLogsNameNoMCPSession: the server's log, at info, names no MCP
// session id (on a server without tokens, one is enough to use that
// connection's sessions), and holds no line per sessionless request.
func TestLogsNameNoMCPSession(t *testing.T) {
	addr := freePort(t)
	url := "http://" + addr
	_, log := startServe(t, addr, url, nil, "--log-level", "info", "--pool-size", "0")
	ts := tsClient(t, url, "", tool("run_python", map[string]any{"code": "1"}))
	id := ts[len(ts)-1].MCPSession
	cs := goClient(t, url, "", "")
	for i := 0; i < 5; i++ {
		tryCall(t, cs, "run_python", map[string]any{"code": "1"})
	}
	if id == "" || strings.Contains(log.String(), id) || strings.Contains(log.String(), "session connected") {
		t.Errorf("the log names MCP session %q:\n%s", id, log.String())
	}
}
