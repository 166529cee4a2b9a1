// Package webhost starts web servers on the host's loopback for tests of a
// sandbox's network, and the proxy (internal/egress) that lets runs reach
// them: plain HTTP and HTTPS (with a CA a run can trust), reached by names
// pinned to 127.0.0.1, the one documented way to open a loopback target.
package webhost

import (
	"crypto/x509"
	"encoding/pem"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/pysandbox/pysandbox/internal/egress"
	"github.com/pysandbox/pysandbox/internal/policy"
)

// Host is a plain and a TLS web server with the proxy that reaches them.
type Host struct {
	HTTP, HTTPS *httptest.Server
	// PlainName and TLSName are the names runs use: "plain.test:PORT" and
	// "example.com:PORT" (the name in httptest's certificate), each pinned
	// to 127.0.0.1 by a rule.
	PlainName, TLSName string
	// CAPEM is the TLS server's certificate, for a run to trust.
	CAPEM string
	Rules *policy.NetworkRules
	Proxy *egress.Proxy

	mu   sync.Mutex
	recs []egress.Record
}

// New starts the servers with handler and a proxy allowing both names
// (and the extra rules).
func New(t testing.TB, handler http.Handler, extra ...string) *Host {
	t.Helper()
	h := &Host{HTTP: httptest.NewServer(handler), HTTPS: httptest.NewTLSServer(handler)}
	t.Cleanup(h.HTTP.Close)
	t.Cleanup(h.HTTPS.Close)
	h.PlainName = "plain.test:" + port(h.HTTP.URL)
	// httptest's certificate is for example.com (and 127.0.0.1).
	h.TLSName = "example.com:" + port(h.HTTPS.URL)
	h.CAPEM = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: h.HTTPS.Certificate().Raw}))
	if _, err := x509.ParseCertificate(h.HTTPS.Certificate().Raw); err != nil {
		t.Fatal(err)
	}
	h.Rules = &policy.NetworkRules{Limits: policy.DefaultNetLimits}
	for _, r := range append([]string{h.PlainName + "=127.0.0.1", h.TLSName + "=127.0.0.1"}, extra...) {
		rule, err := policy.ParseHostRule(r)
		if err != nil {
			t.Fatal(err)
		}
		h.Rules.Allow = append(h.Rules.Allow, rule)
	}
	h.Proxy = egress.New(egress.Config{Rules: func() *policy.NetworkRules { return h.Rules }, OnRecord: h.add})
	return h
}

func port(u string) string {
	_, p, _ := net.SplitHostPort(strings.TrimPrefix(strings.TrimPrefix(u, "http://"), "https://"))
	return p
}

func (h *Host) add(r egress.Record) {
	h.mu.Lock()
	h.recs = append(h.recs, r)
	h.mu.Unlock()
}

// Records are the proxy's records so far.
func (h *Host) Records() []egress.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]egress.Record(nil), h.recs...)
}

// Attach serves a sandbox's proxy listener under a grant of its own (an
// engine.NetAttach).
func (h *Host) Attach(info egress.Info) func(net.Listener) func() {
	return func(l net.Listener) func() {
		g := h.Proxy.NewGrant(egress.GrantConfig{Info: info})
		g.Serve(l)
		return g.Close
	}
}

// Port returns a server's port as a number.
func Port(s *httptest.Server) int {
	n, _ := strconv.Atoi(port(s.URL))
	return n
}
