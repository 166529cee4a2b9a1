package tools

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/deps"
	"github.com/pysandbox/pysandbox/internal/egress"
	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/interp"
	"github.com/pysandbox/pysandbox/internal/sandbox"
	"github.com/pysandbox/pysandbox/internal/testutil/pypi"
)

// setHeartbeat shortens the heartbeat for a test.
func setHeartbeat(t testing.TB, d time.Duration) {
	old := heartbeatEvery
	heartbeatEvery = d
	t.Cleanup(func() { heartbeatEvery = old })
}

// progressLog records a client's progress notifications.
type progressLog struct {
	mu   sync.Mutex
	msgs []*mcp.ProgressNotificationParams
	// on, when set, sees each message as it comes.
	on func(string)
}

func (l *progressLog) handler(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
	l.mu.Lock()
	l.msgs = append(l.msgs, r.Params)
	on := l.on
	l.mu.Unlock()
	if on != nil {
		on(r.Params.Message)
	}
}

func (l *progressLog) all() []*mcp.ProgressNotificationParams {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*mcp.ProgressNotificationParams(nil), l.msgs...)
}

// TestHeartbeat: a run that goes quiet still sends progress, saying how
// long it has run and how much it printed, numbered in one increasing
// sequence with its live output; a call without a progress token gets
// none. The run is silent until the test has seen what it waits for, and
// then cancelled, so no timing decides the outcome.
func TestHeartbeat(t *testing.T) {
	setHeartbeat(t, 100*time.Millisecond)
	log := &progressLog{}
	seen := make(chan struct{})
	var (
		once       sync.Once
		mu         sync.Mutex
		beat, live bool
	)
	log.on = func(m string) {
		mu.Lock()
		defer mu.Unlock()
		beat = beat || strings.Contains(m, "run_python still working after") && strings.Contains(m, "output so far: 6 bytes, 1 lines")
		live = live || strings.HasPrefix(m, "stdout: hello")
		if beat && live {
			once.Do(func() { close(seen) })
		}
	}
	cs := connectWith(t, nil, nil, &mcp.ClientOptions{ProgressNotificationHandler: log.handler})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	params := &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "import time\nprint('hello', flush=True)\ntime.sleep(60)", "timeout_seconds": 60}}
	params.SetProgressToken("hb")
	done := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(ctx, params)
		done <- err
	}()
	select {
	case <-seen:
	case err := <-done:
		t.Fatalf("the call ended (%v) before a heartbeat with its output and the output itself; got %v", err, messages(log.all()))
	case <-time.After(guard):
		t.Fatalf("no heartbeat with the output within %v; got %v", guard, messages(log.all()))
	}
	cancel()
	<-done
	got := log.all()
	for i, p := range got {
		if p.ProgressToken != "hb" {
			t.Errorf("token %v", p.ProgressToken)
		}
		if i > 0 && p.Progress <= got[i-1].Progress {
			t.Errorf("progress %v after %v: %v", p.Progress, got[i-1].Progress, messages(got))
		}
	}

	// Without a token: nothing (the first call's last notices may still
	// come in).
	res, _ := call(t, cs, "run_python", map[string]any{"code": "import time\ntime.sleep(1)"})
	if res.IsError {
		t.Fatal(text(res))
	}
	for _, p := range log.all() {
		if p.ProgressToken != "hb" {
			t.Errorf("a progress notification for a call without a token: %+v", p)
		}
	}
}

