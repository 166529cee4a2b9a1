package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/pysandbox/pysandbox/internal/govern"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/audit"
	"github.com/pysandbox/pysandbox/internal/metrics"
	"github.com/pysandbox/pysandbox/internal/policy"
	"github.com/pysandbox/pysandbox/internal/testutil"
	"github.com/pysandbox/pysandbox/internal/testutil/refservers"
	"github.com/pysandbox/pysandbox/internal/upstream"
)

// upServer is a governed server whose code can call the reference MCP
// servers everything and memory, run by the test from npm, plus one that
// never starts.
type upServer struct {
	*govServer
	ups     *upstream.Manager
	wire    *testutil.SyncBuffer            // what went to and came from "everything"
	wires   map[string]*testutil.SyncBuffer // the same, of every server
	updates chan *policy.Policy             // replaces the policy, as SIGHUP does
	names   []string                        // the tool names a policy may use
}

// upstreamConfig lists everything, memory and broken, plus extra.
func upstreamConfig(t *testing.T, extra map[string]any) *upstream.Config {
	t.Helper()
	evCmd, evArgs := refservers.Everything(t)
	memCmd, memArgs := refservers.Memory(t, filepath.Join(t.TempDir(), "memory.jsonl"))
	servers := map[string]any{
		"everything": map[string]any{"command": evCmd, "args": evArgs},
		"memory":     map[string]any{"command": memCmd, "args": memArgs},
		"broken":     map[string]any{"command": "/nonexistent/mcp-server"},
	}
	for k, v := range extra {
		servers[k] = v
	}
	doc, _ := json.Marshal(map[string]any{"mcpServers": servers})
	cfg, err := upstream.Parse(doc, "upstreams.json")
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func newUpServer(t *testing.T, policyJSON string) *upServer {
	t.Helper()
	return newUpServerWith(t, policyJSON, nil)
}

// newUpServerWith adds extra upstream servers (mcpServers entries).
func newUpServerWith(t *testing.T, policyJSON string, extra map[string]any) *upServer {
	t.Helper()
	return startUpServer(t, policyJSON, extra, upstream.Options{}, true)
}

// startUpServer starts the upstreams with o, and waits for them when
// wait is set.
func startUpServer(t *testing.T, policyJSON string, extra map[string]any, o upstream.Options, wait bool) *upServer {
	t.Helper()
	cfg := upstreamConfig(t, extra)
	wires := map[string]*testutil.SyncBuffer{}
	for _, sc := range cfg.Servers {
		wires[sc.Name] = &testutil.SyncBuffer{}
	}
	wire := wires["everything"]
	o.Wrap = func(server string, tr mcp.Transport) mcp.Transport {
		return &mcp.LoggingTransport{Transport: tr, Writer: wires[server]}
	}
	ups := upstream.Start(cfg, o)
	t.Cleanup(func() { ups.Close() })
	if wait {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		ups.WaitReady(ctx)
	}
	names := append([]string(nil), Names...)
	for _, sc := range cfg.Servers {
		names = append(names, policy.UpstreamPattern(sc.Name))
	}
	pol, err := policy.Parse([]byte(policyJSON), "test.json", names)
	if err != nil {
		t.Fatal(err)
	}
	g := &govServer{auditPath: filepath.Join(t.TempDir(), "audit.log")}
	if g.audit, err = audit.Open(g.auditPath, audit.Options{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.audit.Close() })
	g.metrics = metrics.New(metrics.Gauges{})
	updates := make(chan *policy.Policy, 1)
	g.connect = func(copts *mcp.ClientOptions, sopts *mcp.ClientSessionOptions) *mcp.ClientSession {
		return connectFull(t, nil, func(o *Options) {
			o.Governance = Governance{Policy: pol, Audit: g.audit, Metrics: g.metrics, Updates: updates, Limiter: frozenLimiter()}
			o.Upstreams = ups
		}, copts, sopts)
	}
	return &upServer{govServer: g, ups: ups, wire: wire, wires: wires, updates: updates, names: names}
}

const upPolicy = `{"version": "1", "default": "allow", "tools": {
	"everything.get-env": {"action": "deny", "reason": "it shows the upstream's environment"},
	"everything.get_annotated_message": {"action": "deny"},
	"everything.get-tiny-image": {"action": "approve"},
	"memory.*": {"limits": [{"counter": "memory", "window": "hour", "max": 4}]}
}, "upstream": {"limits": {"calls": 30}}}`

// run runs code and returns its result, failing on a refusal.
func runCode(t *testing.T, cs *mcp.ClientSession, args map[string]any) (*mcp.CallToolResult, map[string]any) {
	t.Helper()
	res, out := call(t, cs, "run_python", args)
	if out == nil {
		t.Fatalf("run_python: %s", text(res))
	}
	return res, out
}

// TestToolsFromCode is the walkthrough: one run calls several upstream
// tools, combines their results in Python and returns a short answer,
// every inner call governed and recorded.
func TestToolsFromCode(t *testing.T) {
	s := newUpServer(t, upPolicy)
	el := &elicitor{action: "accept"}
	cs := s.connect(&mcp.ClientOptions{ElicitationHandler: el.handler}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-06-18"})
	ctx := context.Background()

	// Discovery: the description says tools exist; the names come first.
	tl, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, tool := range tl.Tools {
		if tool.Name == "run_python" && !strings.Contains(tool.Description, "list_tools_in_sandbox") {
			t.Errorf("run_python's description does not say how to find tools: %s", tool.Description)
		}
		found = found || tool.Name == "list_tools_in_sandbox"
	}
	if !found {
		t.Fatal("no list_tools_in_sandbox")
	}
	res, _ := call(t, cs, "list_tools_in_sandbox", nil)
	names := text(res)
	if !strings.Contains(names, "everything: ") || !strings.Contains(names, "get-sum") || !strings.Contains(names, "memory: ") ||
		strings.Contains(names, "get-env") || strings.Contains(names, "Echoes back") {
		t.Errorf("names: %s", names)
	}
	if !strings.Contains(names, "server broken: failed") {
		t.Errorf("the broken upstream is not reported: %s", names)
	}
	res, out := call(t, cs, "list_tools_in_sandbox", map[string]any{"filter": "everything.get-sum", "detail": "full"})
	if tools, _ := out["tools"].([]any); len(tools) != 1 || !strings.Contains(text(res), "tools.everything.get_sum(*, a: float, b: float)") ||
		!strings.Contains(text(res), "Returns the sum of two numbers") {
		t.Errorf("full: %s", text(res))
	}

	// One run, several tools, one short answer.
	res, out = runCode(t, cs, map[string]any{"code": `
import tools
total = tools.everything.get_sum(a=2, b=40)
weather = tools.everything.get_structured_content(location="Chicago")
tools.memory.create_entities(entities=[{"name": "Ada", "entityType": "person", "observations": ["wrote the first program"]}])
graph = tools.memory.read_graph()
echo = tools.everything.echo(message="héllo")
{"sum": total, "weather_keys": sorted(weather), "people": [e["name"] for e in graph["entities"]], "echo": echo}
`})
	rv, _ := out["return_value"].(map[string]any)
	if out["status"] != "success" || rv == nil || !strings.Contains(fmt.Sprint(rv["sum"]), "42") ||
		fmt.Sprint(rv["people"]) != "[Ada]" || !strings.Contains(fmt.Sprint(rv["echo"]), "héllo") || fmt.Sprint(rv["weather_keys"]) == "[]" {
		t.Fatalf("walkthrough: %s", text(res))
	}
	if tc, _ := out["tool_calls"].(map[string]any); tc == nil || tc["calls"] != float64(5) {
		t.Errorf("tool_calls: %v", out["tool_calls"])
	}

	// A denied tool is invisible from code and refused if called.
	_, out = runCode(t, cs, map[string]any{"code": `
import tools
seen = "get_env" in dir(tools.everything) or "everything.get-env" in tools.list()
try:
    tools.call("everything.get-env")
    called = "called"
except tools.ToolDenied as e:
    called = "denied: " + str(e)
[seen, called]`})
	if rv := fmt.Sprint(out["return_value"]); !strings.Contains(rv, "false denied:") || !strings.Contains(rv, "upstream's environment") {
		t.Errorf("denied tool: %v", out["return_value"])
	}

	// An approve tool asks the user once per run.
	_, out = runCode(t, cs, map[string]any{"code": `
import tools
a = tools.everything.get_tiny_image()
b = tools.everything.get_tiny_image()
[type(a).__name__, any(c.get("type") == "image" for c in a), a == b]`})
	if fmt.Sprint(out["return_value"]) != "[list true true]" {
		t.Errorf("approved tool: %v", out["return_value"])
	}
	if asked := el.asked(); len(asked) != 1 || !strings.Contains(asked[0], "everything.get-tiny-image") {
		t.Errorf("asked %q", asked)
	}

	// Rate limits hold across runs: memory.* may be called 4 times an
	// hour, and the walkthrough made 2 of them.
	_, out = runCode(t, cs, map[string]any{"code": `
import tools
got = []
for i in range(3):
    try:
        tools.memory.search_nodes(query="Ada")
        got.append("ok")
    except tools.ToolRateLimited as e:
        got.append("limited")
got`})
	if fmt.Sprint(out["return_value"]) != "[ok ok limited]" {
		t.Errorf("rate limit across runs: %v", out["return_value"])
	}

	// The per-run cap on calls (30), and parallel calls.
	_, out = runCode(t, cs, map[string]any{"code": `
import asyncio, tools
got = await asyncio.gather(*[tools.everything.echo.acall(message=str(i)) for i in range(8)])
n = len(got)
try:
    for i in range(40):
        tools.everything.echo(message="x")
        n += 1
except tools.ToolLimitExceeded as e:
    err = str(e)
[n, "30 tool calls" in err, got[7]]`})
	if rv := fmt.Sprint(out["return_value"]); rv != "[30 true Echo: 7]" {
		t.Errorf("cap and parallel calls: %v", out["return_value"])
	}

	// Arguments that fail the schema never leave the sandbox.
	_, out = runCode(t, cs, map[string]any{"code": `
import tools
try:
    tools.everything.get_sum(a="two", b=1)
except tools.ToolArgumentError as e:
    msg = str(e)
msg`})
	if rv := fmt.Sprint(out["return_value"]); !strings.Contains(rv, "'a'") {
		t.Errorf("argument error: %v", out["return_value"])
	}

	// The audit log ties every inner call to its run, and verifies.
	recs := s.records(t)
	runs := map[string]bool{}
	for _, r := range recs {
		if r.Event == audit.EventCall && r.Tool == "run_python" {
			runs[r.CallID] = true
		}
	}
	decisions := map[string]int{}
	for _, r := range recs {
		if r.Event != audit.EventUpstream {
			continue
		}
		if !runs[r.CallID] || r.Upstream == nil {
			t.Errorf("an upstream record not tied to a run: %+v", r)
			continue
		}
		decisions[r.Tool+" "+r.Decision]++
	}
	for want, n := range map[string]int{"everything.get-sum allow": 1, "everything.get-env deny": 1, "everything.get-tiny-image approved": 2,
		"memory.search_nodes rate_limited": 1, "everything.echo limit": 1} {
		if decisions[want] != n {
			t.Errorf("%d records of %q, want %d (all: %v)", decisions[want], want, n, decisions)
		}
	}
	if m := s.metricsText(t); !strings.Contains(m, `pysandbox_upstream_calls_total{decision="allow",server="everything"}`) {
		t.Errorf("metrics:\n%s", m)
	}

	// check_environment reports the upstreams and the caps.
	res, _ = call(t, cs, "check_environment", nil)
	if env := text(res); !strings.Contains(env, "server everything: ready") || !strings.Contains(env, "at most 30 calls") ||
		!strings.Contains(env, "so this rule applies to nothing; did you mean everything.get-annotated-message?") {
		t.Errorf("check_environment: %s", env)
	}
}

// TestToolsFromCodeTimeout: the run's timeout cancels an upstream call in
// flight, and the upstream is told (notifications/cancelled).
func TestToolsFromCodeTimeout(t *testing.T) {
	s := newUpServer(t, `{"version": "1", "default": "allow"}`)
	cs := s.connect(nil, nil)
	for _, session := range []bool{false, true} {
		args := map[string]any{"timeout_seconds": 3, "code": `
import tools
tools.everything.trigger_long_running_operation(duration=60, steps=60)`}
		if session {
			_, out := call(t, cs, "create_session", nil)
			args["session_id"] = out["session_id"]
		}
		_, out := runCode(t, cs, args)
		if out["status"] != "timeout" {
			t.Errorf("session %v: status %v", session, out["status"])
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && strings.Count(s.wire.String(), "notifications/cancelled") < 2 {
		time.Sleep(50 * time.Millisecond)
	}
	if n := strings.Count(s.wire.String(), "notifications/cancelled"); n < 2 {
		t.Errorf("%d cancellations sent upstream, want 2", n)
	}
	for _, r := range s.records(t) {
		if r.Event == audit.EventUpstream && r.Status != "timeout" {
			t.Errorf("record %+v", r)
		}
	}
}

// TestToolsFromCodeSession: a session keeps an upstream result across
// runs, and each run's calls are its own.
func TestToolsFromCodeSession(t *testing.T) {
	s := newUpServer(t, `{"version": "1", "default": "allow"}`)
	cs := s.connect(nil, nil)
	_, out := call(t, cs, "create_session", nil)
	id := out["session_id"]
	_, out = runCode(t, cs, map[string]any{"session_id": id, "code": `
import tools
w = tools.everything.get_structured_content(location="New York")
sorted(w)`})
	if out["status"] != "success" {
		t.Fatalf("%v", out)
	}
	_, out = runCode(t, cs, map[string]any{"session_id": id, "code": `[sorted(w) == sorted(w.keys()), tools.everything.echo(message="again")]`})
	if rv := fmt.Sprint(out["return_value"]); rv != "[true Echo: again]" {
		t.Errorf("second run: %v", out["return_value"])
	}
	if tc, _ := out["tool_calls"].(map[string]any); tc == nil || tc["calls"] != float64(1) {
		t.Errorf("the second run's calls: %v", out["tool_calls"])
	}
}

// TestToolsFromCodeFlood: 10 000 calls in a loop are bounded: the run's
// cap refuses the rest, their audit records are summarized, and the
// server keeps serving.
func TestToolsFromCodeFlood(t *testing.T) {
	s := newUpServer(t, `{"version": "1", "default": "allow", "upstream": {"limits": {"calls": 50}}}`)
	cs := s.connect(nil, nil)
	_, out := runCode(t, cs, map[string]any{"timeout_seconds": 60, "code": `
import tools
ok = refused = 0
for i in range(10000):
    try:
        tools.everything.echo(message="x")
        ok += 1
    except tools.ToolLimitExceeded:
        refused += 1
[ok, refused]`})
	if fmt.Sprint(out["return_value"]) != "[50 9950]" {
		t.Fatalf("flood: %v", out)
	}
	n := 0
	var last audit.Record
	for _, r := range s.records(t) {
		if r.Event == audit.EventUpstream {
			n++
			last = r
		}
	}
	if n > 50+maxToolRefusalRecords+1 || last.Upstream == nil || last.Upstream.Unrecorded["limit"] != 9950-maxToolRefusalRecords {
		t.Errorf("%d upstream records; the last %+v", n, last)
	}
	_, out = runCode(t, cs, map[string]any{"code": `import tools; tools.everything.echo(message="still here")`})
	if out["return_value"] != "Echo: still here" {
		t.Errorf("after the flood: %v", out)
	}
}

// TestToolsFromCodeServerSide checks the server's own checks, which code
// that writes to the control channel itself meets without the module's:
// unknown tools, arguments against the schema, an upstream that is down.
func TestToolsFromCodeServerSide(t *testing.T) {
	s := newUpServer(t, `{"version": "1", "default": "allow"}`)
	srv := &server{up: s.ups, gov: govern.New(Governance{Policy: policy.AllowAll()}, govern.Sandbox{}, slog.New(slog.DiscardHandler))}
	tr := &toolRun{s: srv, ctx: context.Background(), limits: policy.DefaultUpstreamLimits, approved: map[string]bool{}}
	for _, c := range []struct{ name, args, kind string }{
		{"everything.nope", `{}`, "unknown_tool"},
		{"nothing", `{}`, "unknown_tool"},
		{"broken.tool", `{}`, "unavailable"},
		{"everything.get-sum", `{"a": "x", "b": 1}`, "invalid_arguments"},
		{"everything.get-sum", `{"b": 1}`, "invalid_arguments"},
		{"everything.get-sum", `[1, 2]`, "invalid_arguments"},
	} {
		reply := tr.Call(context.Background(), c.name, json.RawMessage(c.args))
		if reply.Error == nil || reply.Error.Kind != c.kind {
			t.Errorf("%s %s: %+v %+v", c.name, c.args, reply, reply.Error)
		}
	}
	reply := tr.Call(context.Background(), "everything.get-sum", json.RawMessage(`{"a": 1, "b": 2}`))
	if reply.Error != nil || !strings.Contains(string(reply.Content), "3") {
		t.Errorf("a good call: %+v %+v", reply, reply.Error)
	}
}

// TestToolsFromCodeUpstreamTrouble: an upstream that dies in the middle
// of a call, one that never started, and one on streamable HTTP, as code
// sees them; the server keeps serving.
func TestToolsFromCodeUpstreamTrouble(t *testing.T) {
	evCmd, evArgs := refservers.Everything(t)
	pidFile := filepath.Join(t.TempDir(), "pid")
	s := newUpServerWith(t, `{"version": "1", "default": "allow"}`, map[string]any{
		// exec keeps the pid the shell wrote.
		"fragile": map[string]any{"command": "sh", "args": append([]string{"-c", `echo $$ > ` + pidFile + `; exec "$0" "$@"`, evCmd}, evArgs...)},
		"remote":  map[string]any{"url": refservers.EverythingHTTP(t)},
	})
	cs := s.connect(nil, nil)
	data, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	go func() {
		// Mid-call: a server killed before the call would be restarted,
		// and the call would wait for it and run.
		deadline := time.Now().Add(2 * time.Minute)
		for !strings.Contains(s.wires["fragile"].String(), `trigger-long-running-operation","arguments`) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		syscall.Kill(pid, syscall.SIGKILL)
	}()
	_, out := runCode(t, cs, map[string]any{"code": `
import tools
try:
    tools.fragile.trigger_long_running_operation(duration=60, steps=60)
    r = "returned"
except tools.ToolUnavailable as e:
    r = "unavailable: " + str(e)
r`})
	if rv := fmt.Sprint(out["return_value"]); !strings.Contains(rv, "unavailable: ") || !strings.Contains(rv, "fragile") {
		t.Errorf("a call whose upstream died: %v", out)
	}
	_, out = runCode(t, cs, map[string]any{"code": `
import tools
try:
    tools.broken.anything(x=1)
except tools.ToolUnavailable as e:
    r = str(e)
[r, [s["status"] for s in tools.servers() if s["name"] == "broken"], tools.remote.get_sum(a=1, b=2)]`})
	if rv := fmt.Sprint(out["return_value"]); !strings.Contains(rv, "failed") || !strings.Contains(rv, "/nonexistent/mcp-server") || !strings.Contains(rv, "3") {
		t.Errorf("a server that never started, and one over HTTP: %v", out)
	}
	_, out = runCode(t, cs, map[string]any{"code": `import tools; tools.everything.echo(message="still serving")`})
	if out["return_value"] != "Echo: still serving" {
		t.Errorf("after the trouble: %v", out)
	}
}

// TestToolsFromCodeNoMidCallApproval: on MCP 2026-07-28 a server cannot
// ask the user in the middle of a call, so a tool under approve is
// refused with a message that says what to do.
func TestToolsFromCodeNoMidCallApproval(t *testing.T) {
	s := newUpServer(t, `{"version": "1", "default": "allow", "tools": {"everything.echo": {"action": "approve"}}}`)
	el := &elicitor{action: "accept"}
	cs := s.connect(&mcp.ClientOptions{ElicitationHandler: el.handler}, &mcp.ClientSessionOptions{ProtocolVersion: "2026-07-28"})
	_, out := runCode(t, cs, map[string]any{"code": `
import tools
try:
    tools.everything.echo(message="x")
except tools.ToolApprovalDeclined as e:
    r = str(e)
r`})
	if rv := fmt.Sprint(out["return_value"]); !strings.Contains(rv, "cannot ask the user in the middle of a call") || !strings.Contains(rv, "allow everything.echo") {
		t.Errorf("%v", out)
	}
	if len(el.asked()) != 0 {
		t.Errorf("asked %v", el.asked())
	}
}

// TestToolsFromCodeMCPCancel: cancelling the run_python call (MCP
// notifications/cancelled from the agent) cancels the upstream call in
// flight, and the upstream is told.
func TestToolsFromCodeMCPCancel(t *testing.T) {
	s := newUpServer(t, `{"version": "1", "default": "allow"}`)
	cs := s.connect(nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"timeout_seconds": 50, "code": `
import tools
tools.everything.trigger_long_running_operation(duration=45, steps=45)`}})
		if err == nil {
			err = fmt.Errorf("the call returned %s", text(res))
		}
		done <- err
	}()
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(s.wire.String(), "trigger-long-running-operation\",\"arguments") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("the cancelled call: %v", err)
	}
	for time.Now().Before(deadline) && !strings.Contains(s.wire.String(), "notifications/cancelled") {
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(s.wire.String(), "notifications/cancelled") {
		t.Errorf("no cancellation was sent upstream:\n%s", s.wire.String())
	}
	// The server serves on.
	_, out := runCode(t, cs, map[string]any{"code": `import tools; tools.everything.echo(message="on")`})
	if out["return_value"] != "Echo: on" {
		t.Errorf("after the cancellation: %v", out)
	}
}

// TestToolsFromCodeManyParallel: more calls in parallel than may be in
// flight at once all succeed: the module keeps to the bound, and the
// server frees a call's slot before its answer can arrive.
func TestToolsFromCodeManyParallel(t *testing.T) {
	s := newUpServer(t, `{"version": "1", "default": "allow"}`)
	cs := s.connect(nil, nil)
	for i := 0; i < 3; i++ {
		_, out := runCode(t, cs, map[string]any{"code": `
import asyncio, tools
got = await asyncio.gather(*[tools.everything.echo.acall(message=str(i)) for i in range(300)], return_exceptions=True)
[sum(1 for g in got if isinstance(g, str)), [repr(g) for g in got if not isinstance(g, str)][:3]]`})
		if rv := fmt.Sprint(out["return_value"]); rv != "[300 []]" {
			t.Fatalf("300 parallel calls: %v", out)
		}
	}
}

// TestToolsFromCodeCancelledCallCounts: a call that reached the upstream
// counts against the rate limit even when the run's end cancelled it
// (the upstream may have acted on it), and its record says it was
// allowed.
func TestToolsFromCodeCancelledCallCounts(t *testing.T) {
	s := newUpServer(t, `{"version": "1", "default": "allow", "tools": {"everything.trigger-long-running-operation": {"limits": [{"counter": "long", "window": "hour", "max": 1}]}}}`)
	cs := s.connect(nil, nil)
	_, out := runCode(t, cs, map[string]any{"timeout_seconds": 3, "code": `
import tools
tools.everything.trigger_long_running_operation(duration=30, steps=30)`})
	if out["status"] != "timeout" {
		t.Fatalf("%v", out)
	}
	_, out = runCode(t, cs, map[string]any{"code": `
import tools
try:
    tools.everything.trigger_long_running_operation(duration=1, steps=1)
    r = "ran"
except tools.ToolRateLimited as e:
    r = "limited"
r`})
	if out["return_value"] != "limited" {
		t.Errorf("the second call: %v", out)
	}
	var got []string
	for _, r := range s.records(t) {
		if r.Event == audit.EventUpstream {
			got = append(got, r.Decision+"/"+r.Status)
		}
	}
	if fmt.Sprint(got) != "[allow/timeout rate_limited/rate_limited]" {
		t.Errorf("records %v", got)
	}
}

// TestArgsForUser: the user approving a call sees every argument by name,
// however long another one is.
func TestArgsForUser(t *testing.T) {
	args, _ := json.Marshal(map[string]any{"content": strings.Repeat("harmless ", 1000), "path": "/etc/IMPORTANT_CONFIG"})
	shown := argsForUser(args)
	if !strings.Contains(shown, `"path" = "/etc/IMPORTANT_CONFIG"`) || !strings.Contains(shown, "(9002 bytes)") || len(shown) > 1000 {
		t.Errorf("%s", shown)
	}
	many := map[string]any{}
	for i := 0; i < 100; i++ {
		many[fmt.Sprintf("k%02d", i)] = strings.Repeat("v", 200)
	}
	many["a\n  path = \"/tmp/harmless\""] = "x"
	args, _ = json.Marshal(many)
	shown = argsForUser(args)
	if !strings.Contains(shown, "more arguments: ") || !strings.Contains(shown, `"k99"`) || len(shown) > 20000 {
		t.Errorf("%s", shown)
	}
	// A key cannot draw a line of its own.
	if strings.Contains(shown, "\n  path =") || !strings.Contains(shown, `"a\n  path = \"/tmp/harmless\""`) {
		t.Errorf("a key drew a line: %s", shown)
	}
}

// TestToolsFromCodePolicyReloadedDuringApproval: a policy that denies the
// tool, reloaded while the user is being asked, wins over the answer.
func TestToolsFromCodePolicyReloadedDuringApproval(t *testing.T) {
	s := newUpServer(t, `{"version": "1", "default": "allow", "tools": {"everything.echo": {"action": "approve"}}}`)
	deny, err := policy.Parse([]byte(`{"version": "1", "default": "allow", "tools": {"everything.echo": {"action": "deny"}}}`), "reloaded.json", s.names)
	if err != nil {
		t.Fatal(err)
	}
	asked := 0
	cs := s.connect(&mcp.ClientOptions{ElicitationHandler: func(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		asked++
		s.updates <- deny
		time.Sleep(300 * time.Millisecond) // the reload applies meanwhile
		return &mcp.ElicitResult{Action: "accept"}, nil
	}}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-06-18"})
	_, out := runCode(t, cs, map[string]any{"code": `
import tools
try:
    tools.everything.echo(message="x")
    r = "called"
except tools.ToolDenied as e:
    r = str(e)
r`})
	if rv := fmt.Sprint(out["return_value"]); !strings.Contains(rv, "no longer allows everything.echo") || asked != 1 {
		t.Errorf("asked %d: %v", asked, out)
	}
	if strings.Contains(s.wire.String(), `"method":"tools/call"`) {
		t.Error("the call reached the upstream")
	}
}

// TestToolsFromCodeUndeclaredArguments: an argument the tool's schema
// does not name never reaches the upstream, even written to the control
// channel by hand (the module refuses it first).
func TestToolsFromCodeUndeclaredArguments(t *testing.T) {
	s := newUpServer(t, `{"version": "1", "default": "allow"}`)
	cs := s.connect(nil, nil)
	_, out := runCode(t, cs, map[string]any{"code": `
import json, tools
tools.list()
r = tools._channel.call({"op": "tool_call", "name": "everything.echo"}, json.dumps({"message": "x", "hidden": "y"}))
r["error"]["kind"], r["error"]["message"]`})
	if rv := fmt.Sprint(out["return_value"]); !strings.Contains(rv, "invalid_arguments") || !strings.Contains(rv, `takes no argument "hidden"`) {
		t.Errorf("%v", out)
	}
}

// TestToolsFromCodeThreads: more threads calling at once than may be in
// flight all succeed: the module queues them.
func TestToolsFromCodeThreads(t *testing.T) {
	s := newUpServer(t, `{"version": "1", "default": "allow"}`)
	cs := s.connect(nil, nil)
	_, out := runCode(t, cs, map[string]any{"code": `
import threading, tools
ok, errors = [], []
def work(i):
    for j in range(5):
        try:
            ok.append(tools.everything.echo(message="%d-%d" % (i, j)))
        except Exception as e:
            errors.append(repr(e))
threads = [threading.Thread(target=work, args=(i,)) for i in range(30)]
for t in threads: t.start()
for t in threads: t.join()
[len(ok), errors[:3]]`})
	if rv := fmt.Sprint(out["return_value"]); rv != "[150 []]" {
		t.Errorf("%v", out)
	}
}

// TestToolsFromCodeArgumentRules: the policy's rules on arguments apply
// to the upstream tools code calls, as to the server's own: deny_if
// refuses the matching call only, require refuses a call with the
// argument value it names, and approve_if asks for these arguments
// only (once: the answer holds for the same arguments in the run).
func TestToolsFromCodeArgumentRules(t *testing.T) {
	s := newUpServer(t, `{"version": "1", "default": "allow", "tools": {"everything.echo": {
		"require": [{"conditions": [{"path": "args.message", "op": "neq", "value": "forbidden"}], "on_deny": "say something else"}],
		"deny_if": [{"conditions": [{"path": "args.message", "op": "regex", "value": "(?i)secret"}], "on_deny": "no secrets"}],
		"approve_if": [{"conditions": [{"path": "args.message", "op": "eq", "value": "ask"}], "reason": "it says ask"}]}}}`)
	el := &elicitor{action: "accept"}
	cs := s.connect(&mcp.ClientOptions{ElicitationHandler: el.handler}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-06-18"})
	_, out := runCode(t, cs, map[string]any{"code": `
import tools
got = []
for m in ["hello", "my SECRET", "forbidden", "ask", "ask"]:
    try:
        r = tools.everything.echo(message=m)
        got.append("ok")
    except tools.ToolError as e:
        got.append(type(e).__name__ + ": " + str(e))
got`})
	got, _ := out["return_value"].([]any)
	if len(got) != 5 || got[0] != "ok" || !strings.Contains(fmt.Sprint(got[1]), "no secrets") || !strings.Contains(fmt.Sprint(got[2]), "say something else") || got[3] != "ok" || got[4] != "ok" {
		t.Fatalf("results: %v (%v)", got, out)
	}
	asked := el.asked()
	if len(asked) != 1 || !strings.Contains(asked[0], "Asked because: it says ask") {
		t.Errorf("asked %q", asked)
	}
}
