package cluster

import (
	"cmp"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
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

// CancelTool is the internal tool that stops a forwarded call whose
// caller cancelled it (arguments: call_id; the identity in _meta). The
// internal endpoint is stateless, so the SDK's notifications/cancelled
// arrives in a request of its own and reaches nothing.
const CancelTool = "pysandbox_cancel_call"

// InternalPath is where a replica serves the others.
const InternalPath = "/internal/mcp"

// forwardProtocol is the MCP version the forwarder speaks to the owners'
// internal endpoints (stateless servers). The SDK's default, the
// sessionless 2026-07-28 flow, made each forwarded call's round trip
// 0.7 ms longer between two replicas on a loaded 2-core machine (0.3 ms
// within one process) in go-sdk v1.8.0: more JSON for both ends to write
// and parse again (_meta on every request and result, Mcp-* headers
// checked against the body). This hop uses nothing of it: the forwarder
// asks for no capability, and the owner runs no governance, so never
// asks for input. bench --replicas measures the hop.
const forwardProtocol = "2025-11-25"

// Bounds of the forwarder.
const (
	// connectTimeout bounds reaching a replica; a replica that could not
	// be reached is not tried again for failedFor.
	connectTimeout = 3 * time.Second
	failedFor      = 3 * time.Second
	// maxForwardBytes bounds the arguments of calls being forwarded at
	// once (uploads are the large ones): more wait for their turn.
	maxForwardBytes = 128 << 20
	// maxForwardShare is one caller's part of it.
	maxForwardShare = maxForwardBytes / 4
)

// Forwarder re-issues calls at the replica that owns their session, over
// its internal endpoint, one MCP client per replica incarnation.
type Forwarder struct {
	c     *Cluster
	token string
	hc    *http.Client
	bytes *semaphore.Weighted

	// held is each caller's share of bytes in flight: a forwarded call
	// holds its arguments' bytes until the owner answers (its whole run),
	// so one caller's long calls could otherwise hold them all.
	heldMu sync.Mutex
	held   map[string]int64

	mu    sync.Mutex
	peers map[string]*peer // by member tag

	// progress relays the owners' progress notifications (live output,
	// the heartbeat) to the callers of the calls in flight, by the token
	// each forwarded call was given.
	progMu   sync.Mutex
	progress map[string]func(*mcp.ProgressNotificationParams)
	progSeq  atomic.Uint64
}

// maxIdlePerReplica is how many connections to one replica are kept
// between calls: the calls forwarded at once each hold one, and with
// http.DefaultTransport's two, every third would open a connection and
// close it after.
const maxIdlePerReplica = 64

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
	base := http.DefaultTransport.(*http.Transport).Clone()
	base.MaxIdleConnsPerHost = maxIdlePerReplica
	return &Forwarder{c: c, token: token, peers: map[string]*peer{}, bytes: semaphore.NewWeighted(maxForwardBytes), held: map[string]int64{}, progress: map[string]func(*mcp.ProgressNotificationParams){},
		hc: &http.Client{Transport: &bearer{token: token, base: base}}}
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
		MultiRoundTrip:              &mcp.MultiRoundTripOptions{Disabled: true},
		Capabilities:                &mcp.ClientCapabilities{},
		ProgressNotificationHandler: f.relayProgress,
	})
	cctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	cs, err := client.Connect(cctx, &mcp.StreamableClientTransport{Endpoint: m.Internal + InternalPath, HTTPClient: f.hc, MaxRetries: -1},
		&mcp.ClientSessionOptions{ProtocolVersion: forwardProtocol})
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
		cs := p.cs
		p.cs = nil
		p.mu.Unlock()
		if cs != nil {
			// Close waits for the calls in flight on it: not here, where
			// the caller (list_sessions) is waiting.
			go cs.Close()
		}
	}
}

