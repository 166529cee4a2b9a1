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
	"golang.org/x/sync/semaphore"
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

// Bounds of the forwarder.
const (
	// connectTimeout bounds reaching a replica; a replica that could not
	// be reached is not tried again for failedFor.
	connectTimeout = 3 * time.Second
	failedFor      = 3 * time.Second
	// maxForwardBytes bounds the arguments of calls being forwarded at
	// once (uploads are the large ones): more wait for their turn.
	maxForwardBytes = 128 << 20
)

// Forwarder re-issues calls at the replica that owns their session, over
// its internal endpoint, one MCP client per replica incarnation.
type Forwarder struct {
	c     *Cluster
	token string
	hc    *http.Client
	bytes *semaphore.Weighted

	mu    sync.Mutex
	peers map[string]*peer // by member tag
}

// peer is the connection to one replica; its own lock, so that one that
// does not answer holds up only the calls for it.
type peer struct {
	mu       sync.Mutex
	cs       *mcp.ClientSession
	failedAt time.Time
	err      error
}

// NewForwarder returns a Forwarder that authenticates with token (every
// replica's --replica-token-file).
func (c *Cluster) NewForwarder(token string) *Forwarder {
	return &Forwarder{c: c, token: token, peers: map[string]*peer{}, bytes: semaphore.NewWeighted(maxForwardBytes),
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

func (f *Forwarder) peer(m Member) *peer {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.peers[m.Tag()]
	if p == nil {
		p = &peer{}
		f.peers[m.Tag()] = p
	}
	return p
}

func (f *Forwarder) session(ctx context.Context, m Member) (*mcp.ClientSession, error) {
	p := f.peer(m)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cs != nil {
		return p.cs, nil
	}
	if time.Since(p.failedAt) < failedFor {
		return nil, p.err
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "pysandbox-replica-" + f.c.self.Name, Version: "1"}, &mcp.ClientOptions{
		// Input requests (approvals) go back to the forwarding replica's
		// client, as they are.
		MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true},
		Capabilities:   &mcp.ClientCapabilities{},
	})
	cctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	cs, err := client.Connect(cctx, &mcp.StreamableClientTransport{Endpoint: m.Internal + InternalPath, HTTPClient: f.hc, MaxRetries: -1}, nil)
	if err != nil {
		p.failedAt, p.err = time.Now(), err
		return nil, err
	}
	p.cs = cs
	return cs, nil
}

func (f *Forwarder) drop(m Member, cs *mcp.ClientSession) {
	p := f.peer(m)
	p.mu.Lock()
	if p.cs == cs {
		p.cs = nil
	}
	p.mu.Unlock()
	cs.Close()
}

// Forget drops the connections to replicas not in live.
func (f *Forwarder) Forget(live []Member) {
	keep := map[string]bool{}
	for _, m := range live {
		keep[m.Tag()] = true
	}
	f.mu.Lock()
	var gone []*peer
	for tag, p := range f.peers {
		if !keep[tag] {
			gone = append(gone, p)
			delete(f.peers, tag)
		}
	}
	f.mu.Unlock()
	for _, p := range gone {
		p.mu.Lock()
		if p.cs != nil {
			p.cs.Close()
		}
		p.mu.Unlock()
	}
}

// Call makes the call at m for identity; callID ties it to the audit
// record this replica writes. size is the arguments' size, for the bound
// on what is forwarded at once.
func (f *Forwarder) Call(ctx context.Context, m Member, p *mcp.CallToolParams, identity, callID string, size int64) (*mcp.CallToolResult, error) {
	size = min(max(size, 1), maxForwardBytes)
	if err := f.bytes.Acquire(ctx, size); err != nil {
		return nil, err
	}
	defer f.bytes.Release(size)
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
		// The connection is shared by every call to that replica: close it
		// only when it is the connection that failed, not one request.
		if !errors.Is(err, mcp.ErrConnectionClosed) {
			return nil, fmt.Errorf("%w (%v)", ErrUnreachable, err)
		}
		f.drop(m, cs)
		if attempt > 0 {
			return nil, fmt.Errorf("%w (%v)", ErrUnreachable, err)
		}
	}
}

// Close closes the clients.
func (f *Forwarder) Close() { f.Forget(nil) }

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
