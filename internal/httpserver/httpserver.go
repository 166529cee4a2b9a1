// Package httpserver is pysandbox's HTTP deployment: MCP over streamable
// HTTP at /mcp behind bearer-token authentication and a Host/Origin check,
// /healthz, and Prometheus /metrics.
package httpserver

import (
	"encoding/json"
	"log/slog"
	"net"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/cluster"
)

// Config configures the handler.
type Config struct {
	Server *mcp.Server
	// Tokens, when set, are required on /mcp and /metrics; nil serves
	// them without authentication.
	Tokens *Tokens
	// MetricsTokens, when set, are the only tokens that open /metrics
	// (agents' tokens no longer do), and they open nothing else.
	MetricsTokens *Tokens
	// Listen is the address the server listens on; with AllowedHosts it
	// decides which Host and Origin headers are accepted.
	Listen       net.Addr
	AllowedHosts []string
	// Metrics serves /metrics; nil leaves it out.
	Metrics http.Handler
	// Health is what /healthz reports besides "status": "ok".
	Health map[string]string
	// MaxRequestBytes caps one request body (default 32 MiB: an upload of
	// 16 MiB is about 22 MiB in base64, plus JSON).
	MaxRequestBytes int64
	Logger          *slog.Logger
	// Cluster, when set, sends requests of MCP sessions other replicas
	// own to their owner (internal/cluster).
	Cluster *cluster.Cluster
	// Ready is what GET /readyz reports (nil: always ready): false while
	// the server drains.
	Ready func() bool
	// Sessions bound the MCP sessions of protocols before 2026-07-28
	// (mcpsessions.go); the zero value means the defaults.
	Sessions SessionLimits
	// Console, when set, serves /console with its own (operators')
	// authentication: agents' tokens do not open it.
	Console http.Handler
}

// Handler returns the server's HTTP handler.
func Handler(cfg Config) (http.Handler, error) {
	guard, err := newHostGuard(cfg.Listen, cfg.AllowedHosts)
	if err != nil {
		return nil, err
	}
	if cfg.MaxRequestBytes <= 0 {
		cfg.MaxRequestBytes = 32 << 20
	}
	caps := newSessionCaps(cfg.Server, cfg.Sessions)
	opts := func(stateless bool) *mcp.StreamableHTTPOptions {
		return &mcp.StreamableHTTPOptions{MaxRequestBodyBytes: cfg.MaxRequestBytes, Logger: cfg.Logger, Stateless: stateless,
			// The SDK refuses any non-loopback Host on a loopback
			// connection; names the operator allowed (a reverse proxy on
			// this machine) are checked by our guard instead.
			DisableLocalhostProtection: len(cfg.AllowedHosts) > 0,
			// On the sessionless protocol a client cancels a call by
			// ending its request: without this, the run went on to its
			// timeout, holding its session and its place.
			PropagateRequestCancellation: stateless}
	}
	get := func(*http.Request) *mcp.Server { return cfg.Server }
	var mcpHandler http.Handler = sessionless(caps.wrap(mcp.NewStreamableHTTPHandler(get, opts(false))), caps.streams.wrap(mcp.NewStreamableHTTPHandler(get, opts(true))))
	mcpHandler = newBodies(cfg.MaxRequestBytes).wrap(mcpHandler)
	if cfg.Cluster != nil {
		// After authentication (below): no request of a caller without a
		// token costs a lookup; the owner authenticates the caller again.
		mcpHandler = cfg.Cluster.Proxy(mcpHandler)
	}
	metrics := cfg.Metrics
	if cfg.Tokens != nil {
		// Tokens carry no expiry: they are valid until removed from the
		// file (and the file reloaded: Keyring.Reload, on SIGHUP).
		requireToken := auth.RequireBearerToken(cfg.Tokens.Verify, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})
		mcpHandler = challenge(requireToken(mcpHandler))
		if metrics != nil && cfg.MetricsTokens == nil {
			metrics = challenge(requireToken(metrics))
		}
	}
	if metrics != nil && cfg.MetricsTokens != nil {
		// A scraper's credential that can do nothing else; an agent's token,
		// which can run code, need not sit in the scraper's configuration.
		metrics = challenge(auth.RequireBearerToken(cfg.MetricsTokens.Verify, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(metrics))
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", mcpHandler)
	if cfg.Console != nil {
		mux.Handle("/console", cfg.Console)
		mux.Handle("/console/", cfg.Console)
	}
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if cfg.Ready != nil && !cfg.Ready() {
			http.Error(w, "draining", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ready\n"))
	})
	if metrics != nil {
		mux.Handle("GET /metrics", metrics)
	}
	health := map[string]string{"status": "ok"}
	for k, v := range cfg.Health {
		health[k] = v
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(health)
	})
	return guard.wrap(mux), nil
}

// sessionless serves the protocol's two flows on one endpoint: requests
// of 2026-07-28 and later (sessionless: every request says its protocol
// version, and the server keeps nothing between them) go to a stateless
// handler, every other (initialize, then Mcp-Session-Id) to a sessionful
// one. The SDK negotiates 2026-07-28 only on a stateless handler, and an
// older client needs a session for approvals asked in the middle of a
// call.
func sessionless(sessionful, stateless http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if v := r.Header.Get("Mcp-Protocol-Version"); v >= "2026-07-28" && r.Header.Get("Mcp-Session-Id") == "" {
			stateless.ServeHTTP(w, r)
			return
		}
		sessionful.ServeHTTP(w, r)
	})
}

// challenge adds the WWW-Authenticate header RFC 6750 asks for to a 401,
// so clients know a bearer token is what is missing.
func challenge(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(&challengeWriter{ResponseWriter: w}, r)
	})
}

type challengeWriter struct{ http.ResponseWriter }

func (c *challengeWriter) WriteHeader(code int) {
	if code == http.StatusUnauthorized && c.Header().Get("WWW-Authenticate") == "" {
		c.Header().Set("WWW-Authenticate", `Bearer realm="pysandbox"`)
	}
	if code == http.StatusUnauthorized {
		// A caller without a valid token keeps no connection open.
		c.Header().Set("Connection", "close")
	}
	c.ResponseWriter.WriteHeader(code)
}

// Flush keeps server-sent event streams working through the wrapper.
func (c *challengeWriter) Flush() {
	if f, ok := c.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the real writer.
func (c *challengeWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }
