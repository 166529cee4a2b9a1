package tools

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/audit"
	"github.com/pysandbox/pysandbox/internal/deps"
	"github.com/pysandbox/pysandbox/internal/egress"
	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/metrics"
	"github.com/pysandbox/pysandbox/internal/policy"
	"github.com/pysandbox/pysandbox/internal/sandbox"
	"github.com/pysandbox/pysandbox/internal/testutil"
	"github.com/pysandbox/pysandbox/internal/testutil/pypi"
)

// govServer is a server under a policy, with an audit log and metrics.
type govServer struct {
	auditPath string
	audit     *audit.Writer
	metrics   *metrics.Metrics
	connect   func(copts *mcp.ClientOptions, sopts *mcp.ClientSessionOptions) *mcp.ClientSession
}

func newGovServer(t *testing.T, policyJSON string, mod func(*engine.Config)) *govServer {
	t.Helper()
	pol, err := policy.Parse([]byte(policyJSON), "test.json", Names)
	if err != nil {
		t.Fatal(err)
	}
	g := &govServer{auditPath: filepath.Join(t.TempDir(), "audit.log")}
	g.audit, err = audit.Open(g.auditPath, audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.audit.Close() })
	g.metrics = metrics.New(metrics.Gauges{})
	g.connect = func(copts *mcp.ClientOptions, sopts *mcp.ClientSessionOptions) *mcp.ClientSession {
		return connectFull(t, func(c *engine.Config) {
			c.CheckPackage = func(name string, requested bool) error {
				if requested {
					return pol.Packages.Check(name)
				}
				return pol.Packages.CheckInstalled(name)
			}
			if mod != nil {
				mod(c)
			}
		}, func(o *Options) {
			o.Governance = Governance{Policy: pol, Audit: g.audit, Metrics: g.metrics, Limiter: frozenLimiter()}
		}, copts, sopts)
	}
	return g
}

// frozenLimiter counts rate limits in one window that never turns: the
// limits are windows aligned to the clock, so a test's calls that
// straddled the start of a minute would be counted in two windows and a
// limit would seem not to hold (CI saw it once).
func frozenLimiter() *policy.Limiter {
	now := time.Now()
	return policy.NewLimiter(func() time.Time { return now })
}

// records reads the audit log back, checking its chain first.
func (g *govServer) records(t *testing.T) []audit.Record {
	t.Helper()
	if _, err := audit.Verify([]string{g.auditPath}); err != nil {
		t.Fatalf("audit log does not verify: %v", err)
	}
	data, err := os.ReadFile(g.auditPath)
	if err != nil {
		t.Fatal(err)
	}
	var recs []audit.Record
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var r audit.Record
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("%v: %s", err, line)
		}
		recs = append(recs, r)
	}
	return recs
}

func (g *govServer) metricsText(t *testing.T) string {
	rec := httptest.NewRecorder()
	g.metrics.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	b, _ := io.ReadAll(rec.Body)
	return string(b)
}

// elicitor answers approval requests with action and keeps the messages.
type elicitor struct {
	mu       sync.Mutex
	action   string
	messages []string
}

func (e *elicitor) handler(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.messages = append(e.messages, req.Params.Message)
	return &mcp.ElicitResult{Action: e.action}, nil
}

func (e *elicitor) asked() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.messages...)
}

