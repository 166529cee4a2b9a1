package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/pysandbox/pysandbox/internal/httpserver"
)

// serveHTTP serves MCP over streamable HTTP on --http until SIGINT or
// SIGTERM, then drains and stops.
func (s *server) serveHTTP() error {
	ln, err := net.Listen("tcp", s.cfg.HTTP)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	handler, err := s.httpHandler(ln.Addr())
	if err != nil {
		ln.Close()
		return usageError{err}
	}
	ln, maxConns := httpserver.LimitConnections(ln)
	s.log.Debug("connections open at once", "max", maxConns)
	hs := &http.Server{Handler: s.rep.count(handler), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: httpserver.IdleTimeout, TLSConfig: s.tlsConfig, MaxHeaderBytes: 64 << 10}
	scheme := "http"
	if s.tlsConfig != nil {
		ln = tls.NewListener(ln, s.tlsConfig)
		scheme = "https"
	}
	s.log.Info("serving MCP over HTTP", "url", scheme+"://"+ln.Addr().String()+"/mcp", "auth", s.authText(), "backend", s.posture.Backend, "posture", s.posture.Posture)
	s.rep.serveInternal(handler, s.internal, s.maxRequestBytes(), s.log)
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-s.ctx.Done():
	}
	return s.stopHTTP(hs)
}

// maxRequestBytes leaves room for the largest upload in base64, plus JSON.
func (s *server) maxRequestBytes() int64 { return int64(s.cfg.MaxUpload)*4/3 + 1<<20 }

// httpHandler is /mcp, /healthz, /readyz, /metrics and the console,
// behind the tokens and the Host guard.
func (s *server) httpHandler(listen net.Addr) (http.Handler, error) {
	return httpserver.Handler(httpserver.Config{
		Server:          s.srv,
		Tokens:          s.keys.Agents,
		Listen:          listen,
		AllowedHosts:    s.cfg.AllowedHosts,
		Metrics:         s.gov.Metrics.Handler(),
		Health:          map[string]string{"backend": s.posture.Backend, "posture": s.posture.Posture},
		MaxRequestBytes: s.maxRequestBytes(),
		Logger:          sdkLogger(s.log),
		Cluster:         s.rep.cl,
		Ready:           func() bool { return !s.rep.draining.Load() },
		Console:         s.console,
		Sessions:        s.cfg.Quotas.mcp,
		MetricsTokens:   s.keys.Metrics,
	})
}

// authText says in the startup log who may call.
func (s *server) authText() string {
	switch {
	case s.keys.Agents != nil:
		return "bearer tokens: " + strings.Join(s.keys.Agents.Names(), ", ")
	case s.cfg.InsecureNoAuth:
		return "NONE on a non-loopback address (--insecure-no-auth)"
	}
	return "none (loopback only)"
}

// stopHTTP is SIGTERM's path: /readyz fails (the Service stops sending
// requests here), no new session is taken, and runs in flight finish
// first. Then both endpoints stop taking requests, and what a last
// request started finishes before the audit log closes.
func (s *server) stopHTTP(hs *http.Server) error {
	start := time.Now()
	s.rep.drain(s.eng, s.log)
	// Sessions whose runs finished are paused, to be resumed by the next
	// server on this state directory (the pod's volume); one still
	// running at the deadline keeps its last snapshot.
	s.pauseAll(start.Add(s.rep.drainFor))
	// A replica of several hands its paused sessions to the others: a
	// scale-down leaves no volume behind to come back with.
	s.rep.handOff()
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	internalDone := make(chan struct{})
	go func() { s.rep.shutdown(5 * time.Second); close(internalDone) }()
	err := hs.Shutdown(shutdown)
	<-internalDone
	s.rep.waitIdle(s.eng, 5*time.Second)
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

// checkExposure refuses an address other machines could reach unless
// callers must authenticate, or the operator explicitly chose not to:
// anyone who can reach the port can run code.
func checkExposure(addr string, authenticated, insecure bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--http %q: want HOST:PORT such as 127.0.0.1:8080", addr)
	}
	if !authenticated && !insecure && !isLoopback(host) {
		return fmt.Errorf("--http %q: refusing a non-loopback address without authentication, because anyone who can reach it could run code; pass --auth-token-file FILE (lines of 'NAME TOKEN'), or --insecure-no-auth if something in front of this server authenticates callers", addr)
	}
	return nil
}

// isLoopback reports whether a listen host is reachable from this machine
// only.
func isLoopback(host string) bool {
	ip := net.ParseIP(host)
	return host == "localhost" || (ip != nil && ip.IsLoopback())
}
