package tools

import (
	"context"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/cluster"
)

// Bounds of the calls remembered as cancelled before they arrived.
const (
	maxEarlyCancels = 4096
	earlyCancelTTL  = time.Minute
)

// inbound holds the calls other replicas forwarded here that are in
// flight, so that a forwarding replica whose caller cancels can stop the
// run here too. The MCP cancellation cannot do it: the internal endpoint
// is stateless, so a notifications/cancelled comes in a request of its
// own, with nothing to tie it to the call.
type inbound struct {
	mu    sync.Mutex
	live  map[string]inboundCall // by call id
	early map[string]time.Time   // cancelled before they arrived, and when
}

type inboundCall struct {
	identity string
	cancel   context.CancelFunc
}

func newInbound() *inbound {
	return &inbound{live: map[string]inboundCall{}, early: map[string]time.Time{}}
}

// start registers a forwarded call; its ctx ends when the call is
// cancelled, or at once when it was cancelled before it came. done must
// be called when the call ends.
func (b *inbound) start(ctx context.Context, callID, identity string) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	if callID == "" {
		return ctx, cancel
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.early[callID]; ok {
		delete(b.early, callID)
		cancel()
		return ctx, cancel
	}
	if _, dup := b.live[callID]; dup {
		// Not expected (call ids are random); the first keeps its entry.
		return ctx, cancel
	}
	b.live[callID] = inboundCall{identity: identity, cancel: cancel}
	return ctx, func() {
		b.mu.Lock()
		if c, ok := b.live[callID]; ok && c.identity == identity {
			delete(b.live, callID)
		}
		b.mu.Unlock()
		cancel()
	}
}

// cancel ends the call callID of identity; one that has not arrived yet
// is ended when it does (within earlyCancelTTL). It reports whether the
// call was in flight.
func (b *inbound) cancel(callID, identity string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if c, ok := b.live[callID]; ok {
		if c.identity != identity {
			return false
		}
		c.cancel()
		return true
	}
	now := time.Now()
	for id, at := range b.early {
		if now.Sub(at) > earlyCancelTTL {
			delete(b.early, id)
		}
	}
	if len(b.early) < maxEarlyCancels {
		b.early[callID] = now
	}
	return false
}

// CancelCallInput is the internal cancel tool's input.
type CancelCallInput struct {
	CallID string `json:"call_id"`
}

// cancelForwarded serves cluster.CancelTool: the forwarding replica's
// caller cancelled the call callID, so its run here stops as a cancelled
// call's does on its own replica.
func (s *server) cancelForwarded(_ context.Context, req *mcp.CallToolRequest, in CancelCallInput) (*mcp.CallToolResult, any, error) {
	id, _ := req.Params.GetMeta()[cluster.MetaIdentity].(string)
	if id == "" || in.CallID == "" || len(in.CallID) > 64 {
		return nil, nil, errorResult("a cancel needs the caller's identity and a call id")
	}
	text := "not in flight"
	if s.inbound.cancel(in.CallID, id) {
		text = "cancelled"
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, nil, nil
}