func TestPolicyDenyAndDefaultDeny(t *testing.T) {
	g := newGovServer(t, `{"version": "1", "default": "deny", "tools": {
		"run_python": {"action": "allow"},
		"validate_script": {"action": "deny", "reason": "not needed here"}}}`, nil)
	cs := g.connect(nil, nil)
	ctx := context.Background()
	list, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range list.Tools {
		names = append(names, tl.Name)
	}
	if len(names) != 1 || names[0] != "run_python" {
		t.Errorf("tools/list shows %v; denied tools should be hidden", names)
	}
	// A hidden tool still answers with its reason, as a tool error.
	res, _ := call(t, cs, "validate_script", map[string]any{"code": "1"})
	if !res.IsError || !strings.Contains(text(res), "not needed here") || !strings.Contains(text(res), "does not allow validate_script") {
		t.Errorf("denied tool: %v %s", res.IsError, text(res))
	}
	res, _ = call(t, cs, "check_environment", nil)
	if !res.IsError || !strings.Contains(text(res), "default: deny") {
		t.Errorf("default deny: %v %s", res.IsError, text(res))
	}
	// A tool that does not exist at all is still the protocol's business.
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "no_such_tool"}); err == nil {
		t.Error("an unknown tool should be a protocol error")
	}
	res, _ = call(t, cs, "run_python", map[string]any{"code": "print('allowed')"})
	if res.IsError {
		t.Fatal(text(res))
	}
	recs := g.records(t)
	if len(recs) != 3 {
		t.Fatalf("%d records, want 3 (two denials and a run): %+v", len(recs), recs)
	}
	if r := recs[0]; r.Tool != "validate_script" || r.Decision != "deny" || r.Reason != "not needed here" || r.Identity != "stdio" || !strings.Contains(r.Error, "not needed here") {
		t.Errorf("deny record %+v", r)
	}
	if r := recs[1]; r.Tool != "check_environment" || r.Decision != "deny" {
		t.Errorf("default deny record %+v", r)
	}
	if r := recs[2]; r.Decision != "allow" || r.Status != "success" || r.ExitCode == nil || *r.ExitCode != 0 || len(r.CodeSHA256) != 64 ||
		!strings.Contains(string(r.Arguments), "print('allowed')") || r.Prev != "" && r.Seq != 3 {
		t.Errorf("run record %+v", r)
	}
	m := g.metricsText(t)
	for _, want := range []string{`pysandbox_denials_total{rule="tool",tool="validate_script"} 1`, `pysandbox_denials_total{rule="default",tool="check_environment"} 1`,
		`pysandbox_runs_total{status="success"} 1`} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func TestPolicyRateLimit(t *testing.T) {
	g := newGovServer(t, `{"version": "1", "default": "allow", "tools": {
		"run_python": {"limits": [{"counter": "runs", "window": "hour", "max": 2, "scope": "grant"}]}}}`, nil)
	cs := g.connect(nil, nil)
	for i := range 2 {
		if res, _ := call(t, cs, "run_python", map[string]any{"code": "1"}); res.IsError {
			t.Fatalf("call %d: %s", i, text(res))
		}
	}
	res, _ := call(t, cs, "run_python", map[string]any{"code": "1"})
	msg := text(res)
	if !res.IsError || !strings.Contains(msg, `rate limit "runs": 2 per hour per identity reached`) || !strings.Contains(msg, "resets at") {
		t.Fatalf("third call: %v %s", res.IsError, msg)
	}
	// Other tools are not limited.
	if res, _ := call(t, cs, "validate_script", map[string]any{"code": "1"}); res.IsError {
		t.Error(text(res))
	}
	// check_environment tells the agent the rules.
	res, out := call(t, cs, "check_environment", nil)
	gov, _ := out["governance"].(map[string]any)
	toolsMap, _ := gov["tools"].(map[string]any)
	if want := `allow; "runs": 2 per hour per identity`; toolsMap["run_python"] != want || !strings.Contains(text(res), want) {
		t.Errorf("check_environment governance %v", gov)
	}
	recs := g.records(t)
	if r := recs[2]; r.Decision != "rate_limited" || len(r.LimitsHit) != 1 || r.LimitsHit[0] != "rate:runs/hour" || r.Status != "" {
		t.Errorf("rate-limited record %+v", r)
	}
	if !strings.Contains(g.metricsText(t), `pysandbox_rate_limited_total{counter="runs",tool="run_python"} 1`) {
		t.Error("metrics lack the rate limit")
	}
}