// relayProgress hands an owner's progress notification to the call it
// belongs to; one for a call that has ended is dropped.
func (f *Forwarder) relayProgress(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
	tok, ok := r.Params.ProgressToken.(string)
	if !ok {
		return
	}
	f.progMu.Lock()
	fn := f.progress[tok]
	f.progMu.Unlock()
	if fn != nil {
		fn(r.Params)
	}
}

// Call makes the call at m for identity; callID ties it to the audit
// record this replica writes. size is the arguments' size, for the bound
// on what is forwarded at once.
func (f *Forwarder) Call(ctx context.Context, m Member, p *mcp.CallToolParams, identity, callID string, size int64) (*mcp.CallToolResult, error) {
	return f.CallProgress(ctx, m, p, identity, callID, size, nil)
}

// CallProgress is Call for a caller that asked for progress: the owner's
// notifications for the call (its live output and heartbeat, which keep a
// client from timing out a long run) reach progress, which sends them on
// with the caller's own token.
func (f *Forwarder) CallProgress(ctx context.Context, m Member, p *mcp.CallToolParams, identity, callID string, size int64, progress func(*mcp.ProgressNotificationParams)) (*mcp.CallToolResult, error) {
	size = min(max(size, 1), maxForwardBytes)
	f.heldMu.Lock()
	if f.held[identity]+size > maxForwardShare && f.held[identity] > 0 {
		mine := f.held[identity]
		f.heldMu.Unlock()
		return nil, fmt.Errorf("%w: %d MiB of your calls' arguments are in flight to other replicas, the most one caller may have (%d MiB); wait for some to finish", ErrBusy, mine>>20, maxForwardShare>>20)
	}
	f.held[identity] += size
	f.heldMu.Unlock()
	defer func() {
		f.heldMu.Lock()
		if f.held[identity] -= size; f.held[identity] <= 0 {
			delete(f.held, identity)
		}
		f.heldMu.Unlock()
	}()
	if err := f.bytes.Acquire(ctx, size); err != nil {
		return nil, err
	}
	defer f.bytes.Release(size)
	params := *p
	params.Meta = mcp.Meta{MetaIdentity: identity, MetaCallID: callID}
	if progress != nil {
		// A token of this replica's own: the caller's may be anything,
		// and two callers' may be equal.
		tok := fmt.Sprintf("fwd-%d", f.progSeq.Add(1))
		params.SetProgressToken(tok)
		f.progMu.Lock()
		f.progress[tok] = progress
		f.progMu.Unlock()
		defer func() {
			f.progMu.Lock()
			delete(f.progress, tok)
			f.progMu.Unlock()
		}()
	}
	fctx, cancel := detached(ctx)
	defer cancel()
	var res *mcp.CallToolResult
	err := f.do(fctx, m, "tools/call", func(cs *mcp.ClientSession) (err error) {
		res, err = cs.CallTool(fctx, &params)
		return err
	})
	if err != nil {
		// fctx ends with ctx, a moment after it.
		if err := cmp.Or(ctx.Err(), fctx.Err()); err != nil {
			if callID != "" {
				go f.cancelAt(m, callID, identity)
			}
			return nil, err
		}
		if !errors.Is(err, ErrUnreachable) {
			err = f.unreachable(m, "tools/call", err)
		}
		return nil, err
	}
	res.Meta = ownMeta(res.Meta)
	return res, nil
}

// cancelAt stops the call callID at m, whose caller gave up on it. Best
// effort: a run the owner cannot be told about ends at its timeout.
func (f *Forwarder) cancelAt(m Member, callID, identity string) {
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	f.do(ctx, m, CancelTool, func(cs *mcp.ClientSession) error {
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: CancelTool, Arguments: map[string]any{"call_id": callID},
			Meta: mcp.Meta{MetaIdentity: identity}})
		return err
	})
}

