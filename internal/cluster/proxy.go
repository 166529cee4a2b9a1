package cluster

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httputil"
	"net/url"
)

// Proxy routes requests of MCP sessions other replicas own (by the
// Mcp-Session-Id header) to their owner, untouched: the owner
// authenticates the caller and serves the session as if the client had
// come straight to it. Event streams pass through as they come. A
// session whose owner stopped gets 404, which tells an MCP client to
// start a new session, with a JSON-RPC error saying why.
func (c *Cluster) Proxy(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("Mcp-Session-Id")
		// A request already forwarded once is served here whatever its id
		// says: two replicas that disagree about an owner must not bounce a
		// request between them. (A client that sets the header only turns
		// routing off for itself.)
		if id == "" || r.Header.Get("X-Pysandbox-Forwarded-By") != "" {
			next.ServeHTTP(w, r)
			return
		}
		m, local, err := c.Owner(r.Context(), id, true)
		switch {
		case local:
			next.ServeHTTP(w, r)
			return
		case errors.Is(err, ErrLost):
			writeRPCError(w, http.StatusNotFound, "this MCP session was lost when its server stopped; start a new one (initialize again)")
			return
		case err != nil:
			writeRPCError(w, http.StatusServiceUnavailable, err.Error())
			return
		}
		target, err := url.Parse(m.MCP)
		if err != nil {
			writeRPCError(w, http.StatusBadGateway, "the server holding this session is listed with a bad address")
			return
		}
		p := &httputil.ReverseProxy{
			Rewrite: func(pr *httputil.ProxyRequest) {
				pr.SetURL(target)
				pr.Out.URL.Path = r.URL.Path
				pr.Out.URL.RawPath = r.URL.RawPath
				// The Host the client used, which every replica accepts
				// alike (the Service's name, --allowed-host).
				pr.Out.Host = r.Host
				pr.Out.Header.Set("X-Pysandbox-Forwarded-By", c.self.Name)
			},
			// Server-sent events go on as they come.
			FlushInterval: -1,
			ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
				writeRPCError(w, http.StatusBadGateway, ErrUnreachable.Error())
			},
		}
		p.ServeHTTP(w, r)
	})
}

func writeRPCError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]any{"jsonrpc": "2.0", "id": nil, "error": map[string]any{"code": -32001, "message": msg}})
}