const approvePolicy = `{"version": "1", "default": "allow", "tools": {
	"run_python": {"action": "approve", "limits": [{"counter": "runs", "window": "day", "max": 3}]},
	"install_package": {"action": "approve"}}}`

func TestApprovalAccepted(t *testing.T) {
	for _, version := range []string{"", "2025-06-18"} {
		name := version
		if name == "" {
			name = "latest" // multi-round-trip input requests
		}
		t.Run(name, func(t *testing.T) {
			g := newGovServer(t, approvePolicy, nil)
			el := &elicitor{action: "accept"}
			cs := g.connect(&mcp.ClientOptions{ElicitationHandler: el.handler}, &mcp.ClientSessionOptions{ProtocolVersion: version})
			res, out := call(t, cs, "run_python", map[string]any{"code": "# the code to approve\nprint(6 * 7)", "timeout_seconds": 7})
			if res.IsError || out["stdout"] != "42\n" {
				t.Fatalf("approved run: %s", text(res))
			}
			asked := el.asked()
			if len(asked) != 1 {
				t.Fatalf("asked %d times", len(asked))
			}
			for _, want := range []string{"run_python", "# the code to approve\nprint(6 * 7)", "timeout 7s", "memory 256 MiB", "no network", `"runs": 3 per day`} {
				if !strings.Contains(asked[0], want) {
					t.Errorf("approval message lacks %q:\n%s", want, asked[0])
				}
			}
			recs := g.records(t)
			last := recs[len(recs)-1]
			if last.Decision != "approved" || last.Status != "success" {
				t.Errorf("final record %+v", last)
			}
			if version == "" {
				// The first pass is recorded too, as a request for approval.
				if len(recs) != 2 || recs[0].Decision != "approval_requested" || recs[0].Status != "" {
					t.Errorf("records %+v", recs)
				}
			}
		})
	}
}

func TestApprovalDeclined(t *testing.T) {
	for _, action := range []string{"decline", "cancel"} {
		t.Run(action, func(t *testing.T) {
			g := newGovServer(t, approvePolicy, nil)
			el := &elicitor{action: action}
			cs := g.connect(&mcp.ClientOptions{ElicitationHandler: el.handler}, nil)
			res, out := call(t, cs, "run_python", map[string]any{"code": "print('must not run')"})
			if !res.IsError || strings.Contains(text(res), "must not run\n") || out["status"] == "success" || !strings.Contains(text(res), "did not approve") {
				t.Fatalf("declined run: %v %s %v", res.IsError, text(res), out)
			}
			recs := g.records(t)
			if last := recs[len(recs)-1]; last.Decision != "declined" || last.Status != "" || !strings.Contains(last.Error, "did not approve") {
				t.Errorf("record %+v", last)
			}
			// A declined call counts against the limit (3 a day): the user
			// was asked. Two more may run, then the limit refuses.
			el.mu.Lock()
			el.action = "accept"
			el.mu.Unlock()
			for i := range 2 {
				if res, _ := call(t, cs, "run_python", map[string]any{"code": "1"}); res.IsError {
					t.Fatalf("accepted call %d after a decline: %s", i, text(res))
				}
			}
			if res, _ := call(t, cs, "run_python", map[string]any{"code": "1"}); !res.IsError || !strings.Contains(text(res), "rate limit") {
				t.Errorf("fourth call of the day: %s", text(res))
			}
			if n := len(el.asked()); n != 3 {
				t.Errorf("the user was asked %d times, want 3 (not for the rate-limited call)", n)
			}
		})
	}
}

func TestApprovalWithoutElicitation(t *testing.T) {
	g := newGovServer(t, approvePolicy, nil)
	cs := g.connect(nil, nil)
	res, _ := call(t, cs, "run_python", map[string]any{"code": "print('must not run')"})
	if !res.IsError || !strings.Contains(text(res), "requires the user to approve") || !strings.Contains(text(res), "does not support MCP elicitation") {
		t.Fatalf("%v %s", res.IsError, text(res))
	}
	if r := g.records(t)[0]; r.Decision != "deny" || !strings.Contains(r.Reason, "no elicitation") {
		t.Errorf("record %+v", r)
	}
}

