package tools

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/audit"
	"github.com/pysandbox/pysandbox/internal/egress"
	"github.com/pysandbox/pysandbox/internal/engine"
)

// A run's network: each one-shot run, and each session, gets a grant of
// the proxy (internal/egress) serving its sandbox's listener. A grant's
// connections are recorded under the tool call they happen in.

// newCallID names a tool call in the audit log, so that its connections
// can be tied to it.
func newCallID() string {
	var b [8]byte
	rand.Read(b[:])
	return "c-" + hex.EncodeToString(b[:])
}

func callIDOf(ctx context.Context) string {
	if ci, ok := ctx.Value(callInfoKey{}).(*callInfo); ok {
		return ci.callID
	}
	return ""
}

// networkOn reports whether runs may reach any host now.
func (s *server) networkOn() bool { return s.net != nil && s.net.Rules().Enabled() }

// runNetwork is the network of a one-shot run: a grant for this call,
// asking the user through this call's client. usage reports what the run
// did once it is over (nil when it had no network).
func (s *server) runNetwork(ctx context.Context, req *mcp.CallToolRequest, tool string) (attach engine.NetAttach, usage func() *engine.NetUsage) {
	if !s.networkOn() {
		return nil, func() *engine.NetUsage { return nil }
	}
	var g *egress.Grant
	attach = func(l net.Listener) func() {
		g = s.net.NewGrant(egress.GrantConfig{
			Info: egress.Info{Identity: identity(req), Tool: tool, CallID: callIDOf(ctx)},
			Ask:  s.asker(ctx, req, tool, "call"),
		})
		g.Serve(l)
		return g.Close
	}
	// (g is set by the engine before Run returns, and read after.)
	return attach, func() *engine.NetUsage {
		if g == nil {
			return nil
		}
		return netUsage(g.Usage())
	}
}

func netUsage(u egress.Usage) *engine.NetUsage {
	return &engine.NetUsage{Connections: u.Connections, Refused: u.Refused, BytesIn: u.BytesIn, BytesOut: u.BytesOut, LimitsHit: u.LimitsHit}
}

// sessionNet is a session's network: one grant for its life, moved on to
// each call made in it. Between calls (a thread the code left running)
// nobody can be asked, so approve hosts not yet approved are refused.
type sessionNet struct {
	grant *egress.Grant
	mu    sync.Mutex
	ask   func(context.Context, string, int) error
}

func (n *sessionNet) askNow(ctx context.Context, host string, port int) error {
	n.mu.Lock()
	ask := n.ask
	n.mu.Unlock()
	if ask == nil {
		return fmt.Errorf("%s needs the user's approval under the server's network policy, and no call of the session is in progress to ask through; connect during a run_python call", net.JoinHostPort(host, strconv.Itoa(port)))
	}
	return ask(ctx, host, port)
}

// sessionNetwork prepares the network of a session being created.
func (s *server) sessionNetwork(ctx context.Context, req *mcp.CallToolRequest) (*sessionNet, engine.NetAttach) {
	if !s.networkOn() {
		return nil, nil
	}
	n := &sessionNet{}
	return n, func(l net.Listener) func() {
		n.grant = s.net.NewGrant(egress.GrantConfig{
			Info: egress.Info{Identity: identity(req), Tool: "create_session", CallID: callIDOf(ctx)},
			Ask:  n.askNow,
		})
		n.grant.Serve(l)
		return n.grant.Close
	}
}

// keepSessionNet remembers a created session's network.
func (s *server) keepSessionNet(id string, n *sessionNet) {
	if n == nil || n.grant == nil {
		return
	}
	n.grant.SetCall(egress.Info{Identity: n.grant.Info().Identity, Tool: "create_session", CallID: n.grant.Info().CallID, Session: id})
	live := map[string]bool{}
	for _, si := range s.sessions.List() {
		live[si.ID] = true
	}
	s.netMu.Lock()
	defer s.netMu.Unlock()
	// Sessions that ended since: their grants are closed already.
	for sid := range s.sessNets {
		if !live[sid] {
			delete(s.sessNets, sid)
		}
	}
	s.sessNets[id] = n
}

