package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/redis/go-redis/v9"

	"github.com/pysandbox/pysandbox/internal/testutil"
	"github.com/pysandbox/pysandbox/internal/testutil/redisserver"
)

// replicaSet starts n replicas of `serve --http --store --internal-http`
// on one Redis, with tokens for alice and bob.
type replicaSet struct {
	urls     []string
	internal []string // each replica's internal endpoint
	cmds     []*exec.Cmd
	logs     []*testutil.SyncBuffer
	store    string
	redis    *redisserver.Server
	token    string // the replicas' token file
	// addrs and args are each replica's address and flags, to start it
	// again (restart).
	addrs []string
	args  [][]string
}

func startReplicas(t *testing.T, n int, extra ...string) *replicaSet {
	return startReplicasEach(t, n, func(int) []string { return extra })
}

// startReplicasEach gives each replica i the flags each(i) too.
func startReplicasEach(t *testing.T, n int, each func(i int) []string) *replicaSet {
	t.Helper()
	r := redisserver.Start(t)
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	os.WriteFile(tokens, []byte("alice alice-0123456789abcdef\nbob bob-0123456789abcdef00\n"), 0o600)
	replicaToken := filepath.Join(dir, "replica-token")
	os.WriteFile(replicaToken, []byte("0123456789abcdef0123456789abcdef-replicas\n"), 0o600)
	key := filepath.Join(dir, "approval.key")
	os.WriteFile(key, []byte("00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n"), 0o600)
	rs := &replicaSet{store: r.URL(), redis: r, token: replicaToken}
	for i := 0; i < n; i++ {
		addr := freePort(t)
		// The internal port is the kernel's pick (a second freePort could
		// race with other tests for the same number); the log says it.
		args := append([]string{"--store", r.URL(), "--internal-http", "127.0.0.1:0", "--advertise", "127.0.0.1", "--log-level", "info",
			"--replica", fmt.Sprintf("replica-%d", i), "--replica-token-file", replicaToken, "--auth-token-file", tokens,
			"--approval-key-file", key, "--pool-size", "1"}, each(i)...)
		rs.addrs = append(rs.addrs, addr)
		rs.args = append(rs.args, args)
		rs.internal = append(rs.internal, "")
		rs.urls = append(rs.urls, "http://"+addr)
		rs.cmds = append(rs.cmds, nil)
		rs.logs = append(rs.logs, nil)
		rs.restart(t, i)
	}
	return rs
}

// restart starts replica i (again, once it stopped: a new incarnation of
// the same name), with the same address and flags.
func (rs *replicaSet) restart(t *testing.T, i int) {
	t.Helper()
	cmd, log := startServe(t, rs.addrs[i], rs.urls[i], nil, rs.args[i]...)
	m := regexp.MustCompile(`internal=(http://127\.0\.0\.1:[0-9]+)`).FindStringSubmatch(log.String())
	if m == nil {
		t.Fatalf("the replica did not log its internal endpoint:\n%s", log.String())
	}
	rs.internal[i], rs.cmds[i], rs.logs[i] = m[1], cmd, log
}

func toolText(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, t.Text)
		}
	}
	return strings.Join(parts, "\n")
}

func callTool(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) (*mcp.CallToolResult, map[string]any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	out, _ := res.StructuredContent.(map[string]any)
	return res, out
}

// pinned sends every request to target, whatever URL the client uses:
// a client whose MCP session began at one replica and whose later
// requests land on another (a load balancer without affinity).
type pinned struct {
	target *url.URL
	base   http.RoundTripper
}

func (p pinned) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.URL.Host = p.target.Host
	return p.base.RoundTrip(r)
}