// TestApprovalForged: a client that sends a made-up answer (or replays a
// real one) on its first call is asked properly, and nothing runs.
func TestApprovalForged(t *testing.T) {
	g := newGovServer(t, `{"version": "1", "default": "allow", "tools": {"run_python": {"action": "approve"}}}`, nil)
	el := &elicitor{action: "accept"}
	// The raw client handles input requests itself, like an attacker would.
	raw := g.connect(&mcp.ClientOptions{ElicitationHandler: el.handler, MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true}}, nil)
	ctx := context.Background()
	_, out := call(t, raw, "create_session", nil)
	id := out["session_id"].(string)
	args := map[string]any{"session_id": id, "code": "ran = True"}
	runs := func() float64 {
		_, out := call(t, raw, "list_sessions", nil)
		return out["sessions"].([]any)[0].(map[string]any)["runs"].(float64)
	}
	for _, state := range []string{"", "forged-state", "eyJ0IjoicnVuX3B5dGhvbiJ9"} {
		res, err := raw.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: args,
			InputResponses: mcp.InputResponseMap{"approval": &mcp.ElicitResult{Action: "accept"}}, RequestState: state})
		if err != nil {
			t.Fatal(err)
		}
		if !res.NeedsInput() || res.InputRequests["approval"] == nil || res.RequestState == "" {
			t.Fatalf("state %q: a forged answer was not met with a real approval request: %+v %s", state, res, text(res))
		}
	}
	if n := runs(); n != 0 {
		t.Fatalf("the session ran %v times on forged approvals", n)
	}
	// A genuine answer with the state the server issued runs the code once.
	first, err := raw.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: args})
	if err != nil || !first.NeedsInput() {
		t.Fatalf("%v %+v", err, first)
	}
	// The state is bound to the exact request: other code does not run.
	res, err := raw.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"session_id": id, "code": "ran = 'other code'"},
		InputResponses: mcp.InputResponseMap{"approval": &mcp.ElicitResult{Action: "accept"}}, RequestState: first.RequestState})
	if err != nil || !res.NeedsInput() {
		t.Fatalf("state reused for other code: %v %+v %s", err, res, text(res))
	}
	accept := &mcp.CallToolParams{Name: "run_python", Arguments: args,
		InputResponses: mcp.InputResponseMap{"approval": &mcp.ElicitResult{Action: "accept"}}, RequestState: first.RequestState}
	res, err = raw.CallTool(ctx, accept)
	if err != nil || res.IsError || res.NeedsInput() {
		t.Fatalf("genuine approval: %v %+v %s", err, res, text(res))
	}
	if n := runs(); n != 1 {
		t.Fatalf("runs %v after one approval", n)
	}
	// Replaying the used answer asks again.
	res, err = raw.CallTool(ctx, accept)
	if err != nil || !res.NeedsInput() {
		t.Fatalf("replayed approval: %v %+v", err, res)
	}
	if n := runs(); n != 1 {
		t.Fatalf("runs %v after a replay", n)
	}
}

