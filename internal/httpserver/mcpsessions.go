package httpserver

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// MCP sessions (protocols before 2026-07-28: initialize, then
// Mcp-Session-Id) each hold a goroutine and some kilobytes in the SDK for
// as long as they live, and opening one costs a caller nothing. So they
// are bounded three ways: an idle timeout, a cap per caller and a cap per
// server. Past a cap, initialize is refused with an error that says how
// to get out of it.
//
// The idle timeout is kept here, not by the SDK's SessionTimeout: the SDK
// (v1.8.0) counts only POSTs as activity, so a client that holds its
// event stream open (GET) and calls nothing for a while, as IDE clients
// do, would lose its session under it.
//
// Requests of the sessionless protocol (2026-07-28) open no session, but
// one can stay open as long as a session (subscriptions/listen streams),
// so the ones in flight are bounded by the same caps.

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

// sessionCaps admits initialize requests within the caps, remembers
// whose each session is, and ends sessions left idle.
type sessionCaps struct {
	lim    SessionLimits
	server *mcp.Server

	mu       sync.Mutex
	sessions map[string]*tracked // by MCP session id
	pending  map[string]int      // initialize requests admitted, not yet answered
	npend    int
	reaping  bool // the idle reaper is running

	streams streamCaps // sessionless requests in flight
}

// tracked is one MCP session.
type tracked struct {
	owner    string
	inflight int       // its requests being served (an open event stream is one)
	last     time.Time // when the last of them started or ended
}

func newSessionCaps(server *mcp.Server, lim SessionLimits) *sessionCaps {
	c := &sessionCaps{lim: lim.withDefaults(), server: server, sessions: map[string]*tracked{}, pending: map[string]int{}}
	c.streams = streamCaps{lim: c.lim, byCaller: map[string]int{}, sessions: c.sessionsOf}
	return c
}

// anonymousCaller is the identity of callers without a token (as
// internal/tools names it).
const anonymousCaller = "http:anonymous"

// subject names who in a refusal, with its verb: "alice has", or the
// callers without a token, who share one identity.
func subject(who string) string {
	if who == anonymousCaller {
		return "callers without a token (who share one identity: nothing tells them apart) have"
	}
	return who + " has"
}

func callerOf(r *http.Request) string {
	if ti := auth.TokenInfoFromContext(r.Context()); ti != nil && ti.UserID != "" {
		return ti.UserID
	}
	return anonymousCaller
}

// wrap bounds the sessions next (the sessionful handler) opens, and keeps
// their activity.
func (c *sessionCaps) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id := r.Header.Get("Mcp-Session-Id"); id != "" {
			done := c.busy(id)
			defer done()
			next.ServeHTTP(&endedWriter{ResponseWriter: w, idle: c.lim.Idle}, r)
			return
		}
		// Only a POST without a session id opens a session (the SDK
		// answers anything else without one with an error).
		if r.Method != http.MethodPost {
			next.ServeHTTP(w, r)
			return
		}
		who := callerOf(r)
		if msg := c.admit(who); msg != "" {
			refuse(w, r, msg)
			return
		}
		defer c.done(who, w.Header().Get)
		next.ServeHTTP(w, r)
	})
}

// sessionsOf counts who's MCP sessions and the server's, pending ones
// included.
func (c *sessionCaps) sessionsOf(who string) (mine, all int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sessionsLocked(who)
}

// sessionsLocked is sessionsOf with c.mu held.
func (c *sessionCaps) sessionsLocked(who string) (mine, all int) {
	for _, t := range c.sessions {
		if t.owner == who {
			mine++
		}
	}
	return mine + c.pending[who], len(c.sessions) + c.npend
}

// busy marks a session's request in flight until done is called.
func (c *sessionCaps) busy(id string) (done func()) {
	c.mu.Lock()
	t := c.sessions[id]
	if t != nil {
		t.inflight++
		t.last = time.Now()
	}
	c.mu.Unlock()
	return func() {
		if t == nil {
			return
		}
		c.mu.Lock()
		t.inflight--
		t.last = time.Now()
		c.mu.Unlock()
	}
}

// reap ends sessions idle for longer than the timeout, every quarter of
// it, for as long as there are sessions.
func (c *sessionCaps) reap() {
	every := min(max(c.lim.Idle/4, 50*time.Millisecond), 30*time.Second)
	for {
		time.Sleep(every)
		c.mu.Lock()
		var idle []string
		for id, t := range c.sessions {
			if t.inflight == 0 && time.Since(t.last) > c.lim.Idle {
				idle = append(idle, id)
			}
		}
		c.mu.Unlock()
		if len(idle) > 0 {
			// Closing a session is the SDK's own way to end it: it leaves
			// the handler's table, and a later request gets 404.
			for ss := range c.server.Sessions() {
				if slices.Contains(idle, ss.ID()) {
					ss.Close()
				}
			}
		}
		c.mu.Lock()
		for _, id := range idle {
			delete(c.sessions, id)
		}
		c.prune()
		if len(c.sessions) == 0 && c.npend == 0 {
			c.reaping = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
	}
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
		return fmt.Sprintf("too many MCP sessions: %s %d open (sessionless requests in flight included), the most one caller may have (--max-mcp-sessions-per-caller). End sessions you no longer use (HTTP DELETE with their Mcp-Session-Id; some clients send it when they close, others do not), reuse one, or wait: a session without requests for %s ends by itself. Clients of protocol 2026-07-28 need no MCP session at all.", subject(who), mine, c.lim.Idle)
	case all >= c.lim.Total:
		return fmt.Sprintf("too many MCP sessions: this server has %d open (sessionless requests in flight included), the most it keeps (--max-mcp-sessions). Retry later: a session without requests for %s ends by itself. Clients of protocol 2026-07-28 need no MCP session at all.", all, c.lim.Idle)
	}
	if !c.reaping {
		c.reaping = true
		go c.reap()
	}
	c.pending[who]++
	c.npend++
	return ""
}

