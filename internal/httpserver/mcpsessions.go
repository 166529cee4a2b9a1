package httpserver

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// MCP sessions (protocols before 2026-07-28: initialize, then
// Mcp-Session-Id) each hold a goroutine and some kilobytes in the SDK for
// as long as they live, and opening one costs a caller nothing. So they
// are bounded three ways: an idle timeout (the SDK's SessionTimeout; a
// request in flight or an open event stream keeps a session busy), a cap
// per caller and a cap per server. Past a cap, initialize is refused with
// an error that says how to get out of it.

// SessionLimits bound the MCP sessions of the sessionful protocol.
type SessionLimits struct {
	// Idle ends a session that has had no request for this long (0: the
	// default, 10 minutes).
	Idle time.Duration
	// PerCaller caps one identity's sessions (a token's; every caller
	// without a token shares one identity); Total caps the server's. 0:
	// the defaults, 64 and 1024.
	PerCaller, Total int
}

func (l SessionLimits) withDefaults() SessionLimits {
	if l.Idle <= 0 {
		l.Idle = 10 * time.Minute
	}
	if l.PerCaller <= 0 {
		l.PerCaller = 64
	}
	if l.Total <= 0 {
		l.Total = 1024
	}
	return l
}

// sessionCaps admits initialize requests within the caps and remembers
// whose each session is.
type sessionCaps struct {
	lim    SessionLimits
	server *mcp.Server

	mu      sync.Mutex
	owner   map[string]string // MCP session id -> identity
	pending map[string]int    // initialize requests admitted, not yet answered
	npend   int
}

func newSessionCaps(server *mcp.Server, lim SessionLimits) *sessionCaps {
	return &sessionCaps{lim: lim.withDefaults(), server: server, owner: map[string]string{}, pending: map[string]int{}}
}

// anonymousCaller is the identity of callers without a token (as
// internal/tools names it).
const anonymousCaller = "http:anonymous"

func callerOf(r *http.Request) string {
	if ti := auth.TokenInfoFromContext(r.Context()); ti != nil && ti.UserID != "" {
		return ti.UserID
	}
	return anonymousCaller
}

// wrap bounds the sessions next (the sessionful handler) opens.
func (c *sessionCaps) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Only a POST without a session id opens a session (the SDK
		// answers anything else without one with an error).
		if r.Method != http.MethodPost || r.Header.Get("Mcp-Session-Id") != "" {
			next.ServeHTTP(w, r)
			return
		}
		who := callerOf(r)
		if msg := c.admit(who); msg != "" {
			refuseSession(w, msg)
			return
		}
		defer c.done(who, w.Header().Get)
		next.ServeHTTP(w, r)
	})
}

// admit reserves a place for one more session of who, or says why not.
func (c *sessionCaps) admit(who string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	mine, all := c.counts(who)
	if mine >= c.lim.PerCaller || all >= c.lim.Total {
		// Forget sessions that have ended (deleted, or closed idle)
		// before refusing: the SDK does not tell us when one does.
		c.prune()
		mine, all = c.counts(who)
	}
	switch {
	case mine >= c.lim.PerCaller:
		who := who + " has"
		if who == anonymousCaller+" has" {
			who = "callers without a token (who share one identity: nothing tells them apart) have"
		}
		return fmt.Sprintf("too many MCP sessions: %s %d open, the most one caller may have (--max-mcp-sessions-per-caller). End sessions you no longer use (HTTP DELETE with their Mcp-Session-Id, which clients send when they close), reuse one, or wait: a session without requests for %s ends by itself. Clients of protocol 2026-07-28 need no MCP session at all.", who, mine, c.lim.Idle)
	case all >= c.lim.Total:
		return fmt.Sprintf("too many MCP sessions: this server has %d open, the most it keeps (--max-mcp-sessions). Retry later: a session without requests for %s ends by itself. Clients of protocol 2026-07-28 need no MCP session at all.", all, c.lim.Idle)
	}
	c.pending[who]++
	c.npend++
	return ""
}

// counts returns who's sessions and the server's, pending ones included.
// c.mu is held.
func (c *sessionCaps) counts(who string) (mine, all int) {
	for _, o := range c.owner {
		if o == who {
			mine++
		}
	}
	return mine + c.pending[who], len(c.owner) + c.npend
}

// prune forgets sessions the server no longer has. c.mu is held.
func (c *sessionCaps) prune() {
	live := map[string]bool{}
	for ss := range c.server.Sessions() {
		live[ss.ID()] = true
	}
	for id := range c.owner {
		if !live[id] {
			delete(c.owner, id)
		}
	}
}

// done ends a reservation: the session the answer named, if any, is
// who's from now on.
func (c *sessionCaps) done(who string, header func(string) string) {
	id := header("Mcp-Session-Id")
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending[who]--; c.pending[who] <= 0 {
		delete(c.pending, who)
	}
	c.npend--
	if id != "" {
		c.owner[id] = who
	}
}

// refuseSession answers an initialize past a cap: HTTP 429 with a
// JSON-RPC error, whose message clients show.
func refuseSession(w http.ResponseWriter, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Retry-After", "60")
	w.WriteHeader(http.StatusTooManyRequests)
	json.NewEncoder(w).Encode(map[string]any{"jsonrpc": "2.0", "id": nil, "error": map[string]any{"code": -32000, "message": msg}})
}
