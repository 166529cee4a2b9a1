package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/cluster"
	"github.com/pysandbox/pysandbox/internal/sharedstate"
	"github.com/pysandbox/pysandbox/internal/testutil/redisserver"
)

var quiet = slog.New(slog.DiscardHandler)

func store(t *testing.T, r *redisserver.Server) *sharedstate.Store {
	t.Helper()
	s, err := sharedstate.Open(context.Background(), r.URL(), sharedstate.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

var key = []byte("0123456789abcdef0123456789abcdef")

func join(t *testing.T, st *sharedstate.Store, name, url string) *cluster.Cluster {
	t.Helper()
	c, err := cluster.Join(context.Background(), st.Directory(), name, url, url, key, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Leave)
	return c
}

// TestOwner: ids name their owner; an owner that left is lost at once,
// one that vanished after a grace, one of another incarnation at once;
// ids of no owner are local.
func TestOwner(t *testing.T) {
	r := redisserver.Start(t)
	st := store(t, r)
	a := join(t, st, "replica-a", "http://127.0.0.1:1")
	b := join(t, st, "replica-b", "http://127.0.0.1:2")
	ctx := context.Background()
	sid := "s-0011" + a.SessionSuffix()
	if _, local, err := a.Owner(ctx, sid, false); !local || err != nil {
		t.Errorf("its own session: %v %v", local, err)
	}
	m, local, err := b.Owner(ctx, sid, false)
	if local || err != nil || m.Name != "replica-a" {
		t.Errorf("a's session from b: %+v %v %v", m, local, err)
	}
	m, local, err = b.Owner(ctx, a.NewMCPSessionID(), true)
	if local || err != nil || m.Name != "replica-a" {
		t.Errorf("a's MCP session from b: %+v %v %v", m, local, err)
	}
	for _, id := range []string{"s-00112233", "", "a.b", "s-x.y.z.w"} {
		if _, local, _ := b.Owner(ctx, id, false); !local {
			t.Errorf("%q names no owner: it is local", id)
		}
	}
	// Another incarnation of a live name: lost at once.
	if _, _, err := b.Owner(ctx, "s-0011.replica-a.deadbeef", false); !errors.Is(err, cluster.ErrLost) {
		t.Errorf("an old incarnation: %v", err)
	}
	// A name never listed: retry at first, lost after the grace.
	if _, _, err := b.Owner(ctx, "s-0011.replica-z.deadbeef", false); !errors.Is(err, cluster.ErrUnreachable) {
		t.Errorf("a missing owner, at first: %v", err)
	}
	time.Sleep(cluster.MissingGrace + 100*time.Millisecond)
	if _, _, err := b.Owner(ctx, "s-0011.replica-z.deadbeef", false); !errors.Is(err, cluster.ErrLost) {
		t.Errorf("a missing owner, after the grace: %v", err)
	}
	// An owner that left: lost at once.
	a.Leave()
	if _, _, err := b.Owner(ctx, sid, false); !errors.Is(err, cluster.ErrLost) {
		t.Errorf("after its owner left: %v", err)
	}
}

// TestForgedDirectoryEntry: an entry not signed with the replicas' token
// (anyone who can write the store) is ignored: no request, and no token,
// goes to its address.
func TestForgedDirectoryEntry(t *testing.T) {
	r := redisserver.Start(t)
	st := store(t, r)
	b := join(t, st, "replica-b", "http://127.0.0.1:2")
	hit := make(chan string, 10)
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hit <- r.Header.Get("Authorization") }))
	defer evil.Close()
	forged := cluster.Member{Name: "evil", Incarnation: "1234", MCP: evil.URL, Internal: evil.URL, Sig: strings.Repeat("0", 64)}
	if err := st.Directory().Register(context.Background(), forged, time.Minute); err != nil {
		t.Fatal(err)
	}
	if members, _ := b.Members(context.Background()); len(members) != 1 || members[0].Name != "replica-b" {
		t.Errorf("members %+v", members)
	}
	if _, _, err := b.Owner(context.Background(), "s-00.evil.1234", false); err == nil {
		t.Error("a forged owner was taken")
	}
	// The proxy does not send the request there either.
	front := httptest.NewServer(b.Proxy(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "local") })))
	defer front.Close()
	req, _ := http.NewRequest("POST", front.URL+"/mcp", strings.NewReader("{}"))
	req.Header.Set("Mcp-Session-Id", "evil.1234.XYZ")
	req.Header.Set("Authorization", "Bearer secret-of-a-user")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	select {
	case h := <-hit:
		t.Errorf("the forged address got a request (Authorization %q)", h)
	case <-time.After(200 * time.Millisecond):
	}
	if resp.StatusCode == http.StatusOK {
		t.Errorf("status %d", resp.StatusCode)
	}
}