// counts returns who's sessions and the server's, pending ones included.
// c.mu is held.
func (c *sessionCaps) counts(who string) (mine, all int) {
	mine, all = c.sessionsLocked(who)
	// A sessionless request in flight holds as much as a session.
	c.streams.mu.Lock()
	defer c.streams.mu.Unlock()
	return mine + c.streams.byCaller[who], all + c.streams.total
}

// prune forgets sessions the server no longer has. c.mu is held.
func (c *sessionCaps) prune() {
	live := map[string]bool{}
	for ss := range c.server.Sessions() {
		live[ss.ID()] = true
	}
	for id := range c.sessions {
		if !live[id] {
			delete(c.sessions, id)
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
		c.sessions[id] = &tracked{owner: who, last: time.Now()}
	}
}

// refuse answers a request past a cap with a JSON-RPC error whose message
// says which cap and what to do. Clients show such an error to the user
// only when it answers the request (HTTP 200, its id): some drop the body
// of an HTTP error. So a request small enough to read cheaply gets that;
// any other, HTTP 429 with the error in its body.
func refuse(w http.ResponseWriter, r *http.Request, msg string) {
	w.Header().Set("Retry-After", "60")
	var call struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
	}
	data, err := io.ReadAll(io.LimitReader(r.Body, maxRefusedRead+1))
	if err == nil && len(data) <= maxRefusedRead && json.Unmarshal(data, &call) == nil && call.JSONRPC == "2.0" && len(call.ID) > 0 && string(call.ID) != "null" {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"jsonrpc": "2.0", "id": call.ID, "error": map[string]any{"code": -32000, "message": msg}})
		return
	}
	refuseWith(w, http.StatusTooManyRequests, msg)
}

// maxRefusedRead is the most of a refused request read to answer it.
const maxRefusedRead = 64 << 10

func refuseWith(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]any{"jsonrpc": "2.0", "id": nil, "error": map[string]any{"code": -32000, "message": msg}})
}

// endedWriter turns the SDK's plain-text 404 for a session that has ended
// into a JSON-RPC error that says what happened and what to do.
type endedWriter struct {
	http.ResponseWriter
	idle    time.Duration
	swallow bool
}

func (e *endedWriter) WriteHeader(code int) {
	if code != http.StatusNotFound {
		e.ResponseWriter.WriteHeader(code)
		return
	}
	e.swallow = true
	h := e.Header()
	h.Del("Content-Length")
	h.Del("X-Content-Type-Options")
	h.Set("Content-Type", "application/json")
	e.ResponseWriter.WriteHeader(code)
	json.NewEncoder(e.ResponseWriter).Encode(map[string]any{"jsonrpc": "2.0", "id": nil, "error": map[string]any{"code": -32001, "message": fmt.Sprintf(
		"this MCP session has ended (it was ended with an HTTP DELETE, the server restarted, or it had no requests for %s while no event stream was open); initialize a new one. The server's Python sessions are not tied to it: use their session_id from the new MCP session.", e.idle)}})
}

func (e *endedWriter) Write(p []byte) (int, error) {
	if e.swallow {
		return len(p), nil
	}
	return e.ResponseWriter.Write(p)
}

// Flush keeps event streams working through the wrapper.
func (e *endedWriter) Flush() {
	if f, ok := e.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the real writer.
func (e *endedWriter) Unwrap() http.ResponseWriter { return e.ResponseWriter }

// streamCaps bounds the sessionless requests in flight, per caller and
// in all, as sessions are bounded.
type streamCaps struct {
	lim SessionLimits
	// sessions counts a caller's MCP sessions (and the server's): they
	// share the caps. It takes the sessions' lock, never held with mu.
	sessions func(who string) (mine, all int)
	mu       sync.Mutex
	byCaller map[string]int
	total    int
}

func (s *streamCaps) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		who := callerOf(r)
		smine, sall := s.sessions(who)
		s.mu.Lock()
		mine, all := s.byCaller[who]+smine, s.total+sall
		switch {
		case mine >= s.lim.PerCaller:
			s.mu.Unlock()
			refuse(w, r, fmt.Sprintf("too many requests in flight: %s %d MCP sessions and sessionless requests open at once, the most one caller may have (--max-mcp-sessions-per-caller); close event streams you no longer read (subscriptions/listen) and MCP sessions you no longer use, or wait for calls to finish.", subject(who), mine))
			return
		case all >= s.lim.Total:
			s.mu.Unlock()
			refuse(w, r, fmt.Sprintf("too many requests in flight: this server has %d MCP sessions and sessionless requests open, the most it keeps (--max-mcp-sessions); retry shortly.", all))
			return
		}
		s.byCaller[who]++
		s.total++
		s.mu.Unlock()
		defer func() {
			s.mu.Lock()
			if s.byCaller[who]--; s.byCaller[who] <= 0 {
				delete(s.byCaller, who)
			}
			s.total--
			s.mu.Unlock()
		}()
		next.ServeHTTP(w, r)
	})
}
