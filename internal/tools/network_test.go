package tools

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/audit"
	"github.com/pysandbox/pysandbox/internal/egress"
	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/policy"
	"github.com/pysandbox/pysandbox/internal/testutil/webhost"
)

// netServer is a governed server whose policy has a network section: the
// plain host allowed, the TLS host under approval, evil.test denied.
type netServer struct {
	*govServer
	host *webhost.Host
}

func newNetServer(t *testing.T) *netServer {
	t.Helper()
	h := webhost.New(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello from "+r.Host) }))
	doc := fmt.Sprintf(`{"version":"1","default":"allow","network":{"allow":[%q],"approve":[%q],"deny":["evil.test"],"limits":{"connections":5}}}`,
		h.PlainName+"=127.0.0.1", h.TLSName+"=127.0.0.1")
	pol, err := policy.Parse([]byte(doc), "net.json", Names)
	if err != nil {
		t.Fatal(err)
	}
	proxy := egress.New(egress.Config{Rules: func() *policy.NetworkRules { return pol.Network }})
	g := newGovServer(t, doc, nil)
	g.connect = func(copts *mcp.ClientOptions, sopts *mcp.ClientSessionOptions) *mcp.ClientSession {
		return connectFull(t, func(c *engine.Config) { c.Network = true }, func(o *Options) {
			o.Governance = Governance{Policy: pol, Audit: g.audit, Metrics: g.metrics, Limiter: frozenLimiter()}
			o.Network = proxy
		}, copts, sopts)
	}
	return &netServer{govServer: g, host: h}
}

// fetch is code that fetches url and returns the body or the error.
func fetch(url, ca string) string {
	return fmt.Sprintf(`
import ssl, urllib.request
open("/tmp/ca.pem", "w").write(%q)
ctx = ssl.create_default_context(cafile="/tmp/ca.pem")
try:
    res = urllib.request.urlopen(%q, timeout=20, context=ctx).read().decode()
except Exception as e:
    res = "refused: " + str(e)
res
`, ca, url)
}

func TestNetworkOverMCP(t *testing.T) {
	s := newNetServer(t)
	el := &elicitor{action: "accept"}
	cs := s.connect(&mcp.ClientOptions{ElicitationHandler: el.handler}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-06-18"})

	// The tools say what network there is.
	tl, err := cs.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range tl.Tools {
		if tool.Name == "run_python" && !strings.Contains(tool.Description, "only through the server's proxy") {
			t.Errorf("run_python's description: %s", tool.Description)
		}
	}
	res, out := call(t, cs, "check_environment", nil)
	if !strings.Contains(text(res), "network: only through the server's proxy") || !strings.Contains(text(res), s.host.PlainName) {
		t.Errorf("check_environment: %s", text(res))
	}
	if gov, _ := out["governance"].(map[string]any); gov == nil || gov["network"] == nil {
		t.Errorf("check_environment's network: %v", out["governance"])
	}
	res, out = call(t, cs, "validate_script", map[string]any{"code": `import urllib.request
urllib.request.urlopen("http://evil.test/x")
urllib.request.urlopen("http://` + s.host.PlainName + `/ok")`})
	if out["valid"] != false || !strings.Contains(text(res), "does not allow evil.test:80") {
		t.Errorf("validate_script: %s", text(res))
	}

	// Allowed.
	res, out = call(t, cs, "run_python", map[string]any{"code": fetch("http://"+s.host.PlainName+"/a", s.host.CAPEM)})
	if out["return_value"] != "hello from "+s.host.PlainName {
		t.Fatalf("allowed host: %s", text(res))
	}
	if n, _ := out["network"].(map[string]any); n == nil || n["connections"] != float64(1) {
		t.Errorf("network usage: %v", out["network"])
	}
	// Under approval: asked once, mid-call, then it works over TLS.
	res, out = call(t, cs, "run_python", map[string]any{"code": fetch("https://"+s.host.TLSName+"/b", s.host.CAPEM) + "\n" + fetch("https://"+s.host.TLSName+"/c", s.host.CAPEM)})
	if out["return_value"] != "hello from "+s.host.TLSName {
		t.Fatalf("approved host: %s", text(res))
	}
	if asked := el.asked(); len(asked) != 1 || !strings.Contains(asked[0], s.host.TLSName) {
		t.Errorf("asked %q", asked)
	}
	// Denied, with the reason in the code's error.
	res, out = call(t, cs, "run_python", map[string]any{"code": fetch("http://evil.test/", s.host.CAPEM)})
	if rv, _ := out["return_value"].(string); !strings.Contains(rv, "pysandbox network proxy: the network policy denies evil.test:80") {
		t.Errorf("denied host: %s", text(res))
	}
	// Not listed at all (localhost is the sandbox's own, in NO_PROXY:
	// refused inside, with no route out).
	res, out = call(t, cs, "run_python", map[string]any{"code": fetch("http://localhost:8080/", s.host.CAPEM) + "\n" + fetch("http://example.org/", s.host.CAPEM)})
	if rv, _ := out["return_value"].(string); !strings.Contains(rv, "example.org:80 is not among the hosts") {
		t.Errorf("unlisted host: %s", text(res))
	}

	// The audit log: one record per connection, tied to its call.
	recs := s.records(t)
	calls := map[string]string{}
	for _, r := range recs {
		if r.Event == "call" {
			calls[r.CallID] = r.Tool
		}
	}
	var conns []string
	for _, r := range recs {
		switch r.Event {
		case "connect":
			if r.Net == nil || r.CallID == "" {
				t.Errorf("connect record %+v", r)
				continue
			}
			if calls[r.CallID] != "run_python" {
				t.Errorf("connect record for call %s, which is not a run_python call", r.CallID)
			}
			conns = append(conns, fmt.Sprintf("%s %s:%d %s", r.Net.Method, r.Net.Host, r.Net.Port, r.Decision))
		}
	}
	want := []string{"GET " + strings.Replace(s.host.PlainName, ":", ":", 1) + " allow", "CONNECT " + s.host.TLSName + " approved", "CONNECT " + s.host.TLSName + " approved",
		"GET evil.test:80 deny", "GET example.org:80 deny"}
	if strings.Join(conns, "\n") != strings.Join(want, "\n") {
		t.Errorf("connections recorded:\n%s\nwant:\n%s", strings.Join(conns, "\n"), strings.Join(want, "\n"))
	}
	m := s.metricsText(t)
	for _, line := range []string{`pysandbox_net_connections_total{decision="allow"} 1`, `pysandbox_net_connections_total{decision="approved"} 2`, `pysandbox_net_connections_total{decision="deny"} 2`, `pysandbox_net_bytes_total{direction="in"}`} {
		if !strings.Contains(m, line) {
			t.Errorf("metrics lack %s", line)
		}
	}
}

func TestNetworkApprovalWithoutMidCallAsking(t *testing.T) {
	s := newNetServer(t)
	for _, c := range []struct {
		name  string
		copts *mcp.ClientOptions
		sopts *mcp.ClientSessionOptions
		want  string
	}{
		{"no elicitation", nil, &mcp.ClientSessionOptions{ProtocolVersion: "2025-06-18"}, "this client cannot ask its user"},
		{"latest protocol", &mcp.ClientOptions{ElicitationHandler: (&elicitor{action: "accept"}).handler}, nil, "cannot ask the user in the middle of a call"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cs := s.connect(c.copts, c.sopts)
			res, out := call(t, cs, "run_python", map[string]any{"code": fetch("https://"+s.host.TLSName+"/", s.host.CAPEM)})
			if rv, _ := out["return_value"].(string); !strings.Contains(rv, c.want) || !strings.Contains(rv, "ask the user to allow example.com") {
				t.Errorf("%s", text(res))
			}
		})
	}
}

func TestNetworkInSession(t *testing.T) {
	s := newNetServer(t)
	el := &elicitor{action: "accept"}
	cs := s.connect(&mcp.ClientOptions{ElicitationHandler: el.handler}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-06-18"})
	id := newSession(t, cs)
	for i := 0; i < 2; i++ {
		res, out := call(t, cs, "run_python", map[string]any{"session_id": id, "code": fetch("https://"+s.host.TLSName+"/s", s.host.CAPEM)})
		if out["return_value"] != "hello from "+s.host.TLSName {
			t.Fatalf("run %d in the session: %s", i, text(res))
		}
		// The per-run connection limit starts over with each call.
		if n, _ := out["network"].(map[string]any); n == nil || n["connections"] != float64(1) {
			t.Errorf("run %d usage: %v", i, out["network"])
		}
	}
	// The approval holds for the session's life.
	if n := len(el.asked()); n != 1 {
		t.Errorf("asked %d times", n)
	}
	// A connection's record is written when the proxy is done with it,
	// which may be just after the call's result: wait for both (a guard
	// against a hang, not a timing).
	callIDs := map[string]bool{}
	for deadline := time.Now().Add(time.Minute); len(callIDs) < 2 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		callIDs = map[string]bool{}
		for _, r := range s.records(t) {
			if r.Event == "connect" {
				if r.Net.Session != id {
					t.Fatalf("connect record without its session: %+v", r.Net)
				}
				callIDs[r.CallID] = true
			}
		}
	}
	if len(callIDs) != 2 {
		t.Errorf("the session's connections are recorded under %d calls, want 2", len(callIDs))
	}
}

// TestNetworkRefusalFloodIsSummarized has a run open hundreds of refused
// connections: the audit log gets a bounded number of records for the
// call, the last of them counting the rest, and the metrics count all.
func TestNetworkRefusalFloodIsSummarized(t *testing.T) {
	s := newNetServer(t)
	cs := s.connect(nil, nil)
	const flood = 400
	res, out := call(t, cs, "run_python", map[string]any{"code": fmt.Sprintf(`
import socket
answers = set()
for i in range(%d):
    c = socket.create_connection(("127.0.0.1", 3128), timeout=20)
    c.sendall(b"CONNECT evil.test:443 HTTP/1.1\r\n\r\n")
    answers.add(c.recv(12))
    c.close()
sorted(answers)`, flood)})
	if rv := fmt.Sprint(out["return_value"]); !strings.Contains(rv, "HTTP/1.1 403") || strings.Contains(rv, ",") {
		t.Fatalf("flood: %s", text(res))
	}
	var conns []audit.Record
	for _, r := range s.records(t) {
		if r.Event == "connect" {
			conns = append(conns, r)
		}
	}
	if len(conns) > 100 || len(conns) < 2 {
		t.Fatalf("%d connect records for %d refusals", len(conns), flood)
	}
	sum := conns[len(conns)-1]
	if sum.Net == nil || sum.Net.Unrecorded["deny"] != flood-(len(conns)-1) || sum.CallID != conns[0].CallID || !strings.Contains(sum.Reason, "have no record of their own") {
		t.Errorf("summary record %+v (%+v)", sum, sum.Net)
	}
	if m := s.metricsText(t); !strings.Contains(m, fmt.Sprintf(`pysandbox_net_connections_total{decision="deny"} %d`, flood)) {
		t.Errorf("metrics count every refusal:\n%s", m)
	}
}