// ReadResource reads uri at m for identity. An error the owner answered
// with (the resource not found, too large) is returned as it came, a
// *jsonrpc.Error, for this replica to answer with in turn.
func (f *Forwarder) ReadResource(ctx context.Context, m Member, uri, identity string) (*mcp.ReadResourceResult, error) {
	params := &mcp.ReadResourceParams{URI: uri, Meta: mcp.Meta{MetaIdentity: identity}}
	fctx, cancel := detached(ctx)
	defer cancel()
	var res *mcp.ReadResourceResult
	err := f.do(fctx, m, "resources/read", func(cs *mcp.ClientSession) (err error) {
		res, err = cs.ReadResource(fctx, params)
		return err
	})
	if err != nil {
		if answer := ownerAnswer(err); answer != nil {
			return nil, answer
		}
		if err := cmp.Or(ctx.Err(), fctx.Err()); err != nil {
			return nil, err
		}
		if !errors.Is(err, ErrUnreachable) {
			err = f.unreachable(m, "resources/read", err)
		}
		return nil, err
	}
	res.Meta = ownMeta(res.Meta)
	return res, nil
}

// do runs call on the connection to m, and once more on a new connection
// when that one turned out closed. The connection is shared by every call
// to that replica: it is closed only when it is the connection that
// failed, not one request. A connection that cannot be made is
// ErrUnreachable; call's own errors are returned as they are.
func (f *Forwarder) do(ctx context.Context, m Member, method string, call func(*mcp.ClientSession) error) error {
	for attempt := 0; ; attempt++ {
		cs, err := f.session(ctx, m)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return f.unreachable(m, method, err)
		}
		err = call(cs)
		if err == nil || ctx.Err() != nil || !errors.Is(err, mcp.ErrConnectionClosed) {
			return err
		}
		f.drop(m, cs)
		if attempt > 0 {
			return err
		}
	}
}

// detached is ctx's deadline and cancellation without its values. The
// forwarded request is a new client request, not part of the one this
// replica serves: the SDK's client reads values of a server's request
// context as its own (the protocol version of the caller's request became
// the Mcp-Protocol-Version header of the forwarder's initialize).
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	base, cancel := context.WithCancel(context.Background())
	d, stopDeadline := base, context.CancelFunc(func() {})
	if deadline, ok := ctx.Deadline(); ok {
		d, stopDeadline = context.WithDeadline(base, deadline)
	}
	stop := context.AfterFunc(ctx, cancel)
	return d, func() { stop(); stopDeadline(); cancel() }
}

// CodeNotHere is the JSON-RPC error code of an owner's answer to a read
// of what it no longer serves (a session it handed over): not an answer
// for the caller, but a reason to ask the store where it is now.
const CodeNotHere = -32090

// rejected is the code of the SDK's own error for a request that failed on
// its way (jsonrpc2.ErrRejected, internal to the SDK).
const rejected = -32005

// ownerAnswer is the error the owner answered a request with, nil when
// the request failed otherwise. The SDK wraps both in its errors: an
// answer that came with an HTTP error status (an invalid-params one, "not
// found" among them) is its error followed by ErrRejected, a request that
// failed on its way ErrRejected first.
func ownerAnswer(err error) *jsonrpc.Error {
	var answer *jsonrpc.Error
	if !errors.As(err, &answer) || answer.Code == rejected || answer.Code == CodeNotHere {
		return nil
	}
	return answer
}

// unreachable is the error a client gets for a request to m that failed
// on the way: the cause names the owner's internal endpoint, so it is
// logged here, not shown.
func (f *Forwarder) unreachable(m Member, method string, err error) error {
	f.c.log.Warn("cluster: a request forwarded to another replica failed", "replica", m.Name, "method", method, "err", err)
	return ErrUnreachable
}

// ownMeta is a forwarded result's _meta without what the owner's internal
// server put there for this hop (the protocol's keys: its serverInfo names
// it, "pysandbox-internal"). The server answering the client adds its own.
func ownMeta(meta mcp.Meta) mcp.Meta {
	for k := range meta {
		if strings.HasPrefix(k, "io.modelcontextprotocol/") {
			delete(meta, k)
		}
	}
	if len(meta) == 0 {
		return nil
	}
	return meta
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
