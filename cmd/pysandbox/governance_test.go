package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/testutil"
)

// startServe starts the real binary as `serve --http addr` with args and
// waits until baseURL/healthz answers through client (nil: the default
// client). It returns the process (to signal) and its stderr.
func startServe(t *testing.T, addr, baseURL string, client *http.Client, args ...string) (*exec.Cmd, *testutil.SyncBuffer) {
	t.Helper()
	if client == nil {
		client = http.DefaultClient
	}
	cmd := exec.Command(binary(t), append([]string{"serve", "--http", addr, "--log-level", "error"}, args...)...)
	stderr := &testutil.SyncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := client.Get(baseURL + "/healthz")
		if err == nil {
			resp.Body.Close()
			return cmd, stderr
		}
		select {
		case <-exited:
			t.Fatalf("server exited: %s", stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("server did not come up: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// connectHTTP connects an MCP client to url/mcp with a bearer token.
func connectHTTP(ctx context.Context, t *testing.T, url, token string) *mcp.ClientSession {
	t.Helper()
	client := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url + "/mcp", HTTPClient: &http.Client{Transport: testutil.Bearer(token, nil)}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// TestServeGoverned drives the real binary over HTTP with tokens, a
// policy and an audit log: 401s, identities, a denial, a rate limit, a
// foreign Host, /metrics, and an audit log that verifies until edited.
func TestServeGoverned(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	os.WriteFile(tokens, []byte("alice alice-0123456789abcdef\nbob bob-0123456789abcdef00\n"), 0o600)
	pol := filepath.Join(dir, "policy.yaml")
	os.WriteFile(pol, []byte(`version: "1"
default: deny
tools:
  run_python:
    limits: [{counter: runs, window: hour, max: 2, scope: grant}]
  validate_script: {action: deny, reason: not needed here}
packages:
  deny: ["*miner*"]
`), 0o600)
	auditLog := filepath.Join(dir, "audit.log")
	addr := freePort(t)
	startServe(t, addr, "http://"+addr, nil, "--auth-token-file", tokens, "--policy", pol, "--audit-log", auditLog)
	url := "http://" + addr

	// No token, a wrong token: 401, on /mcp and /metrics.
	for _, tc := range []struct{ path, token string }{{"/mcp", ""}, {"/mcp", "alice-0123456789abcdeX"}, {"/metrics", ""}} {
		req, _ := http.NewRequest("POST", url+tc.path, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
		if tc.path == "/metrics" {
			req.Method = "GET"
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if tc.token != "" {
			req.Header.Set("Authorization", "Bearer "+tc.token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s with token %q: %s, want 401", tc.path, tc.token, resp.Status)
		}
	}
	// A foreign Host is refused, token or not.
	req, _ := http.NewRequest("POST", url+"/mcp", strings.NewReader(`{}`))
	req.Host = "evil.example"
	req.Header.Set("Authorization", "Bearer alice-0123456789abcdef")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("foreign Host: %v %v", resp.Status, err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	alice, bob := connectHTTP(ctx, t, url, "alice-0123456789abcdef"), connectHTTP(ctx, t, url, "bob-0123456789abcdef00")
	callTool := func(cs *mcp.ClientSession, name string, args map[string]any) *mcp.CallToolResult {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return res
	}
	textOf := func(res *mcp.CallToolResult) string {
		var b strings.Builder
		for _, c := range res.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				b.WriteString(tc.Text)
			}
		}
		return b.String()
	}
	list, err := alice.ListTools(ctx, nil)
	if err != nil || len(list.Tools) != 1 || list.Tools[0].Name != "run_python" {
		t.Fatalf("tools/list under default deny: %v %+v", err, list)
	}
	for i := range 2 {
		if res := callTool(alice, "run_python", map[string]any{"code": "print('hi from alice')"}); res.IsError {
			t.Fatalf("alice run %d: %s", i, textOf(res))
		}
	}
	if res := callTool(alice, "run_python", map[string]any{"code": "1"}); !res.IsError || !strings.Contains(textOf(res), "rate limit") {
		t.Errorf("alice's third run: %s", textOf(res))
	}
	// The limit is per grant: bob has his own.
	if res := callTool(bob, "run_python", map[string]any{"code": "1"}); res.IsError {
		t.Errorf("bob's first run: %s", textOf(res))
	}
	if res := callTool(bob, "validate_script", map[string]any{"code": "1"}); !res.IsError || !strings.Contains(textOf(res), "not needed here") {
		t.Errorf("denied tool: %s", textOf(res))
	}
	if res := callTool(bob, "run_python", map[string]any{"code": "1", "dependencies": []any{"coin-miner"}}); !res.IsError || !strings.Contains(textOf(res), `packages.deny "*miner*"`) {
		t.Errorf("denied package: %s", textOf(res))
	}

	// /metrics, with a token.
	req, _ = http.NewRequest("GET", url+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer bob-0123456789abcdef00")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/metrics: %v %v", resp.Status, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`pysandbox_runs_total{status="success"} 3`, `pysandbox_rate_limited_total{counter="runs",tool="run_python"} 1`,
		`pysandbox_denials_total{rule="tool",tool="validate_script"} 1`, `pysandbox_denials_total{rule="package",tool="run_python"} 1`,
		"pysandbox_sessions_active 0", "pysandbox_queue_depth 0", `pysandbox_tool_call_duration_seconds_bucket{tool="run_python"`} {
		if !bytes.Contains(body, []byte(want)) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	// The audit log: a start record, then one record per call, with
	// identities; it verifies.
	out, stderr, code := runBin(t, "", "audit", "verify", auditLog)
	if code != 0 || !strings.Contains(out, "ok: 7 records") {
		t.Fatalf("audit verify: %d %s %s", code, out, stderr)
	}
	data, _ := os.ReadFile(auditLog)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	var recs []map[string]any
	for _, l := range lines {
		var r map[string]any
		json.Unmarshal([]byte(l), &r)
		recs = append(recs, r)
	}
	if recs[0]["event"] != "start" || !strings.Contains(lines[0], `"policy_sha256"`) {
		t.Errorf("first record %s", lines[0])
	}
	for i, want := range []struct{ identity, decision string }{{"alice", "allow"}, {"alice", "allow"}, {"alice", "rate_limited"}, {"bob", "allow"}, {"bob", "deny"}, {"bob", "deny"}} {
		r := recs[i+1]
		if r["identity"] != want.identity || r["decision"] != want.decision {
			t.Errorf("record %d: %s", i+2, lines[i+1])
		}
	}
	if !strings.Contains(lines[1], `print('hi from alice')`) || recs[1]["code_sha256"] == nil || recs[1]["status"] != "success" {
		t.Errorf("run record: %s", lines[1])
	}
	out, _, code = runBin(t, "", "audit", "tail", "-n", "3", auditLog)
	if code != 0 || strings.Count(out, "\n") != 3 || !strings.Contains(out, "bob") {
		t.Errorf("audit tail: %d %q", code, out)
	}

	// Tampering: an edited line, then a deleted line.
	edited := filepath.Join(dir, "edited.log")
	os.WriteFile(edited, []byte(strings.Replace(string(data), "hi from alice", "hi from mallory", 1)), 0o600)
	_, stderr, code = runBin(t, "", "audit", "verify", edited)
	if code != 1 || !strings.Contains(stderr, "edited.log:2") {
		t.Errorf("edited line: exit %d, %s", code, stderr)
	}
	deleted := filepath.Join(dir, "deleted.log")
	os.WriteFile(deleted, []byte(strings.Join(append(append([]string{}, lines[:3]...), lines[4:]...), "\n")+"\n"), 0o600)
	_, stderr, code = runBin(t, "", "audit", "verify", deleted)
	if code != 1 || !strings.Contains(stderr, "deleted.log:4") {
		t.Errorf("deleted line: exit %d, %s", code, stderr)
	}
}

// TestServeRefusals: what must stop the server at startup.
func TestServeRefusals(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"version": "1", "tools": {"run_python": {"limits": [{"counter": "c", "window": "fortnight", "max": 1}]}}}`), 0o600)
	tokens := filepath.Join(dir, "tokens")
	os.WriteFile(tokens, []byte("alice alice-0123456789abcdef\n"), 0o600)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"serve", "--policy", bad}, 1, `tools.run_python.limits[0].window: "fortnight" is not a window`},
		{[]string{"serve", "--policy", filepath.Join(dir, "missing.json")}, 1, "no such file"},
		{[]string{"serve", "--http", "0.0.0.0:0"}, 2, "--auth-token-file"},
		{[]string{"serve", "--auth-token-file", tokens}, 2, "apply to --http only"},
		{[]string{"serve", "--http", "127.0.0.1:0", "--auth-token-file", filepath.Join(dir, "nope")}, 1, "auth token file"},
	} {
		_, stderr, code := runBin(t, "", tc.args...)
		if code != tc.code || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, %s; want %d and %q", tc.args, code, stderr, tc.code, tc.want)
		}
	}
}

// TestServePolicyReload: SIGHUP replaces the policy (tool list and
// refusals follow, clients are told the list changed, the audit log
// records it); a broken file changes nothing.
func TestServePolicyReload(t *testing.T) {
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.json")
	write := func(s string) {
		if err := os.WriteFile(pol, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"version": "1", "default": "allow", "tools": {"validate_script": {"action": "deny", "reason": "first policy"}}}`)
	auditLog := filepath.Join(dir, "audit.log")
	addr := freePort(t)
	cmd, stderr := startServe(t, addr, "http://"+addr, nil, "--policy", pol, "--audit-log", auditLog)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	changed := make(chan struct{}, 4)
	client := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} },
	})
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + addr + "/mcp"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	names := func() []string {
		list, err := cs.ListTools(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, tl := range list.Tools {
			out = append(out, tl.Name)
		}
		return out
	}
	callText := func(name string) (bool, string) {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: map[string]any{"code": "1"}})
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for _, c := range res.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				b.WriteString(tc.Text)
			}
		}
		return res.IsError, b.String()
	}
	if slices.Contains(names(), "validate_script") {
		t.Fatal("validate_script offered under the first policy")
	}

	write(`{"version": "1", "default": "allow", "tools": {"run_python": {"action": "deny", "reason": "second policy"}}}`)
	cmd.Process.Signal(syscall.SIGHUP)
	select {
	case <-changed:
	case <-time.After(20 * time.Second):
		t.Fatalf("no tools/list_changed after SIGHUP\n%s", stderr.String())
	}
	// tools/list_changed says the list changed, not that it is final: a
	// reload changes it tool by tool. Re-listed until it settles.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		n := names()
		if slices.Contains(n, "validate_script") && !slices.Contains(n, "run_python") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tools after the reload: %v", n)
		}
	}
	if isErr, msg := callText("run_python"); !isErr || !strings.Contains(msg, "second policy") {
		t.Errorf("run_python under the second policy: %v %s", isErr, msg)
	}
	if isErr, msg := callText("validate_script"); isErr {
		t.Errorf("validate_script under the second policy: %s", msg)
	}

	// A broken file: refused, logged, nothing changes.
	write(`{"version": "1", "tools": {"run_python": {"action": "alow"}}}`)
	cmd.Process.Signal(syscall.SIGHUP)
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(stderr.String(), "policy reload refused"); {
		if time.Now().After(deadline) {
			t.Fatalf("no refusal logged:\n%s", stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.Contains(stderr.String(), `tools.run_python.action: \"alow\" is not an action`) {
		t.Errorf("the refusal does not name the field:\n%s", stderr.String())
	}
	if isErr, msg := callText("run_python"); !isErr || !strings.Contains(msg, "second policy") {
		t.Errorf("after a broken reload: %v %s", isErr, msg)
	}
	out, _, code := runBin(t, "", "audit", "verify", auditLog)
	data, _ := os.ReadFile(auditLog)
	if code != 0 || strings.Count(string(data), `"event":"policy"`) != 1 {
		t.Errorf("audit log: %s\n%s", out, data)
	}
}

// TestServeTLS: --tls-cert/--tls-key serve HTTPS, with bearer tokens on
// top; plain HTTP to the same port does not reach MCP.
func TestServeTLS(t *testing.T) {
	dir := t.TempDir()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "pysandbox test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)
	tokens := filepath.Join(dir, "tokens")
	os.WriteFile(tokens, []byte("alice alice-0123456789abcdef\n"), 0o600)
	addr := freePort(t)
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	startServe(t, addr, "https://"+addr, &http.Client{Transport: tr}, "--tls-cert", certFile, "--tls-key", keyFile, "--auth-token-file", tokens)
	if resp, err := http.Get("http://" + addr + "/healthz"); err == nil && resp.StatusCode == 200 {
		t.Error("plain HTTP reached the server")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mc := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	cs, err := mc.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "https://" + addr + "/mcp",
		HTTPClient: &http.Client{Transport: testutil.Bearer("alice-0123456789abcdef", tr)}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "6*7"}})
	if err != nil || res.IsError || res.StructuredContent.(map[string]any)["return_value"] != float64(42) {
		t.Fatalf("run over HTTPS: %v %+v", err, res)
	}
}

// TestRulesThatNeverMatchAreFlagged: a rule that parses but can never
// take effect is logged when the server starts (policy file and
// --allow-net alike), and the server still starts.
func TestRulesThatNeverMatchAreFlagged(t *testing.T) {
	_, stderr, code := runBin(t, "print('ran')", "run", "--allow-net", "*", "--allow-net", "api.example.com=127.0.0.1", "-")
	if code != 0 || !strings.Contains(stderr, "network rule that never takes effect") || !strings.Contains(stderr, "its pin to 127.0.0.1 is never used") {
		t.Errorf("--allow-net: exit %d, %s", code, stderr)
	}
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	os.WriteFile(pol, []byte("version: \"1\"\ndefault: allow\nnetwork:\n  allow: [\"*\", \"pypi.example=127.0.0.1\"]\n"), 0o600)
	addr := freePort(t)
	_, log := startServe(t, addr, "http://"+addr, nil, "--policy", pol, "--log-level", "warn")
	if !strings.Contains(log.String(), "policy rule that never takes effect") || !strings.Contains(log.String(), "network.allow[1]") {
		t.Errorf("the server's log: %s", log.String())
	}
}
