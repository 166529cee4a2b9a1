package cluster

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Keys of the _meta a forwarded call carries: who the caller is and which
// call of the forwarding replica's audit log it is. The internal endpoint
// trusts them because only replicas hold its token.
const (
	MetaIdentity = "pysandbox/identity"
	MetaCallID   = "pysandbox/call_id"
)

// InternalPath is where a replica serves the others.
const InternalPath = "/internal/mcp"

// Forwarder re-issues calls at the replica that owns their session, over
// its internal endpoint, one MCP client per replica incarnation.
type Forwarder struct {
	c     *Cluster
	token string
	hc    *http.Client

	mu      sync.Mutex
	clients map[string]*mcp.ClientSession // by member tag
}

// NewForwarder returns a Forwarder that authenticates with token (every
// replica's --replica-token-file).
func (c *Cluster) NewForwarder(token string) *Forwarder {
	return &Forwarder{c: c, token: token, clients: map[string]*mcp.ClientSession{},
		hc: &http.Client{Transport: &bearer{token: token, base: http.DefaultTransport}}}
}

type bearer struct {
	token string
	base  http.RoundTripper
}

func (b *bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.base.RoundTrip(r)
}

func (f *Forwarder) session(ctx context.Context, m Member) (*mcp.ClientSession, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if cs := f.clients[m.Tag()]; cs != nil {
		return cs, nil
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "pysandbox-replica-" + f.c.self.Name, Version: "1"}, &mcp.ClientOptions{
		// Input requests (approvals) go back to the forwarding replica's
		// client, as they are.
		MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true},
		Capabilities:   &mcp.ClientCapabilities{},
	})
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cs, err := client.Connect(cctx, &mcp.StreamableClientTransport{Endpoint: m.Internal + InternalPath, HTTPClient: f.hc, MaxRetries: -1}, nil)
	if err != nil {
		return nil, err
	}
	f.clients[m.Tag()] = cs
	return cs, nil
}

func (f *Forwarder) drop(m Member, cs *mcp.ClientSession) {
	f.mu.Lock()
	if f.clients[m.Tag()] == cs {
		delete(f.clients, m.Tag())
	}
	f.mu.Unlock()
	cs.Close()
}

// Call makes the call at m for identity; callID ties it to the audit
// record this replica writes.
func (f *Forwarder) Call(ctx context.Context, m Member, p *mcp.CallToolParams, identity, callID string) (*mcp.CallToolResult, error) {
	params := *p
	params.Meta = mcp.Meta{MetaIdentity: identity, MetaCallID: callID}
	for attempt := 0; ; attempt++ {
		cs, err := f.session(ctx, m)
		if err != nil {
			return nil, fmt.Errorf("%w (%v)", ErrUnreachable, err)
		}
		res, err := cs.CallTool(ctx, &params)
		if err == nil {
			return res, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		f.drop(m, cs)
		if attempt > 0 || !errors.Is(err, mcp.ErrConnectionClosed) {
			return nil, fmt.Errorf("%w (%v)", ErrUnreachable, err)
		}
	}
}

// Close closes the clients.
func (f *Forwarder) Close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for k, cs := range f.clients {
		cs.Close()
		delete(f.clients, k)
	}
}

// InternalAuth guards the internal endpoint: only a request with the
// replicas' token gets through, and the identity it carries (in _meta)
// is then the caller's.
func InternalAuth(token string, next http.Handler) http.Handler {
	verify := func(_ context.Context, got string, _ *http.Request) (*auth.TokenInfo, error) {
		if subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{UserID: "replica", Expiration: time.Now().Add(time.Hour)}, nil
	}
	return auth.RequireBearerToken(verify, nil)(next)
}
