package tools

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/egress"
	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/policy"
	"github.com/pysandbox/pysandbox/internal/sandbox"
)

// A run's network: each one-shot run, and each session, gets a grant of
// the proxy (internal/egress) serving its sandbox's listener. A grant's
// connections are recorded under the tool call they happen in.

// callIDKey carries the id of the call a handler serves (its audit
// record's, or the forwarding replica's), which ties the connections and
// upstream calls of its run to it.
type callIDKey struct{}

func withCallID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, callIDKey{}, id)
}

func callIDOf(ctx context.Context) string {
	id, _ := ctx.Value(callIDKey{}).(string)
	return id
}

// networkOn reports whether runs may reach any host now.
func (s *server) networkOn() bool {
	return s.net != nil && s.eng.Config().Network && s.net.Rules().Enabled()
}

// runNetwork is the network of a one-shot run: a grant for this call,
// asking the user through this call's client. usage reports what the run
// did once it is over (nil when it had no network).
func (s *server) runNetwork(ctx context.Context, req *mcp.CallToolRequest, tool string) (attach engine.NetAttach, usage func() *NetUsage) {
	if !s.networkOn() {
		return nil, func() *NetUsage { return nil }
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
	return attach, func() *NetUsage {
		if g == nil {
			return nil
		}
		return netUsage(g.Usage())
	}
}

func netUsage(u egress.Usage) *NetUsage {
	return &NetUsage{Connections: u.Connections, Refused: u.Refused, BytesIn: u.BytesIn, BytesOut: u.BytesOut, LimitsHit: u.LimitsHit}
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
func (s *server) sessionCall(ctx context.Context, req *mcp.CallToolRequest, id string) func() *NetUsage {
	s.netMu.Lock()
	n := s.sessNets[id]
	s.netMu.Unlock()
	if n == nil {
		return func() *NetUsage { return nil }
	}
	n.grant.SetCall(egress.Info{Identity: identity(req), Tool: "run_python", CallID: callIDOf(ctx), Session: id})
	n.mu.Lock()
	n.ask = s.asker(ctx, req, "run_python", "session")
	n.mu.Unlock()
	return func() *NetUsage {
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
		return s.consent(ctx, req, gctx, consentAsk{
			question: fmt.Sprintf("The Python code of this %s call wants to connect to %s (host %s, port %d) through pysandbox's network proxy. "+
				"Allow it? The answer holds for this %s.", tool, target, host, port, scope),
			subject: target, rules: "network policy", what: "the connection to " + target,
			instead: fmt.Sprintf("ask the user to allow %s in the server's network policy", host),
		})
	}
}

// consentAsk is one question to the user in the middle of a call.
type consentAsk struct {
	question string // what the user is asked
	subject  string // what needs approval, e.g. "example.org:443"
	rules    string // the rules that require it, e.g. "network policy"
	what     string // what is refused when the user says no
	instead  string // what to do when the user cannot be asked
}

// consent asks the user, through the client of the MCP call in progress
// (ctx, req), to allow something the code wants while it runs; gctx ends
// with the code's own wait. Clients that cannot be asked mid-call get a
// refusal saying what to do instead.
func (s *server) consent(ctx context.Context, req *mcp.CallToolRequest, gctx context.Context, a consentAsk) error {
	if req == nil || !canElicit(req) {
		return fmt.Errorf("%s needs the user's approval under the server's %s, and this client cannot ask its user (no MCP elicitation); %s", a.subject, a.rules, a.instead)
	}
	if p := req.Session.InitializeParams(); p != nil && p.ProtocolVersion >= "2026-07-28" {
		return fmt.Errorf("%s needs the user's approval under the server's %s, and MCP %s cannot ask the user in the middle of a call; %s", a.subject, a.rules, p.ProtocolVersion, a.instead)
	}
	ectx, cancel := context.WithTimeout(ctx, approvalWait)
	defer cancel()
	stop := context.AfterFunc(gctx, cancel)
	defer stop()
	res, err := req.Session.Elicit(ectx, &mcp.ElicitParams{
		Message:         a.question,
		RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{}},
	})
	switch {
	case err != nil:
		return fmt.Errorf("%s needs the user's approval, and asking failed: %v", a.subject, err)
	case res.Action != "accept":
		return fmt.Errorf("the user did not allow %s (%s); do not retry it", a.what, res.Action)
	}
	return nil
}

// networkSummary is the network part of check_environment; nil when runs
// have no network.
func (s *server) networkSummary() *engine.NetworkPolicy {
	if !s.networkOn() {
		return nil
	}
	r := s.net.Rules()
	names := func(rules []policy.HostRule) []string {
		out := []string{}
		for _, h := range rules {
			out = append(out, h.String())
		}
		return out
	}
	return &engine.NetworkPolicy{
		Proxy: fmt.Sprintf("http://127.0.0.1:%d", sandbox.ProxyPort),
		Allow: names(r.Allow), Approve: names(r.Approve), Deny: names(r.Deny),
		BytesIn: r.Limits.BytesIn, BytesOut: r.Limits.BytesOut, Connections: r.Limits.Connections,
		ConnectionSeconds: int64(r.Limits.ConnTime / time.Second),
	}
}

func networkText(n *engine.NetworkPolicy) string {
	if n == nil {
		return "network: none; runs cannot connect anywhere\n"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "network: only through the server's proxy (HTTP_PROXY and HTTPS_PROXY point to %s), to these hosts:\n", n.Proxy)
	fmt.Fprintf(&b, "  allow:   %s\n", orNone(n.Allow))
	if len(n.Approve) > 0 {
		fmt.Fprintf(&b, "  approve: %s (the user is asked first)\n", strings.Join(n.Approve, ", "))
	}
	if len(n.Deny) > 0 {
		fmt.Fprintf(&b, "  deny:    %s\n", strings.Join(n.Deny, ", "))
	}
	fmt.Fprintf(&b, "  per run: %d MiB in, %d MiB out, %d connections, each open at most %ds; internal addresses are refused unless a rule names them\n",
		n.BytesIn>>20, n.BytesOut>>20, n.Connections, n.ConnectionSeconds)
	return b.String()
}

func orNone(list []string) string {
	if len(list) == 0 {
		return "(none)"
	}
	return strings.Join(list, ", ")
}

// networkWords say in a few words what network a run has, for the
// descriptions and the approval message.
func (s *server) networkWords() string {
	if !s.networkOn() {
		return "no network"
	}
	return "network only to the hosts the server's policy allows, through its proxy"
}

// urlRE finds the http(s) URLs a piece of code names literally.
var urlRE = regexp.MustCompile(`https?://[A-Za-z0-9.\-_\[\]:]+`)

// NetworkTarget is a host that code names in a URL, and what the network
// policy says about it.
type NetworkTarget struct {
	URL      string `json:"url"`
	Host     string `json:"host"`
	Port     int    `json:"port"`
	Decision string `json:"decision"` // allow, approve, deny
}

// networkTargets checks the URLs code names against the network policy:
// validate_script's warning about a fetch that will be refused.
func (s *server) networkTargets(code string) ([]NetworkTarget, []string) {
	var out []NetworkTarget
	var problems []string
	seen := map[string]bool{}
	for _, u := range urlRE.FindAllString(code, 50) {
		scheme, hostport, _ := strings.Cut(u, "://")
		def := 80
		if scheme == "https" {
			def = 443
		}
		host, port, err := policy.SplitHostPort(hostport, def)
		if err != nil || seen[host+":"+strconv.Itoa(port)] {
			continue
		}
		seen[host+":"+strconv.Itoa(port)] = true
		t := NetworkTarget{URL: u, Host: host, Port: port, Decision: string(policy.Deny)}
		if s.networkOn() {
			a, _ := s.net.Rules().Decide(host, port)
			t.Decision = string(a)
		}
		switch t.Decision {
		case string(policy.Deny):
			if s.networkOn() {
				problems = append(problems, fmt.Sprintf("the code names %s, and the network policy does not allow %s:%d (check_environment lists the hosts it allows)", u, host, port))
			} else {
				problems = append(problems, fmt.Sprintf("the code names %s, and runs on this server have no network", u))
			}
		}
		out = append(out, t)
	}
	return out, problems
}
