package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// TestTracing: with OTEL_EXPORTER_OTLP_ENDPOINT set, a tool call reaches a
// real OTLP/HTTP receiver as a trace: the call, with the policy, queue,
// install, sandbox start and run spans below it.
func TestTracing(t *testing.T) {
	var (
		mu    sync.Mutex
		spans = map[string][]byte{} // name -> parent span id
		ids   = map[string]string{} // span id -> name
	)
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req collectortrace.ExportTraceServiceRequest
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(body, &req) != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					spans[s.Name] = s.ParentSpanId
					ids[string(s.SpanId)] = s.Name
				}
			}
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		b, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		w.Write(b)
	}))
	defer collector.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
	ctx, cs := serveStdio(t)
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "print('traced')"}})
	if err != nil || res.IsError {
		t.Fatalf("%v %+v", err, res)
	}
	want := []string{"tools/call run_python", "policy.rate_limits", "policy.check", "queue", "install", "sandbox.start", "run"}
	deadline := time.Now().Add(time.Minute)
	for {
		mu.Lock()
		missing := []string{}
		for _, n := range want {
			if _, ok := spans[n]; !ok {
				missing = append(missing, n)
			}
		}
		parentOK := len(missing) == 0 && ids[string(spans["run"])] == "tools/call run_python" && ids[string(spans["queue"])] == "tools/call run_python"
		mu.Unlock()
		if parentOK {
			break
		}
		if time.Now().After(deadline) {
			mu.Lock()
			t.Fatalf("missing spans %v or parents; got %v", missing, keys(spans))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func keys(m map[string][]byte) string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return strings.Join(out, ", ")
}
