package main

import (
	"context"
	"encoding/json"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/testutil"
)

// consoleClient is an operator's browser, as far as HTTP goes: cookies,
// and the Origin a browser sends.
type consoleClient struct {
	t    *testing.T
	base string
	hc   *http.Client
}

func newConsoleClient(t *testing.T, base string) *consoleClient {
	jar, _ := cookiejar.New(nil)
	return &consoleClient{t: t, base: base, hc: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (c *consoleClient) get(path string) (int, string) {
	c.t.Helper()
	resp, err := c.hc.Get(c.base + path)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// post sends a form; origin "" sends none.
func (c *consoleClient) post(path, origin string, form url.Values) (int, string, string) {
	c.t.Helper()
	req, _ := http.NewRequest("POST", c.base+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Location"), string(body)
}

var (
	csrfField   = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)
	noticeField = regexp.MustCompile(`(?s)<p class="notice" role="status">(.*?)</p>`)
)

// act posts a console action from the console's origin and returns the
// notice the page it leads to shows (once).
func (c *consoleClient) act(path string, form url.Values) string {
	c.t.Helper()
	code, loc, body := c.post(path, c.base, form)
	if code != http.StatusSeeOther {
		c.t.Fatalf("%s: %d %s", path, code, body)
	}
	_, page := c.get(loc)
	m := noticeField.FindStringSubmatch(page)
	if m == nil {
		return ""
	}
	return html.UnescapeString(m[1])
}

// TestConsole drives the operator console over HTTP: sign-in with an
// operator's token only, an agent's hostile run seen live and escaped,
// CSRF and origin checks, killing the run, closing a session, the audit
// browser and the policy page; the operator's actions are in the audit
// log, which verifies.
func TestConsole(t *testing.T) {
	dir := t.TempDir()
	agents := filepath.Join(dir, "agents")
	os.WriteFile(agents, []byte("alice alice-0123456789abcdef\n"), 0o600)
	operators := filepath.Join(dir, "operators")
	os.WriteFile(operators, []byte("olga olga-0123456789abcdef00\n"), 0o600)
	auditLog := filepath.Join(dir, "audit.log")
	addr := freePort(t)
	base := "http://" + addr
	pol := filepath.Join(dir, "policy.json")
	os.WriteFile(pol, []byte(`{"version":"1","default":"allow","tools":{"run_python":{"action":"allow","limits":[{"counter":"runs","window":"hour","max":40,"scope":"grant"},{"counter":"all","window":"day","max":1000,"scope":"global"}]}}}`), 0o600)
	startServe(t, addr, base, nil, "--auth-token-file", agents, "--console", "--operator-token-file", operators, "--audit-log", auditLog, "--policy", pol)
	ctx := context.Background()

	op := newConsoleClient(t, base)
	if code, _ := op.get("/console"); code != http.StatusSeeOther {
		t.Errorf("the console without signing in: %d", code)
	}
	// An agent's token does not open the console; no Origin, no sign-in.
	if _, loc, _ := op.post("/console/login", base, url.Values{"token": {"alice-0123456789abcdef"}}); !strings.Contains(loc, "error") {
		t.Errorf("an agent's token signed in: %s", loc)
	}
	if code, _, _ := op.post("/console/login", "", url.Values{"token": {"olga-0123456789abcdef00"}}); code != http.StatusForbidden {
		t.Errorf("a sign-in without an Origin: %d", code)
	}
	if _, loc, _ := op.post("/console/login", base, url.Values{"token": {"olga-0123456789abcdef00"}}); loc != "/console" {
		t.Fatalf("the operator's sign-in: %s", loc)
	}
	// An operator's token never runs code.
	opClient := mcp.NewClient(&mcp.Implementation{Name: "op", Version: "1"}, nil)
	if _, err := opClient.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: base + "/mcp", HTTPClient: &http.Client{Transport: testutil.Bearer("olga-0123456789abcdef00", nil)}}, nil); err == nil {
		t.Error("an operator's token opened /mcp")
	}

	// An agent runs hostile code for a long time.
	agent := connectHTTP(ctx, t, base, "alice-0123456789abcdef")
	hostile := "# <script>alert('x')</script> \u202eevil\u202c \x1b[31mred\n" + "import time\ntime.sleep(120)\n"
	done := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, _ := agent.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": hostile, "timeout_seconds": 60}})
		done <- res
	}()
	var state struct {
		Running []struct {
			ID, Identity, Tool, Code string
			HasUsage                 bool  `json:"has_usage"`
			MemoryBytes              int64 `json:"memory_bytes"`
		}
	}
	deadline := time.Now().Add(time.Minute)
	// Until it is seen, with its usage once it has a sandbox that can be
	// measured (the server runs as root here: cgroups).
	for (len(state.Running) == 0 || (os.Geteuid() == 0 && !state.Running[0].HasUsage)) && time.Now().Before(deadline) {
		_, body := op.get("/console/state")
		json.Unmarshal([]byte(body), &state)
		time.Sleep(50 * time.Millisecond)
	}
	if len(state.Running) != 1 || state.Running[0].Identity != "alice" || !strings.Contains(state.Running[0].Code, "<script>") {
		t.Fatalf("the run in flight: %+v", state)
	}
	// Shown inert: the RTL override and the ANSI escape as visible escapes.
	if c := state.Running[0].Code; strings.ContainsAny(c, "\u202e\x1b") || !strings.Contains(c, `\u202eevil`) || !strings.Contains(c, `\x1b[31m`) {
		t.Errorf("the code is not inert: %q", c)
	}
	if os.Geteuid() == 0 && state.Running[0].MemoryBytes <= 0 {
		t.Errorf("the run's memory so far: %+v", state.Running[0])
	}
	_, page := op.get("/console")
	if strings.Contains(page, "<script>alert") || !strings.Contains(page, "&lt;script&gt;alert") || strings.Contains(page, "\u202e") {
		t.Errorf("the live page does not escape the code:\n%s", page)
	}
	// A crafted link cannot put words on the page.
	if _, p := op.get("/console?notice=the+chain+verifies"); strings.Contains(p, "chain verifies") {
		t.Error("the page shows a notice from its URL")
	}
	m := csrfField.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no CSRF token on the page")
	}
	csrf := m[1]
	kill := "/console/runs/" + url.PathEscape(state.Running[0].ID) + "/kill"
	if code, _, _ := op.post(kill, base, nil); code != http.StatusForbidden {
		t.Errorf("a kill without the CSRF token: %d", code)
	}
	if code, _, _ := op.post(kill, "http://evil.example", url.Values{"csrf": {csrf}}); code != http.StatusForbidden {
		t.Errorf("a kill from another origin: %d", code)
	}
	if n := op.act(kill, url.Values{"csrf": {csrf}}); !strings.Contains(n, "stopped run_python of alice") {
		t.Errorf("the kill: %q", n)
	}
	if n := noticeField.FindString(func() string { _, p := op.get("/console"); return p }()); n != "" {
		t.Errorf("a notice shown twice: %s", n)
	}
	select {
	case res := <-done:
		if res == nil || !strings.Contains(toolText(res), "stopped by operator olga") {
			t.Errorf("the killed run's result: %+v", res)
		}
	case <-time.After(time.Minute):
		t.Fatal("the killed run did not end")
	}

	// Close a session.
	_, out := callTool(t, agent, "create_session", nil)
	sid, _ := out["session_id"].(string)
	if n := op.act("/console/sessions/"+sid+"/close", url.Values{"csrf": {csrf}}); !strings.Contains(n, "closed") {
		t.Errorf("closing a session: %q", n)
	}
	if res, _ := callTool(t, agent, "run_python", map[string]any{"session_id": sid, "code": "1"}); !res.IsError {
		t.Errorf("the closed session still runs")
	}

	// The audit browser finds the run, escaped, and its record.
	_, list := op.get("/console/audit?q=alert&tool=run_python")
	if !strings.Contains(list, "&lt;script&gt;") || strings.Contains(list, "<script>alert") || !strings.Contains(list, "1 matching records") {
		t.Errorf("the audit search:\n%s", list)
	}
	seq := regexp.MustCompile(`href="/console/audit/(\d+)"`).FindStringSubmatch(list)
	if seq == nil {
		t.Fatal("no record link")
	}
	if code, rec := op.get("/console/audit/" + seq[1]); code != 200 || !strings.Contains(rec, "stopped by operator olga") || strings.Contains(rec, "<script>alert") {
		t.Errorf("the record page: %d\n%s", code, rec)
	}
	if n := op.act("/console/audit/verify", url.Values{"csrf": {csrf}}); !strings.Contains(n, "the chain verifies") {
		t.Errorf("verify: %q", n)
	}
	if code, jsonl := op.get("/console/audit.jsonl?tool=run_python"); code != 200 || strings.Count(jsonl, "\n") < 2 {
		t.Errorf("download: %d %q", code, jsonl)
	}
	// The policy page: its digest, and the counters against the limits
	// (alice ran twice, in one hour window and one day window).
	if code, page := op.get("/console/policy"); code != 200 || !strings.Contains(page, "Policy in force") ||
		!regexp.MustCompile(`alice</span>\s*<meter min="0" max="40" value="2"`).MatchString(page) ||
		!regexp.MustCompile(`everyone</span>\s*<meter min="0" max="1000" value="2"`).MatchString(page) {
		t.Errorf("policy: %d\n%s", code, page)
	}
	// The operator's actions are on the record.
	data, _ := os.ReadFile(auditLog)
	for _, want := range []string{`"identity":"operator:olga"`, `"action":"kill"`, `"action":"close_session"`} {
		if !strings.Contains(string(data), want) {
			t.Errorf("the audit log lacks %s", want)
		}
	}
	// The agent's token does not open the console's data either.
	req, _ := http.NewRequest("GET", base+"/console/state", nil)
	req.Header.Set("Authorization", "Bearer alice-0123456789abcdef")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("the console's state with an agent's token: %d", resp.StatusCode)
		}
	}
}

