// Package metrics exposes what the server is doing in Prometheus text
// format, with the official client library: tool calls and their
// decisions, runs by status, run durations, denials, rate limits, limit
// hits, sessions and the queue.
package metrics

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Gauges are read when /metrics is scraped.
type Gauges struct {
	Sessions func() int // open sessions
	Queued   func() int // runs waiting for a slot
	Running  func() int // runs executing
}

// Metrics holds the collectors. A nil *Metrics records nothing, so
// callers need not check.
type Metrics struct {
	reg         *prometheus.Registry
	calls       *prometheus.CounterVec
	runs        *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	denials     *prometheus.CounterVec
	rateLimited *prometheus.CounterVec
	limitHits   *prometheus.CounterVec
	cpu         prometheus.Counter
	netConns    *prometheus.CounterVec
	netBytes    *prometheus.CounterVec
	upCalls     *prometheus.CounterVec
	upBytes     *prometheus.CounterVec
}

// New registers the collectors on a registry of their own (plus the Go
// runtime and process collectors).
func New(g Gauges) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pysandbox_tool_calls_total",
			Help: "Tool calls by tool and policy decision (allow, deny, rate_limited, approved, declined, approval_requested).",
		}, []string{"tool", "decision"}),
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pysandbox_runs_total",
			Help: "Code runs (run_python) by status: success, error, timeout, memory_limit, output_limit, killed, cancelled, install_error.",
		}, []string{"status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "pysandbox_tool_call_duration_seconds",
			Help: "Wall time of tool calls that ran, by tool.",
			// From a warm-pool hello (a few ms) to the longest timeout.
			Buckets: []float64{.002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}, []string{"tool"}),
		denials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pysandbox_denials_total",
			Help: "Calls refused by the policy, by tool and rule (tool, default, package, approval).",
		}, []string{"tool", "rule"}),
		rateLimited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pysandbox_rate_limited_total",
			Help: "Calls refused by a rate limit, by tool and counter.",
		}, []string{"tool", "counter"}),
		limitHits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pysandbox_limit_hits_total",
			Help: "Runs that hit a sandbox limit: timeout, memory, output.",
		}, []string{"limit"}),
		cpu: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pysandbox_run_cpu_seconds_total",
			Help: "CPU time used by runs (run_python, one-shot and in sessions), as their cgroups measured it.",
		}),
		netConns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pysandbox_net_connections_total",
			Help: "Connections runs asked the network proxy for, by decision (allow, approved, deny, declined, limit, error).",
		}, []string{"decision"}),
		netBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pysandbox_net_bytes_total",
			Help: "Bytes through the network proxy, by direction (in: from hosts to runs, out: from runs to hosts).",
		}, []string{"direction"}),
		upCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pysandbox_upstream_calls_total", Help: "Calls code made to upstream MCP tools, by upstream server and decision.",
		}, []string{"server", "decision"}),
		upBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pysandbox_upstream_bytes_total", Help: "Bytes of upstream tool calls: arguments out, results in.",
		}, []string{"direction"}),
	}
	m.reg.MustRegister(m.calls, m.runs, m.duration, m.denials, m.rateLimited, m.limitHits, m.cpu, m.netConns, m.netBytes, m.upCalls, m.upBytes,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	gauge := func(name, help string, f func() int) {
		if f != nil {
			m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return float64(f()) }))
		}
	}
	gauge("pysandbox_sessions_active", "Sessions open now.", g.Sessions)
	gauge("pysandbox_queue_depth", "Runs waiting for a free slot.", g.Queued)
	gauge("pysandbox_runs_in_flight", "Runs executing now.", g.Running)
	return m
}

// Handler serves the metrics.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// Call records one tool call: its decision and, for calls that ran, how
// long they took and the run status ("" when the tool does not run code).
func (m *Metrics) Call(tool, decision string, ran bool, d time.Duration, status string) {
	if m == nil {
		return
	}
	m.calls.WithLabelValues(tool, decision).Inc()
	if ran {
		m.duration.WithLabelValues(tool).Observe(d.Seconds())
	}
	if status != "" {
		m.runs.WithLabelValues(status).Inc()
	}
}

// CPU adds a run's CPU time.
func (m *Metrics) CPU(d time.Duration) {
	if m == nil || d <= 0 {
		return
	}
	m.cpu.Add(d.Seconds())
}

// Denied records a refusal by a policy rule.
func (m *Metrics) Denied(tool, rule string) {
	if m != nil {
		m.denials.WithLabelValues(tool, rule).Inc()
	}
}

// RateLimited records a refusal by a rate limit.
func (m *Metrics) RateLimited(tool, counter string) {
	if m != nil {
		m.rateLimited.WithLabelValues(tool, counter).Inc()
	}
}

// LimitHit records a run that hit a sandbox limit.
func (m *Metrics) LimitHit(limit string) {
	if m != nil {
		m.limitHits.WithLabelValues(limit).Inc()
	}
}

// NetConns counts n connections that moved no bytes (refusals counted
// in a summary).
func (m *Metrics) NetConns(decision string, n int) {
	if m == nil || n <= 0 {
		return
	}
	m.netConns.WithLabelValues(decision).Add(float64(n))
}

// NetConn records one connection through the network proxy.
func (m *Metrics) NetConn(decision string, in, out int64) {
	if m == nil {
		return
	}
	m.netConns.WithLabelValues(decision).Inc()
	if in > 0 {
		m.netBytes.WithLabelValues("in").Add(float64(in))
	}
	if out > 0 {
		m.netBytes.WithLabelValues("out").Add(float64(out))
	}
}

// Upstream records n calls code made to tools of an upstream server
// ("" when the tool named no configured server), with their bytes.
func (m *Metrics) Upstream(server, decision string, n int, out, in int64) {
	if m == nil || n <= 0 {
		return
	}
	m.upCalls.WithLabelValues(server, decision).Add(float64(n))
	if out > 0 {
		m.upBytes.WithLabelValues("out").Add(float64(out))
	}
	if in > 0 {
		m.upBytes.WithLabelValues("in").Add(float64(in))
	}
}