// TestReplicas: two replicas on one Redis serve as one: a session made
// through one is used through the other, stays private to its owner's
// caller, and is listed through either; an MCP session that began at one
// replica goes on through the other; a replica killed makes its sessions
// answer "lost" within seconds; a replica told to stop lets its run in
// flight finish and takes no new session.
func TestReplicas(t *testing.T) {
	rs := startReplicas(t, 2)
	ctx := context.Background()
	alice0 := connectHTTP(ctx, t, rs.urls[0], "alice-0123456789abcdef")
	alice1 := connectHTTP(ctx, t, rs.urls[1], "alice-0123456789abcdef")
	bob1 := connectHTTP(ctx, t, rs.urls[1], "bob-0123456789abcdef00")

	_, out := callTool(t, alice0, "create_session", nil)
	id, _ := out["session_id"].(string)
	if !strings.Contains(id, ".replica-0.") {
		t.Fatalf("session id %q does not name its replica", id)
	}
	callTool(t, alice0, "run_python", map[string]any{"session_id": id, "code": "x = 41"})
	res, out := callTool(t, alice1, "run_python", map[string]any{"session_id": id, "code": "x + 1"})
	if out["return_value"] != float64(42) {
		t.Fatalf("the session through the other replica: %s", toolText(res))
	}
	res, _ = callTool(t, alice1, "upload_file", map[string]any{"session_id": id, "path": "a.txt", "content": "hello"})
	if res.IsError {
		t.Fatalf("upload through the other replica: %s", toolText(res))
	}
	res, out = callTool(t, alice0, "run_python", map[string]any{"session_id": id, "code": "open('a.txt').read()"})
	if out["return_value"] != "hello" {
		t.Errorf("the file: %s", toolText(res))
	}
	// Privacy is decided by the owner, for the caller the call came from.
	res, _ = callTool(t, bob1, "run_python", map[string]any{"session_id": id, "code": "x"})
	if !res.IsError || !strings.Contains(toolText(res), "Unknown session") {
		t.Errorf("bob used alice's session: %s", toolText(res))
	}
	// An upload larger than the SDK's default request bound, through the
	// other replica.
	big := strings.Repeat("x", 5<<20)
	res, _ = callTool(t, alice1, "upload_file", map[string]any{"session_id": id, "path": "big.txt", "content": big})
	if res.IsError {
		t.Errorf("a 5 MiB upload through the other replica: %.300s", toolText(res))
	}
	// The internal endpoint: only the replicas' token, and only calls on
	// a session.
	for _, c := range []struct{ token, want string }{
		{"", "Unauthorized"}, {"alice-0123456789abcdef", "Unauthorized"},
		{"0123456789abcdef0123456789abcdef-replicas", "must name a session"},
	} {
		cl := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
		ics, err := cl.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: rs.internal[0] + "/internal/mcp", HTTPClient: &http.Client{Transport: testutil.Bearer(c.token, nil)}}, nil)
		if err != nil {
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("token %q: %v", c.token, err)
			}
			continue
		}
		res, err := ics.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "1"}, Meta: mcp.Meta{"pysandbox/identity": "alice"}})
		if err != nil || !strings.Contains(toolText(res), c.want) {
			t.Errorf("token %q: %v %v", c.token, err, res)
		}
		ics.Close()
	}
	_, out = callTool(t, alice1, "list_sessions", nil)
	if ss, _ := out["sessions"].([]any); len(ss) != 1 {
		t.Errorf("alice's sessions through the other replica: %v", out)
	}
	_, out = callTool(t, bob1, "list_sessions", nil)
	if ss, _ := out["sessions"].([]any); len(ss) != 0 {
		t.Errorf("bob's sessions: %v", out)
	}

	// The clients above speak the sessionless 2026-07-28 protocol; this
	// one the sessionful 2025-06-18: an MCP session begun at replica 0, its
	// later requests sent to 1.
	target, _ := url.Parse(rs.urls[1])
	client := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	sw := &switchable{to: target}
	hc := &http.Client{Transport: testutil.Bearer("alice-0123456789abcdef", sw)}
	moving, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: rs.urls[0] + "/mcp", HTTPClient: hc}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-06-18"})
	if err != nil {
		t.Fatal(err)
	}
	defer moving.Close()
	if !strings.HasPrefix(moving.ID(), "replica-0.") {
		t.Fatalf("MCP session id %q does not name its replica", moving.ID())
	}
	sw.Switch()
	res, out = callTool(t, moving, "run_python", map[string]any{"session_id": id, "code": "x * 2"})
	if out["return_value"] != float64(82) {
		t.Errorf("through a moved MCP session: %s", toolText(res))
	}

	// Replica 0 dies: its sessions are lost, said so within seconds.
	rs.cmds[0].Process.Signal(syscall.SIGKILL)
	start := time.Now()
	for {
		res, _ = callTool(t, alice1, "run_python", map[string]any{"session_id": id, "code": "x"})
		if strings.Contains(toolText(res), "lost when its server stopped") {
			break
		}
		if time.Since(start) > time.Minute {
			t.Fatalf("no clear answer a minute after the owner died: %s", toolText(res))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("the session was reported lost %v after its replica died", time.Since(start).Round(time.Millisecond))
	if _, err := moving.CallTool(ctx, &mcp.CallToolParams{Name: "list_sessions", Arguments: map[string]any{}}); err == nil {
		t.Error("the MCP session of the dead replica still answers")
	}
}

// TestReplicaResources: resources/read of a session's files and of a
// one-shot run's figure links is served through either replica, for the
// caller who owns them; another caller gets "Resource not found" through
// either, exactly as for a resource that does not exist. Nothing a client
// gets back through the other replica names the internal endpoint.
func TestReplicaResources(t *testing.T) {
	rs := startReplicas(t, 2)
	ctx := context.Background()
	alice := []*mcp.ClientSession{connectHTTP(ctx, t, rs.urls[0], "alice-0123456789abcdef"), connectHTTP(ctx, t, rs.urls[1], "alice-0123456789abcdef")}
	bob := []*mcp.ClientSession{connectHTTP(ctx, t, rs.urls[0], "bob-0123456789abcdef00"), connectHTTP(ctx, t, rs.urls[1], "bob-0123456789abcdef00")}
	// A client of the sessionful protocol too, whose MCP session is the
	// other replica's own (so only the resource's owner routes it).
	client := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	old, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: rs.urls[1] + "/mcp", HTTPClient: &http.Client{Transport: testutil.Bearer("alice-0123456789abcdef", nil)}}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-06-18"})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()

	// Everything that came back through replica 1 from replica 0, checked
	// at the end for what is internal.
	var forwarded []any
	_, out := callTool(t, alice[0], "create_session", nil)
	id, _ := out["session_id"].(string)
	if !strings.Contains(id, ".replica-0.") {
		t.Fatalf("session id %q does not name its replica", id)
	}
	res, _ := callTool(t, alice[1], "upload_file", map[string]any{"session_id": id, "path": "notes/hello.txt", "content": "hello from alice"})
	forwarded = append(forwarded, res)
	// Larger than download_file returns inline (1 MiB): a link.
	res, _ = callTool(t, alice[1], "run_python", map[string]any{"session_id": id, "code": "open('big.bin', 'wb').write(bytes(range(256)) * 8192)"})
	forwarded = append(forwarded, res)
	res, out = callTool(t, alice[1], "download_file", map[string]any{"session_id": id, "path": "big.bin"})
	forwarded = append(forwarded, res)
	bigURI := ""
	for _, c := range res.Content {
		if l, ok := c.(*mcp.ResourceLink); ok {
			bigURI = l.URI
		}
	}
	if bigURI == "" || out["inline"] != false {
		t.Fatalf("download_file of a 2 MiB file through the other replica gave no link: %s", toolText(res))
	}
	res, _ = callTool(t, alice[1], "list_files", map[string]any{"session_id": id})
	forwarded = append(forwarded, res)

	// A one-shot run at replica 0 whose figures do not all fit the reply
	// (4 MiB): the rest are links into replica 0's memory.
	figs := "import matplotlib.pyplot as plt, numpy as np\nrng = np.random.default_rng(1)\n" +
		"for i in range(12):\n    plt.figure(figsize=(6, 4), dpi=100)\n    plt.imshow(rng.random((400, 600)), interpolation='nearest')\n"
	res, _ = callTool(t, alice[0], "run_python", map[string]any{"code": figs})
	figURI := ""
	for _, c := range res.Content {
		if l, ok := c.(*mcp.ResourceLink); ok {
			figURI = l.URI
		}
	}
	if !strings.HasPrefix(figURI, "pysandbox://figures/") || !strings.Contains(figURI, ".replica-0.") {
		t.Fatalf("no figure link naming its replica: %q (%s)", figURI, toolText(res))
	}

	smallURI := "pysandbox://sessions/" + id + "/files/notes%2Fhello.txt"
	read := func(cs *mcp.ClientSession, uri string) (*mcp.ReadResourceResult, error) {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		return cs.ReadResource(rctx, &mcp.ReadResourceParams{URI: uri})
	}
	for name, cs := range map[string]*mcp.ClientSession{"2026-07-28": alice[1], "2025-06-18": old} {
		rr, err := read(cs, smallURI)
		if err != nil || len(rr.Contents) != 1 || rr.Contents[0].Text != "hello from alice" {
			t.Fatalf("%s: the small file through the other replica: %v %+v", name, err, rr)
		}
		forwarded = append(forwarded, rr)
		rr, err = read(cs, bigURI)
		if err != nil || len(rr.Contents) != 1 || len(rr.Contents[0].Blob) != 2<<20 || rr.Contents[0].Blob[257] != 1 {
			t.Fatalf("%s: the large file's link through the other replica: %v", name, err)
		}
		forwarded = append(forwarded, rr)
		rr, err = read(cs, figURI)
		if err != nil || len(rr.Contents) != 1 || rr.Contents[0].MIMEType != "image/png" || !strings.HasPrefix(string(rr.Contents[0].Blob), "\x89PNG") {
			t.Fatalf("%s: the figure through the other replica: %v", name, err)
		}
		forwarded = append(forwarded, rr)
	}
	if rr, err := read(alice[0], figURI); err != nil || len(rr.Contents) != 1 {
		t.Errorf("the figure at its own replica: %v", err)
	}

	// Bob knows the links but owns none of it: through either replica he
	// gets what anyone gets for a resource that does not exist.
	notFound := func(err error) bool {
		var we *jsonrpc.Error
		return errors.As(err, &we) && we.Code == jsonrpc.CodeInvalidParams && we.Message == "Resource not found"
	}
	for _, uri := range []string{"pysandbox://sessions/" + id + "/files/missing.txt", "pysandbox://figures/00112233445566778899aabbccddeeff" + strings.TrimPrefix(id, strings.Split(id, ".")[0]) + ".png"} {
		if _, err := read(alice[1], uri); !notFound(err) {
			t.Errorf("%s, which does not exist: %v", uri, err)
		}
	}
	for i, cs := range bob {
		for _, uri := range []string{smallURI, bigURI, figURI} {
			if _, err := read(cs, uri); !notFound(err) {
				t.Errorf("bob read %s through replica %d: %v", uri, i, err)
			}
		}
	}

	// Forwarded tool results too, and an error of the owner's.
	res, _ = callTool(t, alice[1], "run_python", map[string]any{"session_id": id, "code": "1 + 1"})
	forwarded = append(forwarded, res)
	res, _ = callTool(t, bob[1], "download_file", map[string]any{"session_id": id, "path": "big.bin"})
	forwarded = append(forwarded, res)
	for i, r := range forwarded {
		data, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		for _, internal := range []string{"pysandbox-internal", "/internal/mcp", strings.TrimPrefix(rs.internal[0], "http://")} {
			if strings.Contains(string(data), internal) {
				t.Errorf("forwarded result %d names %q: %.400s", i, internal, data)
			}
		}
	}
	// The sessionless protocol's results name their server: the one the
	// client talks to.
	for _, r := range forwarded {
		var meta mcp.Meta
		switch r := r.(type) {
		case *mcp.CallToolResult:
			meta = r.Meta
		case *mcp.ReadResourceResult:
			meta = r.Meta
		}
		if info, ok := meta["io.modelcontextprotocol/serverInfo"].(map[string]any); ok && info["name"] != "pysandbox" {
			t.Errorf("a forwarded result names the server %v", info["name"])
		}
	}
	if info, _ := forwarded[0].(*mcp.CallToolResult).Meta["io.modelcontextprotocol/serverInfo"].(map[string]any); info["name"] != "pysandbox" {
		t.Errorf("a forwarded result does not name the public server: %v", forwarded[0].(*mcp.CallToolResult).Meta)
	}
}