// TestProxy: a request of another replica's MCP session goes to it whole;
// one of a replica that left gets 404 with a message.
func TestProxy(t *testing.T) {
	r := redisserver.Start(t)
	st := store(t, r)
	got := make(chan *http.Request, 1)
	owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r
		io.WriteString(w, "from the owner")
	}))
	defer owner.Close()
	a := join(t, st, "replica-a", owner.URL)
	b := join(t, st, "replica-b", "http://127.0.0.1:2")
	front := httptest.NewServer(b.Proxy(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "local") })))
	defer front.Close()
	id := a.NewMCPSessionID()
	req, _ := http.NewRequest("POST", front.URL+"/mcp", strings.NewReader(`{"jsonrpc":"2.0"}`))
	req.Header.Set("Mcp-Session-Id", id)
	req.Header.Set("Authorization", "Bearer alice")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "from the owner" {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	fwd := <-got
	if fwd.Header.Get("Authorization") != "Bearer alice" || fwd.Header.Get("Mcp-Session-Id") != id || fwd.URL.Path != "/mcp" {
		t.Errorf("forwarded %v %v", fwd.URL, fwd.Header)
	}
	a.Leave()
	resp, err = http.DefaultClient.Do(req.Clone(context.Background()))
	if err == nil {
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	if err != nil || resp.StatusCode != http.StatusNotFound || !strings.Contains(string(body), "lost when its server stopped") {
		t.Errorf("after its owner left: %v %d %s", err, resp.StatusCode, body)
	}
}

// TestRoute: Route answers as Owner does, and remembers only live owners,
// by owner: a call through a remembered route still carries its own
// caller, and the owner, which decides whose a session is, refuses
// another caller's call on it. The memory is bounded whatever the store
// lists, is not used once forgotten (Unroute), and ids a forged entry
// names are not routed. An owner stops serving a session it handed over,
// and every session once it leaves (Serves), so a call routed from memory
// is not served there then.
func TestRoute(t *testing.T) {
	const token = "0123456789abcdef0123456789abcdef-replicas"
	r := redisserver.Start(t)
	st := store(t, r)
	// The owner's internal endpoint: a real MCP server that, as a
	// replica's does, serves a session to the caller who made it only.
	owner := mcp.NewServer(&mcp.Implementation{Name: "pysandbox-internal", Version: "1"}, nil)
	owner.AddTool(&mcp.Tool{Name: "run_python", InputSchema: map[string]any{"type": "object"}}, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if id, _ := req.Params.GetMeta()[cluster.MetaIdentity].(string); id != "alice" {
			return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "Unknown session"}}}, nil
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "42"}}}, nil
	})
	mux := http.NewServeMux()
	mux.Handle(cluster.InternalPath, cluster.InternalAuth(token, mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return owner }, &mcp.StreamableHTTPOptions{Stateless: true})))
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	a := join(t, st, "replica-a", hs.URL)
	b := join(t, st, "replica-b", "http://127.0.0.1:2")
	// Remembered routes stay for the whole test, however slow the machine.
	b.RouteFor(time.Hour)
	f := b.NewForwarder(token)
	t.Cleanup(f.Close)
	ctx := context.Background()
	sid := "s-0011" + a.SessionSuffix()

	if _, local, err := a.Route(ctx, sid); !local || err != nil {
		t.Errorf("its own session: %v %v", local, err)
	}
	call := func(who string) string {
		t.Helper()
		m, local, err := b.Route(ctx, sid)
		if local || err != nil || m.Tag() != a.Self().Tag() {
			t.Fatalf("a's session from b: %+v %v %v", m, local, err)
		}
		res, err := f.Call(ctx, m, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"session_id": sid}}, who, "call", 1)
		if err != nil {
			t.Fatal(err)
		}
		return res.Content[0].(*mcp.TextContent).Text
	}
	if got := call("alice"); got != "42" {
		t.Errorf("alice's call: %s", got)
	}
	if b.Routes() != 1 {
		t.Errorf("%d routes remembered, want a's", b.Routes())
	}
	// Bob's call goes by the route alice's call left, as bob's.
	if got := call("bob"); got != "Unknown session" {
		t.Errorf("bob's call on alice's session through a remembered route: %s", got)
	}

	// Ids of no live owner are Owner's answers, and not remembered.
	if _, _, err := b.Route(ctx, "s-0011.replica-a.deadbeef"); !errors.Is(err, cluster.ErrLost) {
		t.Errorf("an old incarnation: %v", err)
	}
	forged := cluster.Member{Name: "evil", Incarnation: "12345678", MCP: "http://127.0.0.1:9", Internal: "http://127.0.0.1:9", Expires: time.Now().Add(time.Hour).UnixMilli(), Sig: strings.Repeat("0", 64)}
	if err := st.Directory().Register(ctx, forged, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Route(ctx, "s-00.evil.12345678"); err == nil {
		t.Error("a forged owner was routed to")
	}
	if b.Routes() != 1 {
		t.Errorf("%d routes remembered, want a's only", b.Routes())
	}

	// The owner serves its sessions until it hands one over, and none
	// once it begins to leave.
	handed := "s-0022" + a.SessionSuffix()
	if !a.Serves(sid) || !a.Serves(handed) {
		t.Error("a does not serve its own sessions")
	}
	a.HandedOver(handed, "replica-b")
	if a.Serves(handed) || !a.Serves(sid) {
		t.Errorf("after handing one over: serves it %v, serves the other %v", a.Serves(handed), a.Serves(sid))
	}

	// Forgotten, the route is asked of the store again: a left.
	a.Leave()
	if a.Serves(sid) {
		t.Error("a serves a session after it left")
	}
	b.Unroute(a.Self())
	if _, _, err := b.Route(ctx, sid); !errors.Is(err, cluster.ErrLost) {
		t.Errorf("after its owner left and the route was forgotten: %v", err)
	}

	// Bounded: more live owners than it remembers.
	for i := range cluster.MaxRoutes + 20 {
		m := cluster.SignMember(key, cluster.Member{Name: fmt.Sprintf("replica-%d", i), Incarnation: "0badcafe", MCP: "http://127.0.0.1:3", Internal: "http://127.0.0.1:3"}, time.Minute)
		if err := st.Directory().Register(ctx, m, time.Minute); err != nil {
			t.Fatal(err)
		}
		if _, _, err := b.Route(ctx, "s-00."+m.Tag()); err != nil {
			t.Fatalf("a live owner: %v", err)
		}
	}
	if n := b.Routes(); n > cluster.MaxRoutes {
		t.Errorf("%d routes remembered, more than %d", n, cluster.MaxRoutes)
	}

	// A remembered route is answered without the store; forgotten, it
	// needs the store again.
	last := fmt.Sprintf("s-00.replica-%d.0badcafe", cluster.MaxRoutes+19)
	r.Stop()
	m, _, err := b.Route(ctx, last)
	if err != nil {
		t.Fatalf("a remembered route with the store down: %v", err)
	}
	b.Unroute(m)
	if _, _, err := b.Route(ctx, last); err == nil || errors.Is(err, cluster.ErrLost) {
		t.Errorf("a forgotten route with the store down: %v", err)
	}
}