func TestPackagePolicy(t *testing.T) {
	idx := pypi.NewIndex(t,
		pypi.Package{Name: "pysbx-ok", Version: "1.0.0"},
		pypi.Package{Name: "pysbx-wrapper", Version: "1.0.0", Requires: []string{"pysbx-miner-lib"}},
		pypi.Package{Name: "pysbx-miner-lib", Version: "1.0.0"})
	g := newGovServer(t, `{"version": "1", "default": "allow", "packages": {"allow": ["pysbx-ok", "pysbx-wrap*"], "deny": ["*miner*"]}}`, func(c *engine.Config) {
		cache, err := deps.New(deps.Config{Dir: t.TempDir(), Index: deps.IndexConfig{IndexURL: idx.URL}, Backend: sandbox.NewNative(), Limits: c.Limits, Network: egress.New(egress.Config{}).Installer})
		if err != nil {
			t.Fatal(err)
		}
		c.Deps = cache
	})
	cs := g.connect(nil, nil)
	res, out := call(t, cs, "run_python", map[string]any{"code": "import pysbx_ok\npysbx_ok.VALUE", "dependencies": []any{"PYSBX_OK>=1"}})
	if res.IsError || out["return_value"] != "pysbx-ok-1.0.0" {
		t.Fatalf("allowed package: %s", text(res))
	}
	for _, tc := range []struct {
		name string
		tool string
		args map[string]any
		want string
	}{
		{"not allowed", "run_python", map[string]any{"code": "1", "dependencies": []any{"requests"}}, `package "requests" is not allowed by the policy: packages.allow lists only pysbx-ok, pysbx-wrap*`},
		{"denied", "run_python", map[string]any{"code": "1", "dependencies": []any{"pysbx-miner-lib"}}, `package "pysbx-miner-lib" is refused by the policy rule packages.deny "*miner*"`},
		{"pep723", "run_python", map[string]any{"code": "# /// script\n# dependencies = [\"bitcoin_miner\"]\n# ///\n1"}, `package "bitcoin-miner" is refused`},
		{"session", "create_session", map[string]any{"dependencies": []any{"requests"}}, `package "requests" is not allowed`},
		// Allowed by name, but it pulls in a denied package: found after
		// the install, before any code imports it.
		{"transitive", "run_python", map[string]any{"code": "import pysbx_wrapper", "dependencies": []any{"pysbx-wrapper"}}, `package "pysbx-miner-lib" (a dependency of a requested package) is refused`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, _ := call(t, cs, tc.tool, tc.args)
			if !res.IsError || !strings.Contains(text(res), tc.want) || !strings.Contains(text(res), "Nothing was installed or run") {
				t.Errorf("%v %s", res.IsError, text(res))
			}
		})
	}
	// validate_script reports what run_python would refuse.
	_, out = call(t, cs, "validate_script", map[string]any{"code": "1", "dependencies": []any{"pysbx-ok", "requests"}})
	if out["valid"] != false || !strings.Contains(strings.Join(testutil.Strings(out["problems"]), "\n"), `dependency "requests": package "requests" is not allowed`) {
		t.Errorf("validate_script: %v", out)
	}
	_, out = call(t, cs, "create_session", nil)
	id := out["session_id"].(string)
	res, _ = call(t, cs, "install_package", map[string]any{"session_id": id, "packages": []any{"pysbx-ok", "xmr-miner"}})
	if !res.IsError || !strings.Contains(text(res), `"xmr-miner" is refused`) {
		t.Errorf("install_package: %s", text(res))
	}
	for _, r := range g.records(t)[1:] {
		if r.Decision != "deny" && r.Tool != "create_session" && r.Tool != "validate_script" {
			t.Errorf("record %+v: a package refusal should be a deny", r)
		}
	}
	if !strings.Contains(g.metricsText(t), `pysandbox_denials_total{rule="package",tool="run_python"} 4`) {
		t.Error("metrics lack the package denials")
	}
}

// TestAuditFailClosed: when the audit log cannot be written, the result
// is withheld and every later call refused.
func TestAuditFailClosed(t *testing.T) {
	g := newGovServer(t, `{"version": "1", "default": "allow"}`, nil)
	cs := g.connect(nil, nil)
	if res, _ := call(t, cs, "run_python", map[string]any{"code": "1"}); res.IsError {
		t.Fatal(text(res))
	}
	g.audit.Close()
	res, out := call(t, cs, "run_python", map[string]any{"code": "print('secret result')"})
	if !res.IsError || strings.Contains(text(res), "secret result") || out != nil || !strings.Contains(text(res), "withheld") {
		t.Fatalf("%v %s %v", res.IsError, text(res), out)
	}
	res, _ = call(t, cs, "check_environment", nil)
	if !res.IsError || !strings.Contains(text(res), "refuses them") {
		t.Fatalf("%v %s", res.IsError, text(res))
	}
}

