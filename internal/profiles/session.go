package profiles

import (
	"context"
	"github.com/pysandbox/pysandbox/internal/govern"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/tools"
)

// workspaces gives each caller one session of its own, made on first
// use and made again when it has expired: the place mcp-run-python-code's
// files live (the peer keeps one temporary directory for the whole
// server, shared by every caller; here no caller sees another's).
type workspaces struct {
	mu   sync.Mutex
	byID map[string]string // identity -> session id
}

func newWorkspaces() *workspaces { return &workspaces{byID: map[string]string{}} }

// get returns the caller's session, creating it when needed; refused is
// the result to return when none could be had.
func (w *workspaces) get(ctx context.Context, h *tools.Host, req *mcp.CallToolRequest) (string, *govern.Refusal) {
	me := h.CallerKey(req)
	if me == "" {
		// Nothing ties two calls of this caller together, and a session
		// kept under a shared name would hand one caller's files to
		// another.
		return "", tools.Refusal(govern.StatusInvalidRequest, "This tool keeps your files in a workspace of your own, and on this server nothing tells you apart from other callers: you have no token, and your client uses the sessionless protocol (2026-07-28). Connect with a bearer token (the server's --auth-token-file), or with a client that keeps an MCP session.")
	}
	w.mu.Lock()
	id := w.byID[me]
	w.mu.Unlock()
	if id != "" {
		for _, s := range h.Sessions(req) {
			if s.ID == id {
				return id, nil
			}
		}
	}
	out, refused := h.CreateSession(ctx, req, tools.CreateSessionInput{})
	if refused != nil {
		return "", refused
	}
	w.mu.Lock()
	// Forget callers whose session has ended: without tokens every
	// connection is a caller of its own, and the map would only grow.
	for k, id := range w.byID {
		if !h.SessionExists(id) {
			delete(w.byID, k)
		}
	}
	w.byID[me] = out.SessionID
	w.mu.Unlock()
	return out.SessionID, nil
}

// runIn runs code in a session with inputs (JSON-encoded here, so that
// no argument is ever pasted into code).
func runIn(ctx context.Context, h *tools.Host, req *mcp.CallToolRequest, session, code, filename string, inputs map[string]any) (*engine.Result, *govern.Refusal) {
	return h.Run(ctx, req, tools.RunPythonInput{Code: code, Inputs: inputs, SessionID: session, Filename: filename})
}

// helperIn is runIn for the profile's own code (a file listing, a
// version): its outcome is not the call's.
func helperIn(ctx context.Context, h *tools.Host, req *mcp.CallToolRequest, session, code string, inputs map[string]any) (*engine.Result, *govern.Refusal) {
	return h.Helper(ctx, req, tools.RunPythonInput{Code: code, Inputs: inputs, SessionID: session, Filename: "<pysandbox>"})
}

// jsonText is v as JSON indented by two spaces (pydantic_core.to_json's
// indent=2 output, which the peers' FastMCP servers send).
func jsonText(v any) string {
	return returnText(v)
}

// textResult is one text block.
func textResult(text string, maxReply int64) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: cutText(text, maxReply)}}}
}

// wrappedCut is wrapped(text), bounded by the reply limit (the text goes
// twice: as content and as the structured result).
func wrappedCut(h *tools.Host, text string) (*mcp.CallToolResult, *WrappedText, error) {
	return wrapped(cutText(text, h.MaxReply()/2))
}