// switchable sends requests where they are addressed until Switch, then
// all to another replica.
type switchable struct {
	to       *url.URL
	switched atomic.Bool
}

func (s *switchable) Switch() { s.switched.Store(true) }

func (s *switchable) RoundTrip(r *http.Request) (*http.Response, error) {
	if s.switched.Load() {
		return pinned{target: s.to, base: http.DefaultTransport}.RoundTrip(r)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// TestReplicaDrain: SIGTERM makes a replica unready, refuses new
// sessions, and lets the run in flight finish.
func TestReplicaDrain(t *testing.T) {
	auditLog := filepath.Join(t.TempDir(), "audit.log")
	rs := startReplicas(t, 1, "--audit-log", auditLog)
	ctx := context.Background()
	cs := connectHTTP(ctx, t, rs.urls[0], "alice-0123456789abcdef")
	// A session's run: the drain waits for calls, not only for the pool.
	_, out := callTool(t, cs, "create_session", nil)
	done := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, _ := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"session_id": out["session_id"], "code": "import time\ntime.sleep(3)\n'finished'"}})
		done <- res
	}()
	time.Sleep(time.Second)
	rs.cmds[0].Process.Signal(syscall.SIGTERM)
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(rs.urls[0] + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusServiceUnavailable {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz still ready while draining: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	res, _ := cs.CallTool(ctx, &mcp.CallToolParams{Name: "create_session", Arguments: map[string]any{}})
	if res == nil || !res.IsError || !strings.Contains(toolText(res), "shutting down") {
		t.Errorf("a session while draining: %+v", res)
	}
	select {
	case res := <-done:
		if res == nil || res.IsError || !strings.Contains(toolText(res), "finished") {
			t.Errorf("the run in flight: %+v", res)
		}
	case <-time.After(time.Minute):
		t.Fatal("the run in flight did not finish")
	}
	waitExit(t, rs.cmds[0])
	data, _ := os.ReadFile(auditLog)
	if !strings.Contains(string(data), `"tool":"run_python"`) || !strings.Contains(string(data), "finished") && !strings.Contains(string(data), `"status":"success"`) {
		t.Errorf("the run in flight has no audit record:\n%s", data)
	}
}

// TestReplicaAuditChains: each replica keeps its own chain and anchors its
// head in the store; `audit verify --store` passes over all the chains,
// and fails for a chain cut short or one left out.
func TestReplicaAuditChains(t *testing.T) {
	dir := t.TempDir()
	logs := []string{filepath.Join(dir, "a.log"), filepath.Join(dir, "b.log")}
	rs := startReplicasEach(t, 2, func(i int) []string { return []string{"--audit-log", logs[i]} })
	ctx := context.Background()
	for i, u := range rs.urls {
		cs := connectHTTP(ctx, t, u, "alice-0123456789abcdef")
		for j := 0; j <= i; j++ {
			callTool(t, cs, "run_python", map[string]any{"code": "print(1)"})
		}
		cs.Close()
	}
	// A clean stop anchors the last head.
	for _, cmd := range rs.cmds {
		cmd.Process.Signal(syscall.SIGTERM)
		waitExit(t, cmd)
	}
	verify := func(chains ...string) (string, string, int) {
		return runBin(t, "", append([]string{"audit", "verify", "--store", rs.store, "--replica-token-file", rs.token}, chains...)...)
	}
	out, errOut, code := verify(logs[0], logs[1])
	if code != 0 || !strings.Contains(out, "ok: 2 chains match their anchors") || !strings.Contains(out, "replica-0: the anchored head matches (seq ") {
		t.Fatalf("audit verify --store: %d\n%s%s", code, out, errOut)
	}
	_, errOut, code = verify(logs[0])
	if code == 0 || !strings.Contains(errOut, "no chain was given for replica-1") {
		t.Errorf("a chain left out: %d %s", code, errOut)
	}
	// Its anchor deleted too: the other replica's anchor still names it.
	raw := redis.NewClient(&redis.Options{Addr: rs.redis.Addr})
	defer raw.Close()
	saved, err := raw.HGet(ctx, "{pysandbox}:audit-anchors", "replica-1").Result()
	if err != nil {
		t.Fatal(err)
	}
	raw.HDel(ctx, "{pysandbox}:audit-anchors", "replica-1")
	_, errOut, code = verify(logs[0])
	if code != 1 || !strings.Contains(errOut, "replica replica-1 has no anchor in the store, but the anchors of replica-0 name it") {
		t.Errorf("a chain left out, its anchor deleted: %d %s", code, errOut)
	}
	raw.HSet(ctx, "{pysandbox}:audit-anchors", "replica-1", saved)
	data, _ := os.ReadFile(logs[1])
	lines := strings.SplitAfter(string(data), "\n")
	os.WriteFile(logs[1], []byte(strings.Join(lines[:len(lines)-2], "")), 0o600)
	_, errOut, code = verify(logs[0], logs[1])
	if code == 0 || !strings.Contains(errOut, "cut from its end") {
		t.Errorf("a chain cut short: %d %s", code, errOut)
	}
	// And its anchor replaced by one of the shorter head, not signed.
	rep := lines[len(lines)-3]
	seq := regexp.MustCompile(`^\{"seq":([0-9]+),`).FindStringSubmatch(rep)
	hash := regexp.MustCompile(`"hash":"([0-9a-f]{64})"\}`).FindStringSubmatch(rep)
	if seq == nil || hash == nil {
		t.Fatalf("the last line left: %s", rep)
	}
	raw.HSet(ctx, "{pysandbox}:audit-anchors", "replica-1", fmt.Sprintf(`{"seq":%s,"head":%q}`, seq[1], hash[1]))
	_, errOut, code = verify(logs[0], logs[1])
	if code != 1 || !strings.Contains(errOut, "the audit anchor of replica-1 in the store: the anchor is not signed") {
		t.Errorf("a forged anchor of the shorter head: %d %s", code, errOut)
	}
}

// TestReplicaForgedGoneMarker: a gone marker written into the store by
// anyone but the replica (here unsigned) does not make a live replica's
// session answer "lost" through the other; it is logged and ignored.
func TestReplicaForgedGoneMarker(t *testing.T) {
	rs := startReplicas(t, 2)
	ctx := context.Background()
	alice0 := connectHTTP(ctx, t, rs.urls[0], "alice-0123456789abcdef")
	alice1 := connectHTTP(ctx, t, rs.urls[1], "alice-0123456789abcdef")
	_, out := callTool(t, alice0, "create_session", nil)
	id, _ := out["session_id"].(string)
	_, tag, ok := strings.Cut(id, ".")
	if !ok || !strings.HasPrefix(tag, "replica-0.") {
		t.Fatalf("session id %q does not name its replica", id)
	}
	callTool(t, alice0, "run_python", map[string]any{"session_id": id, "code": "x = 41"})
	raw := redis.NewClient(&redis.Options{Addr: rs.redis.Addr})
	defer raw.Close()
	if err := raw.Set(ctx, "{pysandbox}:gone:"+tag, "1", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	// A "retry" answer (the owner's entry not refreshed in time on a
	// loaded machine) is asked again; "lost" is the failure.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		res, out := callTool(t, alice1, "run_python", map[string]any{"session_id": id, "code": "x + 1"})
		if out["return_value"] == float64(42) {
			break
		}
		if !strings.Contains(toolText(res), "retry in a few seconds") || time.Now().After(deadline) {
			t.Fatalf("the live replica's session through the other, after a forged gone marker: %s", toolText(res))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(rs.logs[1].String(), "a gone marker not signed with the replicas' token is ignored") {
		t.Errorf("no warning in the other replica's log:\n%s", rs.logs[1].String())
	}
}

// TestReplicaApprovalAcrossReplicas: on the sessionless protocol, the
// user's answer to an approval asked through one replica may come back
// through another: it is honoured there, and only once.
func TestReplicaApprovalAcrossReplicas(t *testing.T) {
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.yaml")
	os.WriteFile(pol, []byte("version: \"1\"\ndefault: allow\ntools:\n  run_python: {action: approve}\n"), 0o600)
	rs := startReplicas(t, 2, "--policy", pol)
	ctx := context.Background()
	var cs []*mcp.ClientSession
	for _, u := range rs.urls {
		client := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, &mcp.ClientOptions{
			// The test answers by hand, through the other replica.
			MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true},
			ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
				return &mcp.ElicitResult{Action: "accept"}, nil
			},
		})
		s, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: u + "/mcp", HTTPClient: &http.Client{Transport: testutil.Bearer("alice-0123456789abcdef", nil)}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if v := s.InitializeResult().ProtocolVersion; v != "2026-07-28" {
			t.Fatalf("negotiated %s", v)
		}
		cs = append(cs, s)
	}
	args := map[string]any{"code": "6 * 7"}
	res, err := cs[0].CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: args})
	if err != nil || !res.NeedsInput() || len(res.InputRequests) != 1 || res.RequestState == "" {
		t.Fatalf("the first pass should ask: %v %+v", err, res)
	}
	answers := mcp.InputResponseMap{}
	for k := range res.InputRequests {
		answers[k] = &mcp.ElicitResult{Action: "accept"}
	}
	retry := &mcp.CallToolParams{Name: "run_python", Arguments: args, InputResponses: answers, RequestState: res.RequestState}
	done, err := cs[1].CallTool(ctx, retry)
	if err != nil || done.NeedsInput() || done.IsError {
		t.Fatalf("the answer through the other replica: %v %+v", err, done)
	}
	if out, _ := done.StructuredContent.(map[string]any); out["return_value"] != float64(42) {
		t.Errorf("%v", done.StructuredContent)
	}
	// The same answer again, through either replica: asked again.
	for i := range cs {
		again, err := cs[i].CallTool(ctx, retry)
		if err != nil || !again.NeedsInput() {
			t.Errorf("a replayed approval through replica %d: %v %+v", i, err, again)
		}
	}
}

// waitExit waits until the process has exited and been reaped (by
// startServe's own Wait).
func waitExit(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for syscall.Kill(cmd.Process.Pid, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d did not exit", cmd.Process.Pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