// TestSessionsArePrivate: a caller cannot see, run in, read or close a
// session another caller created, nor read the figure of another's
// one-shot run, even knowing its id. Callers with tokens are told apart
// by their token (callers without one, by capability: see
// cmd/pysandbox's TestTenancy).
func TestSessionsArePrivate(t *testing.T) {
	srv := newServer(t, nil, func(o *Options) { o.MaxInlineBytes = 2048 })
	verify := func(_ context.Context, tok string, _ *http.Request) (*auth.TokenInfo, error) {
		if name, ok := strings.CutSuffix(tok, "-token"); ok {
			return &auth.TokenInfo{UserID: name, Expiration: time.Now().Add(time.Hour)}, nil
		}
		return nil, auth.ErrInvalidToken
	}
	hs := httptest.NewServer(auth.RequireBearerToken(verify, nil)(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)))
	t.Cleanup(hs.Close)
	connectHTTP := func(name string) *mcp.ClientSession {
		client := &http.Client{Transport: bearer{name + "-token"}}
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "c", Version: "1"}, nil).Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: hs.URL, HTTPClient: client}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cs.Close() })
		return cs
	}
	alice, bob := connectHTTP("alice"), connectHTTP("bob")
	res, out := call(t, alice, "create_session", nil)
	if res.IsError {
		t.Fatal(text(res))
	}
	id := out["session_id"].(string)
	if res, _ := call(t, alice, "upload_file", map[string]any{"session_id": id, "path": "secret.txt", "content": "alice's secret"}); res.IsError {
		t.Fatal(text(res))
	}
	_, out = call(t, bob, "list_sessions", nil)
	if n := len(out["sessions"].([]any)); n != 0 {
		t.Errorf("bob sees %d of alice's sessions", n)
	}
	for _, tc := range []struct {
		tool string
		args map[string]any
	}{
		{"run_python", map[string]any{"session_id": id, "code": "open('secret.txt').read()"}},
		{"download_file", map[string]any{"session_id": id, "path": "secret.txt"}},
		{"list_files", map[string]any{"session_id": id}},
		{"upload_file", map[string]any{"session_id": id, "path": "x", "content": "x"}},
		{"install_package", map[string]any{"session_id": id, "packages": []any{"x"}}},
		{"close_session", map[string]any{"session_id": id}},
	} {
		res, _ := call(t, bob, tc.tool, tc.args)
		if !res.IsError || !strings.Contains(text(res), "Unknown session") || strings.Contains(text(res), "alice's secret") {
			t.Errorf("bob's %s on alice's session: %v %s", tc.tool, res.IsError, text(res))
		}
	}
	if _, err := bob.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: fileURI(id, "secret.txt")}); err == nil {
		t.Error("bob read alice's file as a resource")
	}
	// Alice still has it all.
	res, out = call(t, alice, "run_python", map[string]any{"session_id": id, "code": "open('secret.txt').read()"})
	if res.IsError || out["return_value"] != "alice's secret" {
		t.Errorf("alice's own session: %s", text(res))
	}
	if _, err := alice.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: fileURI(id, "secret.txt")}); err != nil {
		t.Errorf("alice reading her file: %v", err)
	}

	// A one-shot plot too large to inline is a link into the figure store.
	res, _ = call(t, alice, "run_python", map[string]any{"code": "import matplotlib.pyplot as plt\nplt.plot(range(100))\n"})
	var link string
	for _, c := range res.Content {
		if l, ok := c.(*mcp.ResourceLink); ok {
			link = l.URI
		}
	}
	if res.IsError || !strings.HasPrefix(link, figurePrefix) {
		t.Fatalf("alice's plot: %s %q", text(res), link)
	}
	_, err := bob.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: link})
	if err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("bob reading alice's figure: %v", err)
	}
	if rr, err := alice.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: link}); err != nil || !bytes.HasPrefix(rr.Contents[0].Blob, []byte("\x89PNG")) {
		t.Errorf("alice reading her figure: %v", err)
	}
}

