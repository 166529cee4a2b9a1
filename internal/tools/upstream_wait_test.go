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
	"github.com/pysandbox/pysandbox/internal/policy"
	"github.com/pysandbox/pysandbox/internal/testutil/refservers"
	"github.com/pysandbox/pysandbox/internal/upstream"
)

// Calls to an upstream that is still connecting wait for it (issue 26):
// an agent that starts pysandbox and runs code at once must not fail for
// being early. These tests never let a timing decide: each deadline
// guards against a hang, at least ten times what is expected.

// hungUpstream never answers initialize.
var hungUpstream = map[string]any{"command": "sh", "args": []string{"-c", "exec sleep 1000"}}

// callGuarded calls a tool with a deadline that only guards against a
// hang.
func callGuarded(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	out, _ := res.StructuredContent.(map[string]any)
	if out == nil {
		t.Fatalf("%s: %s", name, text(res))
	}
	return out
}

// TestToolsFromCodeEarlyCall: code run the moment the server starts calls
// an upstream that takes 3 s to start, and gets its result; so does a
// call that reaches the server before the tools module listed anything.
func TestToolsFromCodeEarlyCall(t *testing.T) {
	evCmd, evArgs := refservers.Everything(t)
	slow := func() map[string]any {
		return map[string]any{"command": "sh", "args": append([]string{"-c", `sleep 3; exec "$0" "$@"`, evCmd}, evArgs...)}
	}
	s := startUpServer(t, `{"version": "1", "default": "allow"}`, map[string]any{"slow": slow(), "direct": slow()},
		upstream.Options{ConnectWait: 2 * time.Minute}, false)
	// A call as code that writes to the control channel itself makes it:
	// no catalog was taken first.
	srv := &server{up: s.ups, gov: govern.New(Governance{Policy: policy.AllowAll()}, govern.Sandbox{}, slog.New(slog.DiscardHandler))}
	tr := &toolRun{s: srv, ctx: context.Background(), limits: policy.DefaultUpstreamLimits, approved: map[string]bool{}}
	direct := make(chan string, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		reply := tr.Call(ctx, "direct.echo", json.RawMessage(`{"message": "early"}`))
		if reply.Error != nil {
			direct <- reply.Error.Kind + ": " + reply.Error.Message
			return
		}
		direct <- string(reply.Content)
	}()
	cs := s.connect(nil, nil)
	out := callGuarded(t, cs, "run_python", map[string]any{"timeout_seconds": 60, "code": `
import tools
[tools.slow.echo(message="early"), sorted(s["name"] + " " + s["status"] for s in tools.servers())]`})
	if rv := fmt.Sprint(out["return_value"]); out["status"] != "success" || rv != "[Echo: early [broken failed direct ready everything ready memory ready slow ready]]" {
		t.Errorf("code run at once: %v", out)
	}
	if got := <-direct; !strings.Contains(got, "Echo: early") {
		t.Errorf("a call at once, without a catalog: %s", got)
	}
}

// TestToolsFromCodeUpstreamNotReady: a server whose command fails is
// refused at once, with the reason and when it is tried again, even with
// a wait longer than the run; one that never answers initialize is
// waited for up to the configured bound, then named as still connecting.
func TestToolsFromCodeUpstreamNotReady(t *testing.T) {
	s := startUpServer(t, `{"version": "1", "default": "allow"}`, nil, upstream.Options{ConnectWait: time.Hour, RestartDelay: time.Hour}, true)
	cs := s.connect(nil, nil)
	out := callGuarded(t, cs, "run_python", map[string]any{"timeout_seconds": 60, "code": `
import tools
got = []
for f in (lambda: tools.broken.anything(x=1), lambda: tools.call("broken.anything", {"x": 1})):
    try:
        f()
    except tools.ToolUnavailable as e:
        got.append(str(e))
got`})
	rv, _ := json.Marshal(out["return_value"])
	if out["status"] != "success" || strings.Count(string(rv), "/nonexistent/mcp-server") != 2 || strings.Count(string(rv), "tried again in") != 2 {
		t.Errorf("calls to a server whose command fails: %v", out)
	}

	s = startUpServer(t, `{"version": "1", "default": "allow"}`, map[string]any{"hung": hungUpstream},
		upstream.Options{ConnectWait: 500 * time.Millisecond, ConnectTimeout: time.Hour}, false)
	// The bound is short: the others must not depend on it.
	waitUpReady(t, s.ups, "everything", "memory")
	cs = s.connect(nil, nil)
	out = callGuarded(t, cs, "run_python", map[string]any{"timeout_seconds": 60, "code": `
import tools
got = {}
try:
    tools.hung.anything()
except tools.ToolUnavailable as e:
    got["attribute"] = str(e)
try:
    tools.call("hung.anything", {})
except tools.ToolUnavailable as e:
    got["call"] = str(e)
got["everything"] = tools.everything.echo(message="unaffected")
got`})
	got, _ := out["return_value"].(map[string]any)
	if out["status"] != "success" || !strings.Contains(fmt.Sprint(got["attribute"]), "'hung' was still connecting when this run listed the tools") ||
		!strings.Contains(fmt.Sprint(got["call"]), `"hung" is still connecting after 500ms`) || got["everything"] != "Echo: unaffected" {
		t.Errorf("calls to a server that never answers: %v", out)
	}
	var recs []string
	for _, r := range s.records(t) {
		if r.Event == audit.EventUpstream {
			recs = append(recs, r.Tool+" "+r.Decision+"/"+r.Status)
		}
	}
	if fmt.Sprint(recs) != "[hung.anything error/unavailable everything.echo allow/ok]" {
		t.Errorf("records: %v", recs)
	}
}

