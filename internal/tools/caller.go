package tools

import (
	"iter"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Who a caller is, and what it owns (the identity table of docs/governance.md).
//
//   - stdio: one client, "stdio".
//   - HTTP with a token: the token's name. Everything it makes is the
//     token's, wherever and however often it connects.
//   - HTTP without a token: "http:anonymous", whether the client keeps an
//     MCP session (protocols before 2026-07-28) or sends every request on
//     its own (2026-07-28). Nothing the transport carries tells two such
//     callers apart (an MCP session costs nothing to open, and the
//     sessionless protocol has none), so quotas, rate limits and waiting
//     approvals are shared by all of them, and what one of them makes is
//     owned through a secret only its maker holds: the 128-bit session id
//     (a capability), the random name of a stored figure. Such ids are
//     never shown to another caller; list_sessions shows a caller the
//     sessions its own connection made or used.
//   - A call another replica forwarded: the identity that replica
//     decided, carried with the call (internal/cluster).

// anonymous is the identity of every HTTP caller without a token.
const anonymous = "http:anonymous"

// caller is who is calling, as far as the transport can tell.
type caller struct {
	// id is the identity: the token's name, "stdio" or anonymous. It
	// owns sessions and figures, and keys quotas and rate limits.
	id string
	// conn names the MCP session of a caller without a token on a
	// sessionful connection ("" otherwise): the sessions listed to it,
	// and those that stop counting against the shared quota once it ends.
	conn string
}

func callerOf(req mcp.Request) caller {
	if ex := req.GetExtra(); ex != nil && ex.TokenInfo != nil && ex.TokenInfo.UserID != "" {
		return caller{id: ex.TokenInfo.UserID}
	}
	if ex := req.GetExtra(); ex != nil && ex.Header != nil {
		c := caller{id: anonymous}
		if ss, ok := req.GetSession().(*mcp.ServerSession); ok && ss.ID() != "" {
			c.conn = connPrefix + ss.ID()
		}
		return c
	}
	return caller{id: "stdio"}
}

const connPrefix = "mcp:"

// anonymous reports whether the caller has no token over HTTP: what it
// owns is reached by capability.
func (c caller) anonymous() bool { return c.id == anonymous }

// key tells this caller apart from every other, for state kept per
// caller outside sessions (a profile's workspace): "" when nothing does
// (HTTP without a token and without an MCP session).
func (c caller) key() string {
	if c.anonymous() {
		return c.conn
	}
	return c.id
}

// identity is the caller's identity (see caller.id).
func identity(req mcp.Request) string { return callerOf(req).id }

// authenticated says whether the caller presented a token.
func authenticated(req mcp.Request) bool {
	ex := req.GetExtra()
	return ex != nil && ex.TokenInfo != nil && ex.TokenInfo.UserID != ""
}

// lists reports whether a session is listed to c: its owner's, and for
// callers without a token only those its own connection made or used
// last, since listing every anonymous session would hand out the ids
// that are their only protection.
func (c caller) lists(owner, holder string) bool {
	if owner != c.id {
		return false
	}
	return !c.anonymous() || (c.conn != "" && holder == c.conn)
}

// connEnded returns the engine's SessionConfig.Detached for srv: whether
// the MCP session a holder names has ended (deleted by its client, or
// closed after being idle).
func connEnded(sessions func() iter.Seq[*mcp.ServerSession]) func(string) bool {
	return func(holder string) bool {
		id, ok := strings.CutPrefix(holder, connPrefix)
		if !ok {
			return false
		}
		for ss := range sessions() {
			if ss.ID() == id {
				return false
			}
		}
		return true
	}
}