// TestHeartbeatInstalls: create_session and install_package, whose
// installs can take minutes, are kept alive too: the package index holds
// each install until the client has heard a heartbeat from that tool.
func TestHeartbeatInstalls(t *testing.T) {
	setHeartbeat(t, 100*time.Millisecond)
	ix := pypi.NewIndex(t,
		pypi.Package{Name: "pysbx-gamma", Version: "2.0.0", Requires: []string{"pysbx-delta"}},
		pypi.Package{Name: "pysbx-delta", Version: "0.5.0"})
	gates := map[string]chan struct{}{"create_session": make(chan struct{}), "install_package": make(chan struct{})}
	project := map[string]string{"/simple/pysbx-delta/": "create_session", "/simple/pysbx-gamma/": "install_package"}
	var mu sync.Mutex
	opened := map[string]bool{}
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if tool, ok := project[r.URL.Path]; ok {
			select {
			case <-gates[tool]:
			case <-time.After(guard):
			}
		}
		ix.Handler().ServeHTTP(w, r)
	}))
	defer slow.Close()
	log := &progressLog{on: func(m string) {
		for tool, ch := range gates {
			if strings.HasPrefix(m, tool+" still working after") {
				mu.Lock()
				if !opened[tool] {
					opened[tool] = true
					close(ch)
				}
				mu.Unlock()
			}
		}
	}}
	cs := connectWith(t, func(c *engine.Config) {
		c.Interpreters = interp.Discover(context.Background())
		cache, err := deps.New(deps.Config{Dir: t.TempDir(), Index: deps.IndexConfig{IndexURL: slow.URL + "/simple/"}, Backend: sandbox.NewNative(), Limits: c.Limits, Network: egress.New(egress.Config{}).Installer})
		if err != nil {
			t.Fatal(err)
		}
		c.Deps = cache
	}, nil, &mcp.ClientOptions{ProgressNotificationHandler: log.handler})
	ctx := context.Background()
	p := &mcp.CallToolParams{Name: "create_session", Arguments: map[string]any{"dependencies": []any{"pysbx-delta"}}}
	p.SetProgressToken("cs")
	res, err := cs.CallTool(ctx, p)
	if err != nil || res.IsError {
		t.Fatalf("create_session: %v %s", err, text(res))
	}
	id := res.StructuredContent.(map[string]any)["session_id"].(string)
	p = &mcp.CallToolParams{Name: "install_package", Arguments: map[string]any{"session_id": id, "packages": []any{"pysbx-gamma"}}}
	p.SetProgressToken("ip")
	if res, err = cs.CallTool(ctx, p); err != nil || res.IsError {
		t.Fatalf("install_package: %v %s", err, text(res))
	}
	mu.Lock()
	defer mu.Unlock()
	if !opened["create_session"] || !opened["install_package"] {
		t.Fatalf("heartbeats: %v", messages(log.all()))
	}
	for _, m := range log.all() {
		if strings.Contains(m.Message, "still working") && strings.Contains(m.Message, "output so far") {
			t.Errorf("an install's heartbeat counts output: %q", m.Message)
		}
	}
}

func messages(ps []*mcp.ProgressNotificationParams) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Message)
	}
	return out
}

// BenchmarkHeartbeat: what the heartbeat adds to a trivial run that
// carries a progress token, against the same run with the heartbeat off,
// interleaved in one loop (the machine's speed drifts between runs);
// reported as the ratio on/off.
func BenchmarkHeartbeat(b *testing.B) {
	cs := connectFull(b, nil, nil, &mcp.ClientOptions{ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) {}}, nil)
	call := func() time.Duration {
		p := &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "1 + 1"}}
		p.SetProgressToken("b")
		start := time.Now()
		if res, err := cs.CallTool(context.Background(), p); err != nil || res.IsError {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	setHeartbeat(b, 5*time.Second)
	call() // warm
	var on, off time.Duration
	for b.Loop() {
		heartbeatEvery = 0
		off += call()
		heartbeatEvery = 5 * time.Second
		on += call()
	}
	b.ReportMetric(float64(off.Microseconds())/float64(b.N)/1000, "ms-off/op")
	b.ReportMetric(float64(on.Microseconds())/float64(b.N)/1000, "ms-on/op")
	b.ReportMetric(float64(on)/float64(off), "on/off")
}

// BenchmarkHeartbeatMiddleware: the heartbeat's own cost on a call that
// returns at once (its goroutine, timer and context), without and with it.
func BenchmarkHeartbeatMiddleware(b *testing.B) {
	next := func(context.Context, string, mcp.Request) (mcp.Result, error) { return &mcp.CallToolResult{}, nil }
	params := &mcp.CallToolParamsRaw{Name: "run_python"}
	params.SetProgressToken("b")
	req := &mcp.CallToolRequest{Session: &mcp.ServerSession{}, Params: params}
	h := heartbeat(next)
	for _, every := range []time.Duration{0, 5 * time.Second} {
		name := "off"
		if every > 0 {
			name = "on"
		}
		b.Run(name, func(b *testing.B) {
			setHeartbeat(b, every)
			for b.Loop() {
				h(context.Background(), "tools/call", req)
			}
		})
	}
}