// TestToolsFromCodeWaitEndsWithRun: a run's timeout, and the agent's
// cancellation, end a wait far longer than the run: the catalog's wait
// for a server on its first attempt, and a call's wait for a server that
// stopped and is restarting (held here until the test lets it go).
func TestToolsFromCodeWaitEndsWithRun(t *testing.T) {
	s := startUpServer(t, `{"version": "1", "default": "allow"}`, map[string]any{"hung": hungUpstream},
		upstream.Options{ConnectWait: time.Hour, ConnectTimeout: time.Hour}, false)
	cs := s.connect(nil, nil)
	code := "import tools\ntools.everything.echo(message='x')"
	if out := callGuarded(t, cs, "run_python", map[string]any{"timeout_seconds": 2, "code": code}); out["status"] != "timeout" {
		t.Errorf("a run waiting for the catalog: %v", out)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"timeout_seconds": 60, "code": code}})
		if err == nil {
			err = fmt.Errorf("the call returned %s", text(res))
		}
		done <- err
	}()
	time.Sleep(500 * time.Millisecond) // most likely in the wait by now; a cancellation earlier ends the run the same way
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("the cancelled call: %v", err)
	}
	waitForRecord(t, s, func(r audit.Record) bool { return r.Tool == "run_python" && r.Status == "cancelled" })

	evCmd, evArgs := refservers.Everything(t)
	dir := t.TempDir()
	started, release := filepath.Join(dir, "started"), filepath.Join(dir, "release")
	script := `if [ -e "$STARTED" ]; then while [ ! -e "$RELEASE" ]; do sleep 0.05; done; fi; echo $$ > "$STARTED"; exec "$0" "$@"`
	s = startUpServer(t, `{"version": "1", "default": "allow"}`, map[string]any{"fragile": map[string]any{
		"command": "sh", "args": append([]string{"-c", script, evCmd}, evArgs...), "env": map[string]string{"STARTED": started, "RELEASE": release}}},
		upstream.Options{ConnectWait: time.Hour}, true)
	cs = s.connect(nil, nil)
	data, err := os.ReadFile(started)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for upState(s.ups, "fragile") == upstream.StateReady && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if st := upState(s.ups, "fragile"); st != upstream.StateConnecting {
		t.Fatalf("after the kill: %s", st)
	}
	code = "import tools\ntools.fragile.echo(message='x')"
	if out := callGuarded(t, cs, "run_python", map[string]any{"timeout_seconds": 2, "code": code}); out["status"] != "timeout" {
		t.Errorf("a run whose call waits for a restart: %v", out)
	}
	waitForRecord(t, s, func(r audit.Record) bool {
		return r.Tool == "fragile.echo" && r.Decision == "error" && r.Status == "timeout" && strings.Contains(r.Reason, "waited for the upstream server")
	})
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if out := callGuarded(t, cs, "run_python", map[string]any{"timeout_seconds": 60, "code": code}); out["return_value"] != "Echo: x" {
		t.Errorf("once it is back: %v", out)
	}
}

// waitUpReady waits until the servers named are ready.
func waitUpReady(t *testing.T, m *upstream.Manager, names ...string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for _, name := range names {
		for upState(m, name) != upstream.StateReady {
			if time.Now().After(deadline) {
				t.Fatalf("%s did not become ready: %+v", name, m.Status())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

func upState(m *upstream.Manager, name string) string {
	for _, st := range m.Status() {
		if st.Name == name {
			return st.State
		}
	}
	return ""
}

// waitForRecord waits for an audit record that match accepts: a run's
// record is written once it has ended.
func waitForRecord(t *testing.T, s *upServer, match func(audit.Record) bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		for _, r := range s.records(t) {
			if match(r) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no such audit record; the log:\n%v", s.records(t))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