// TestResourceReadsFollowDownloadFile: session files read as resources
// are under download_file's rule, so a policy cannot be side-stepped.
func TestResourceReadsFollowDownloadFile(t *testing.T) {
	for _, tc := range []struct {
		name, policy, want string
		hidden             bool
	}{
		{"deny", `{"version": "1", "default": "allow", "tools": {"download_file": {"action": "deny"}}}`, "does not allow reading session files", true},
		{"approve", `{"version": "1", "default": "allow", "tools": {"download_file": {"action": "approve"}}}`, "needs the user's approval", true},
		{"rate limit", `{"version": "1", "default": "allow", "tools": {"download_file": {"limits": [{"counter": "dl", "window": "hour", "max": 1}]}}}`, `rate limit "dl"`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGovServer(t, tc.policy, nil)
			cs := g.connect(nil, nil)
			ctx := context.Background()
			_, out := call(t, cs, "create_session", nil)
			id := out["session_id"].(string)
			call(t, cs, "upload_file", map[string]any{"session_id": id, "path": "f.txt", "content": "data"})
			tmpl, err := cs.ListResourceTemplates(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			offered := false
			for _, rt := range tmpl.ResourceTemplates {
				offered = offered || rt.URITemplate == FileTemplate
			}
			if offered == tc.hidden {
				t.Errorf("session file template offered: %v", offered)
			}
			uri := fileURI(id, "f.txt")
			if tc.name == "rate limit" {
				if _, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri}); err != nil {
					t.Fatalf("first read: %v", err)
				}
			}
			_, err = cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("read: %v, want %q", err, tc.want)
			}
			recs := g.records(t)
			last := recs[len(recs)-1]
			if last.Tool != "download_file" || last.Decision == "allow" || !strings.Contains(string(last.Arguments), "pysandbox://sessions/") {
				t.Errorf("record %+v", last)
			}
		})
	}
}

// bearer adds a bearer token to every request.
type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// TestHostileIDsAndURIs: a session id no session could have is refused at
// once with a short message (a 1 MB one was parsed for its replica and
// echoed whole), and a resources/read URI of any length leaves a bounded
// audit record (one of 23 MB wrote a 70 MB line, past what the log's
// readers take).
func TestHostileIDsAndURIs(t *testing.T) {
	g := newGovServer(t, `{"version": "1", "default": "allow"}`, nil)
	cs := g.connect(nil, nil)
	long := strings.Repeat(".", 1<<20)
	for _, tool := range []string{"run_python", "list_files", "close_session"} {
		args := map[string]any{"session_id": long}
		if tool == "run_python" {
			args["code"] = "1"
		}
		res, _ := call(t, cs, tool, args)
		if !res.IsError || !strings.Contains(text(res), "is not a session id") || len(text(res)) > 1024 {
			t.Errorf("%s with a 1 MB id: %d bytes: %.200s", tool, len(text(res)), text(res))
		}
	}
	uri := "pysandbox://sessions/s-1/files/" + strings.Repeat("\xff", 2<<20)
	if _, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: uri}); err == nil || !strings.Contains(err.Error(), "more than any of this server's resources") {
		t.Errorf("a 2 MB URI: %v", err)
	}
	data, err := os.ReadFile(g.auditPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if len(line) > 300<<10 {
			t.Errorf("an audit line of %d bytes", len(line))
		}
	}
	if recs := g.records(t); len(recs) == 0 || recs[len(recs)-1].Decision != "deny" {
		t.Errorf("the read's record: %+v", recs[len(recs)-1])
	}
}
