package httpserver

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// hostGuard refuses requests whose Host or Origin header names a host
// this server was not told it is reachable as. That defeats DNS
// rebinding: a web page on evil.example whose name was re-pointed at this
// server still sends "Host: evil.example" (and its own Origin), so a
// browser cannot be used to reach the server through a name the operator
// did not choose.
type hostGuard struct {
	allowed map[string]bool // lower-case host names and IPs, without port
}

// newHostGuard allows the loopback names, the listen address, every local
// interface address when listening on all of them, and extra names (an
// operator's DNS name, "host" or "host:port").
func newHostGuard(listen net.Addr, extra []string) (*hostGuard, error) {
	g := &hostGuard{allowed: map[string]bool{"localhost": true, "127.0.0.1": true, "::1": true}}
	if tcp, ok := listen.(*net.TCPAddr); ok {
		if tcp.IP.IsUnspecified() {
			addrs, err := net.InterfaceAddrs()
			if err != nil {
				return nil, fmt.Errorf("http: list interface addresses: %w", err)
			}
			for _, a := range addrs {
				if ipn, ok := a.(*net.IPNet); ok {
					g.allowed[ipn.IP.String()] = true
				}
			}
		} else {
			g.allowed[tcp.IP.String()] = true
		}
	}
	for _, h := range extra {
		name := hostOnly(h)
		if name == "" || strings.ContainsAny(name, "/ @") {
			return nil, fmt.Errorf("--allowed-host %q: want a host name or IP address, e.g. sandbox.example.com", h)
		}
		g.allowed[name] = true
	}
	return g, nil
}

// hostOnly strips the port and brackets and lower-cases the name.
func hostOnly(hostport string) string {
	h := hostport
	if host, _, err := net.SplitHostPort(hostport); err == nil {
		h = host
	}
	h = strings.TrimSuffix(strings.Trim(h, "[]"), ".")
	if ip := net.ParseIP(h); ip != nil {
		return ip.String()
	}
	return strings.ToLower(h)
}

func (g *hostGuard) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !g.allowed[hostOnly(r.Host)] {
			w.Header().Set("Connection", "close")
			http.Error(w, fmt.Sprintf("Forbidden: Host %q is not a name this server answers to (see --allowed-host)", r.Host), http.StatusForbidden)
			return
		}
		if origin := r.Header.Get("Origin"); origin != "" {
			u, err := url.Parse(origin)
			if err != nil || u.Host == "" || !g.allowed[hostOnly(u.Host)] {
				w.Header().Set("Connection", "close")
				http.Error(w, fmt.Sprintf("Forbidden: Origin %q is not allowed", origin), http.StatusForbidden)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}