// TestConsoleApproval: a policy routes run_python's approval to
// operators; a headless agent (no elicitation) waits, told so by progress
// notifications, until an operator approves in the console; a declined
// call runs nothing; the decisions are on the record.
func TestConsoleApproval(t *testing.T) {
	dir := t.TempDir()
	agents := filepath.Join(dir, "agents")
	os.WriteFile(agents, []byte("ci-bot ci-bot-0123456789abcdef\n"), 0o600)
	operators := filepath.Join(dir, "operators")
	os.WriteFile(operators, []byte("olga olga-0123456789abcdef00\n"), 0o600)
	pol := filepath.Join(dir, "policy.yaml")
	os.WriteFile(pol, []byte("version: \"1\"\ndefault: allow\ntools:\n  run_python: {action: approve, by: operator}\n"), 0o600)
	auditLog := filepath.Join(dir, "audit.log")
	addr := freePort(t)
	base := "http://" + addr
	startServe(t, addr, base, nil, "--auth-token-file", agents, "--console", "--operator-token-file", operators, "--policy", pol, "--audit-log", auditLog)
	ctx := context.Background()
	op := newConsoleClient(t, base)
	op.post("/console/login", base, url.Values{"token": {"olga-0123456789abcdef00"}})
	_, page := op.get("/console")
	csrf := csrfField.FindStringSubmatch(page)[1]

	progress := make(chan string, 16)
	client := mcp.NewClient(&mcp.Implementation{Name: "headless", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			select {
			case progress <- r.Params.Message:
			default:
			}
		}})
	agent, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: base + "/mcp", HTTPClient: &http.Client{Transport: testutil.Bearer("ci-bot-0123456789abcdef", nil)}},
		&mcp.ClientSessionOptions{ProtocolVersion: "2025-06-18"})
	if err != nil {
		t.Fatal(err)
	}
	defer agent.Close()
	for _, verdict := range []string{"approve", "decline"} {
		done := make(chan *mcp.CallToolResult, 1)
		go func() {
			params := &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "print('deploy <b>now</b>')"}}
			params.SetProgressToken("p-" + verdict)
			res, _ := agent.CallTool(ctx, params)
			done <- res
		}()
		var state struct {
			Pending []struct{ ID, Identity, Tool, Code, Facts, Digest string }
		}
		deadline := time.Now().Add(time.Minute)
		for len(state.Pending) == 0 && time.Now().Before(deadline) {
			_, body := op.get("/console/state")
			json.Unmarshal([]byte(body), &state)
			time.Sleep(50 * time.Millisecond)
		}
		if len(state.Pending) != 1 || state.Pending[0].Identity != "ci-bot" || !strings.Contains(state.Pending[0].Code, "deploy <b>now</b>") || !strings.Contains(state.Pending[0].Facts, "Limits:") {
			t.Fatalf("pending: %+v", state)
		}
		if _, page := op.get("/console"); strings.Contains(page, "<b>now</b>") {
			t.Errorf("the pending call's code is not escaped")
		}
		if verdict == "approve" {
			select {
			case m := <-progress:
				if !strings.Contains(m, "waiting for an operator") {
					t.Errorf("progress: %q", m)
				}
			case <-time.After(time.Minute):
				t.Error("no progress notification while waiting")
			}
		}
		if n := op.act("/console/approvals/"+state.Pending[0].ID+"/"+verdict, url.Values{"csrf": {csrf}, "digest": {state.Pending[0].Digest}}); !strings.Contains(n, verdict+"d run_python of ci-bot") {
			t.Errorf("%s: %q", verdict, n)
		}
		// Used once: a second answer finds nothing.
		if n := op.act("/console/approvals/"+state.Pending[0].ID+"/approve", url.Values{"csrf": {csrf}, "digest": {state.Pending[0].Digest}}); !strings.Contains(n, "no call waits") {
			t.Errorf("a second answer: %q", n)
		}
		select {
		case res := <-done:
			switch {
			case verdict == "approve" && (res == nil || res.IsError || !strings.Contains(toolText(res), "deploy")):
				t.Errorf("approved: %+v", res)
			case verdict == "decline" && (res == nil || !res.IsError || !strings.Contains(toolText(res), "Operator olga declined")):
				t.Errorf("declined: %+v", res)
			}
		case <-time.After(time.Minute):
			t.Fatal("the call did not end")
		}
	}
	data, _ := os.ReadFile(auditLog)
	for _, want := range []string{`"reason":"approved by operator olga"`, `"reason":"operator olga declined it"`, `"action":"approve"`, `"action":"decline"`} {
		if !strings.Contains(string(data), want) {
			t.Errorf("the audit log lacks %s", want)
		}
	}
}
