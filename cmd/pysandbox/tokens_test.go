package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/testutil"
)

// TestServeTokenReload drives the real binary with agents', operators'
// and a metrics scraper's token files: the scraper's token opens /metrics
// and nothing else (an agent's no longer does); after the files are
// edited and the server gets SIGHUP, a removed agent's token gets 401,
// its MCP session included, and a removed operator's console session
// ends (page, event stream, sign-in); a broken file then changes nothing
// and is logged naming its line; the audit log records the reload.
func TestServeTokenReload(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const alice, bob, olga, oscar, prom = "alice-0123456789abcdef", "bob-0123456789abcdef00", "olga-0123456789abcdef00", "oscar-0123456789abcdef0", "prom-0123456789abcdef00"
	agents := write("agents", "alice "+alice+"\nbob "+bob+"\n")
	operators := write("operators", "olga "+olga+"\noscar "+oscar+"\n")
	metrics := write("metrics", "prometheus "+prom+"\n")
	auditLog := filepath.Join(dir, "audit.log")
	addr := freePort(t)
	base := "http://" + addr
	cmd, stderr := startServe(t, addr, base, nil, "--auth-token-file", agents, "--console", "--operator-token-file", operators,
		"--metrics-token-file", metrics, "--audit-log", auditLog)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // guards a hang only
	defer cancel()

	status := func(method, path, token string) int {
		t.Helper()
		body := io.Reader(nil)
		if method == "POST" {
			body = strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`)
		}
		req, _ := http.NewRequestWithContext(ctx, method, base+path, body)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}

	// The scraper's token: /metrics only.
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+prom)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(page), "pysandbox_sessions_active") {
		t.Errorf("/metrics with the scraper's token: %d\n%.500s", resp.StatusCode, page)
	}
	for _, tc := range []struct {
		method, path, token string
	}{{"POST", "/mcp", prom}, {"GET", "/metrics", alice}, {"GET", "/metrics", olga}, {"GET", "/metrics", ""}} {
		if code := status(tc.method, tc.path, tc.token); code != http.StatusUnauthorized {
			t.Errorf("%s %s with %q: %d, want 401", tc.method, tc.path, tc.token, code)
		}
	}
	scraper := newConsoleClient(t, base)
	if _, loc, _ := scraper.post("/console/login", base, url.Values{"token": {prom}}); !strings.Contains(loc, "error") {
		t.Errorf("the scraper's token signed in to the console: %s", loc)
	}

	// Alice connected, two operators signed in, one watching live.
	aliceSession := connectHTTP(ctx, t, base, alice)
	if _, err := aliceSession.ListTools(ctx, nil); err != nil {
		t.Fatal(err)
	}
	olgaBrowser, oscarBrowser := newConsoleClient(t, base), newConsoleClient(t, base)
	for b, token := range map[*consoleClient]string{olgaBrowser: olga, oscarBrowser: oscar} {
		if _, loc, _ := b.post("/console/login", base, url.Values{"token": {token}}); loc != "/console" {
			t.Fatalf("sign-in: %s", loc)
		}
	}
	req, _ = http.NewRequestWithContext(ctx, "GET", base+"/console/events", nil)
	resp, err = olgaBrowser.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	events := bufio.NewScanner(resp.Body)
	events.Buffer(nil, 4<<20)
	if !events.Scan() || !strings.HasPrefix(events.Text(), "event: state") {
		t.Fatalf("olga's event stream: %q %v", events.Text(), events.Err())
	}

	// Alice and olga removed; SIGHUP.
	write("agents", "bob "+bob+"\n")
	write("operators", "oscar "+oscar+"\n")
	cmd.Process.Signal(syscall.SIGHUP)
	for status("POST", "/mcp", alice) != http.StatusUnauthorized {
		if ctx.Err() != nil {
			t.Fatalf("alice's token still opens /mcp after SIGHUP\n%s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := aliceSession.ListTools(ctx, nil); err == nil {
		t.Error("alice's MCP session, opened before the reload, still answers")
	}
	bobSession := connectHTTP(ctx, t, base, bob)
	if _, err := bobSession.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "print(6*7)"}}); err != nil {
		t.Errorf("bob after the reload: %v", err)
	}
	if code, _ := olgaBrowser.get("/console"); code != http.StatusSeeOther {
		t.Errorf("a removed operator's console cookie: %d", code)
	}
	for events.Scan() {
	}
	if ctx.Err() != nil {
		t.Error("a removed operator's event stream did not end")
	}
	if _, loc, _ := olgaBrowser.post("/console/login", base, url.Values{"token": {olga}}); !strings.Contains(loc, "error") {
		t.Errorf("a removed operator signed in: %s", loc)
	}
	if code, _ := oscarBrowser.get("/console"); code != http.StatusOK {
		t.Errorf("a kept operator's console: %d", code)
	}

	// A broken file: refused, logged with its line, nothing changes.
	write("agents", "bob "+bob+"\ncarol\nalice "+alice+"\n")
	cmd.Process.Signal(syscall.SIGHUP)
	for !strings.Contains(stderr.String(), "token reload refused") {
		if ctx.Err() != nil {
			t.Fatalf("no refusal logged:\n%s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(stderr.String(), agents+":2: want NAME TOKEN") {
		t.Errorf("the refusal does not name the line:\n%s", stderr.String())
	}
	if status("POST", "/mcp", alice) != http.StatusUnauthorized || status("POST", "/mcp", bob) != http.StatusOK {
		t.Error("a refused reload changed the tokens in force")
	}
	if code, _ := oscarBrowser.get("/console"); code != http.StatusOK {
		t.Errorf("a refused reload ended a session: %d", code)
	}

	out, _, code := runBin(t, "", "audit", "verify", auditLog)
	data, _ := os.ReadFile(auditLog)
	if code != 0 || strings.Count(string(data), `"event":"tokens"`) != 1 || !strings.Contains(string(data), `"agents":"bob"`) {
		t.Errorf("audit log: %s\n%s", out, data)
	}
}

// TestServeTokenFilesRefused: a token file over 1 MiB, a malformed line,
// or a token in two files stops the server at startup, naming the line
// or both names; --metrics-token-file without --http is a usage error.
func TestServeTokenFilesRefused(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// Line 2 crosses the 1 MiB mark; the old reader cut its token to a
	// shorter one it accepted.
	big := write("big", "#"+strings.Repeat("x", 1<<20-20)+"\nbob bob-0123456789abcdef0123456789abcdef\ncarol carol-0123456789abcdef\n")
	agents := write("agents", "alice alice-0123456789abcdef\n")
	badOps := write("operators", "olga olga-0123456789abcdef00\nolga2 short\n")
	overlap := write("metrics", "prom alice-0123456789abcdef\n")
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--http", "127.0.0.1:0", "--auth-token-file", big}, 1, big + ":2: the file is larger than 1 MiB"},
		{[]string{"--http", "127.0.0.1:0", "--auth-token-file", agents, "--console", "--operator-token-file", badOps}, 1,
			"--operator-token-file: auth token file " + badOps + `:2: the token for "olga2" must be at least 16`},
		{[]string{"--http", "127.0.0.1:0", "--auth-token-file", agents, "--metrics-token-file", overlap}, 1,
			`a token is both an agent's ("alice" in ` + agents + `) and a metrics scraper's ("prom" in ` + overlap + `)`},
		{[]string{"--metrics-token-file", agents}, 2, "apply to --http only"},
	} {
		// A server that wrongly started would serve until killed: the
		// deadline guards that hang only.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		cmd := exec.CommandContext(ctx, binary(t), append([]string{"serve"}, tc.args...)...)
		errOut := &testutil.SyncBuffer{}
		cmd.Stderr = errOut
		cmd.Run()
		cancel()
		if code := cmd.ProcessState.ExitCode(); code != tc.code || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("serve %v: exit %d, want %d with %q:\n%s", tc.args, code, tc.code, tc.want, errOut.String())
		}
		if strings.Contains(errOut.String(), "0123456789abcdef") {
			t.Errorf("serve %v: a token is in the message:\n%s", tc.args, errOut.String())
		}
	}
}
