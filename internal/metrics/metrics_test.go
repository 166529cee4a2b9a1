package metrics

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestMetricsText(t *testing.T) {
	sessions := 2
	m := New(Gauges{Sessions: func() int { return sessions }, Queued: func() int { return 3 }, Running: func() int { return 1 }})
	m.Call("run_python", "allow", true, 12*time.Millisecond, "success")
	m.Call("run_python", "allow", true, 2*time.Second, "timeout")
	m.LimitHit("timeout")
	m.Call("validate_script", "deny", false, 0, "")
	m.Denied("validate_script", "tool")
	m.RateLimited("run_python", "runs")
	m.CPU(1500 * time.Millisecond)
	m.CPU(500 * time.Millisecond)
	m.NetConn("allow", 100, 20)
	m.NetConn("deny", 0, 0)
	m.NetConns("deny", 5)
	var nilM *Metrics
	nilM.Call("x", "allow", true, time.Second, "success") // a nil Metrics records nothing, and does not panic
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	text := string(body)
	for _, want := range []string{
		`pysandbox_runs_total{status="success"} 1`,
		`pysandbox_runs_total{status="timeout"} 1`,
		`pysandbox_tool_calls_total{decision="deny",tool="validate_script"} 1`,
		`pysandbox_denials_total{rule="tool",tool="validate_script"} 1`,
		`pysandbox_rate_limited_total{counter="runs",tool="run_python"} 1`,
		`pysandbox_limit_hits_total{limit="timeout"} 1`,
		`pysandbox_tool_call_duration_seconds_count{tool="run_python"} 2`,
		`pysandbox_tool_call_duration_seconds_bucket{tool="run_python",le="0.025"} 1`,
		`pysandbox_sessions_active 2`,
		`pysandbox_queue_depth 3`,
		`pysandbox_runs_in_flight 1`,
		`pysandbox_run_cpu_seconds_total 2`,
		`pysandbox_net_connections_total{decision="allow"} 1`,
		`pysandbox_net_connections_total{decision="deny"} 6`,
		`pysandbox_net_bytes_total{direction="in"} 100`,
		`pysandbox_net_bytes_total{direction="out"} 20`,
		`go_goroutines`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("missing %q", want)
		}
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("content type %q", ct)
	}
}
