// Package grafana holds a Grafana dashboard for pysandbox's Prometheus
// metrics (pysandbox-dashboard.json); its test checks that every query
// names a metric the server exports.
package grafana

import (
	"bufio"
	"encoding/json"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/metrics"
)

// exported are the metric names a real server's /metrics has, once each
// kind of event happened (histograms also as _bucket, _sum and _count).
func exported(t *testing.T) map[string]bool {
	one := func() int { return 1 }
	m := metrics.New(metrics.Gauges{Sessions: one, Queued: one, Running: one})
	m.Call("run_python", "allow", true, time.Second, "success")
	m.CPU(time.Second)
	m.Denied("run_python", "tool")
	m.RateLimited("run_python", "runs")
	m.LimitHit("memory")
	m.NetConns("allow", 1)
	m.NetConn("allow", 10, 10)
	m.Upstream("srv", "allow", 1, 10, 10)
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	names := map[string]bool{}
	sc := bufio.NewScanner(rec.Body)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 4 && f[0] == "#" && f[1] == "TYPE" {
			names[f[2]] = true
			if f[3] == "histogram" || f[3] == "summary" {
				for _, s := range []string{"_bucket", "_sum", "_count"} {
					names[f[2]+s] = true
				}
			}
		}
	}
	return names
}

func TestDashboardQueriesNameRealMetrics(t *testing.T) {
	data, err := os.ReadFile("pysandbox-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
		Templating struct {
			List []struct{ Query any }
		}
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	names := exported(t)
	metric := regexp.MustCompile(`\b(?:pysandbox|process|go)_[a-z_]+\b`)
	queries := 0
	check := func(where, expr string) {
		found := metric.FindAllString(expr, -1)
		if len(found) == 0 {
			t.Errorf("%s: the query names no metric: %s", where, expr)
		}
		for _, n := range found {
			if !names[n] {
				t.Errorf("%s: %s is not a metric the server exports", where, n)
			}
		}
		queries++
	}
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			check("panel "+p.Title, tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if q, ok := v.Query.(string); ok && strings.Contains(q, "label_values") {
			check("variable", q)
		}
	}
	// Every pysandbox metric is on the dashboard.
	all := string(data)
	for n := range names {
		if strings.HasPrefix(n, "pysandbox_") && !strings.HasSuffix(n, "_bucket") && !strings.HasSuffix(n, "_sum") && !strings.HasSuffix(n, "_count") &&
			!strings.Contains(all, n) && !strings.Contains(all, n+"_bucket") {
			t.Errorf("%s is on no panel", n)
		}
	}
	t.Logf("%d queries over %d panels", queries, len(d.Panels))
}