// sessionCall moves a session's network on to this call; the returned
// function ends the call's part and reports its usage.
func (s *server) sessionCall(ctx context.Context, req *mcp.CallToolRequest, id string) func() *engine.NetUsage {
	s.netMu.Lock()
	n := s.sessNets[id]
	s.netMu.Unlock()
	if n == nil {
		return func() *engine.NetUsage { return nil }
	}
	n.grant.SetCall(egress.Info{Identity: identity(req), Tool: "run_python", CallID: callIDOf(ctx), Session: id})
	n.mu.Lock()
	n.ask = s.asker(ctx, req, "run_python", "session")
	n.mu.Unlock()
	return func() *engine.NetUsage {
		n.mu.Lock()
		n.ask = nil
		n.mu.Unlock()
		return netUsage(n.grant.Usage())
	}
}

// approvalWait bounds how long a connection waits for the user.
const approvalWait = 2 * time.Minute

// asker asks the user, through the client of the call in progress,
// whether the code may connect to a host under an approve rule.
func (s *server) asker(ctx context.Context, req *mcp.CallToolRequest, tool, scope string) func(context.Context, string, int) error {
	return func(gctx context.Context, host string, port int) error {
		target := net.JoinHostPort(host, strconv.Itoa(port))
		if !canElicit(req) {
			return fmt.Errorf("%s needs the user's approval under the server's network policy, and this client cannot ask its user (no MCP elicitation); ask the user to allow %s in the server's network policy", target, host)
		}
		if p := req.Session.InitializeParams(); p != nil && p.ProtocolVersion >= "2026-07-28" {
			return fmt.Errorf("%s needs the user's approval under the server's network policy, and MCP %s cannot ask the user in the middle of a call; ask the user to allow %s in the server's network policy", target, p.ProtocolVersion, host)
		}
		ectx, cancel := context.WithTimeout(ctx, approvalWait)
		defer cancel()
		stop := context.AfterFunc(gctx, cancel)
		defer stop()
		res, err := req.Session.Elicit(ectx, &mcp.ElicitParams{
			Message: fmt.Sprintf("The Python code of this %s call wants to connect to %s (host %s, port %d) through pysandbox's network proxy. "+
				"Allow it? The answer holds for this %s.", tool, target, host, port, scope),
			RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{}},
		})
		switch {
		case err != nil:
			return fmt.Errorf("%s needs the user's approval, and asking failed: %v", target, err)
		case res.Action != "accept":
			return fmt.Errorf("the user did not allow the connection to %s (%s); do not retry it", target, res.Action)
		}
		return nil
	}
}

// netRecord writes a connection's audit record and counts it.
func (g *governor) netRecord(r egress.Record) {
	g.metrics.NetConn(r.Decision, r.BytesIn, r.BytesOut)
	if g.audit == nil {
		return
	}
	rec := &audit.Record{Event: audit.EventConnect, Identity: r.Identity, Tool: r.Tool, CallID: r.CallID,
		Decision: r.Decision, Reason: r.Reason, DurationMS: r.Duration.Milliseconds(),
		Net: &audit.Connection{Method: r.Method, Host: r.Host, Port: r.Port, Address: r.Address, Session: r.Session, BytesIn: r.BytesIn, BytesOut: r.BytesOut}}
	if r.Limit != "" {
		rec.LimitsHit = []string{"net:" + r.Limit}
	}
	if err := g.audit.Append(rec); err != nil {
		g.mu.Lock()
		if g.broken == nil {
			g.broken = err
		}
		g.mu.Unlock()
		g.log.Error("audit log write failed; refusing every call from now on", "err", err)
	}
}
