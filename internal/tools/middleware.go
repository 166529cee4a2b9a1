package tools

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/govern"
	"github.com/pysandbox/pysandbox/internal/workspace"
)

// middleware sees every request before the SDK routes it, for what the
// tools' own handlers cannot: a call to a tool the policy hides (the SDK
// would answer "unknown tool"; the caller gets the policy's reason, and
// the call is recorded), and reads of session files, which are governed
// as download_file calls. It wraps the SDK's own multi-round-trip layer,
// so for an older client that is asked for approval with
// elicitation/create it sees the whole exchange as one call.
func (s *server) middleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if rr, ok := req.(*mcp.ReadResourceRequest); ok && method == "resources/read" && rr.Params != nil && strings.HasPrefix(rr.Params.URI, sessionURIPrefix) {
			return s.readResource(ctx, method, rr, next)
		}
		ctr, ok := req.(*mcp.CallToolRequest)
		if method != "tools/call" || !ok || ctr.Params == nil {
			return next(ctx, method, req)
		}
		if a := bytes.TrimSpace(ctr.Params.Arguments); len(a) == 0 || string(a) == "null" {
			// No arguments are an empty object.
			ctr.Params.Arguments = json.RawMessage("{}")
		}
		if pathTools[ctr.Params.Name] {
			// The policy's rules see the path the tool will use.
			ctr.Params.Arguments = canonicalArgs(ctr.Params.Arguments)
		}
		if s.governed[ctr.Params.Name] && s.gov.Policy().Hidden(ctr.Params.Name) {
			// Not registered: refused here, with the reason.
			_, t, ref := s.gov.Admit(ctx, callOf(ctr))
			if ref == nil {
				ref = &govern.Refusal{Status: govern.StatusDenied, Message: fmt.Sprintf("The server's policy does not allow %s. Nothing was run.", ctr.Params.Name)}
			}
			// The client has no output schema for a tool it was never
			// shown: the structured result is the status and message alone,
			// as every refusal has them.
			return s.refused(t, hiddenSchemas, ref, govern.Outcome{Refused: ref})
		}
		return next(ctx, method, req)
	}
}

// hiddenSchemas shape the refusal of a hidden tool's call.
var hiddenSchemas = &schemas{outZero: map[string]any{}, props: map[string]bool{"status": true, "message": true}}

// sessionURIPrefix starts the URIs of session files.
const sessionURIPrefix = "pysandbox://sessions/"

// maxResourceURI bounds a resources/read URI: a session id and a
// workspace path (4 KiB at most, percent-encoded) fit well within it.
const maxResourceURI = 16 << 10

// readResource governs resources/read of session files with
// download_file's rule, since it reads the same files: a policy that
// denies or rate-limits download_file cannot be side-stepped this way.
// Resources have no tool-error result, so refusals are protocol errors.
func (s *server) readResource(ctx context.Context, method string, req *mcp.ReadResourceRequest, next mcp.MethodHandler) (mcp.Result, error) {
	// The URI as every argument is recorded: bounded (a long one as its
	// size and digest), or one read could write a line of any length.
	// The session and path too, as download_file's arguments, so that its
	// rules on them (deny_if args.path ...) apply to reads alike.
	args := map[string]string{"uri": req.Params.URI}
	if id, p, ok := parseFileURI(req.Params.URI); ok {
		args["session_id"], args["path"] = id, canonicalPath(p)
	}
	raw, _ := json.Marshal(args)
	ctx, t, ref := s.gov.Admit(ctx, govern.Call{Tool: "download_file", Identity: identity(req), Args: raw, NoAsk: true})
	if ref == nil && len(req.Params.URI) > maxResourceURI {
		ref = t.Refuse(fmt.Sprintf("the URI is %d bytes, more than any of this server's resources (%d at most)", len(req.Params.URI), maxResourceURI))
	}
	if ref == nil {
		ref = t.Check(ctx, govern.Subject{Detail: map[string]string{"uri": req.Params.URI}}, govern.Approver{}).Refusal
	}
	if ref != nil {
		t.End(govern.Outcome{Refused: ref})
		return nil, errors.New(resourceRefusal(t, ref))
	}
	res, err := next(ctx, method, req)
	o := govern.Outcome{Status: "ok"}
	if err != nil {
		o = govern.Outcome{Status: "error", Error: err.Error()}
	}
	if t.End(o) != nil {
		return nil, errors.New("the read could not be recorded in the server's audit log, so its result is withheld")
	}
	return res, err
}

// resourceRefusal words a refusal as a protocol error's message, about
// reading session files.
func resourceRefusal(t *govern.Ticket, ref *govern.Refusal) string {
	switch t.Rule() {
	case "tool", "default", "hide":
		return "the server's policy does not allow reading session files (download_file is denied)"
	case "approval":
		return "reading session files needs the user's approval under this server's policy; use the download_file tool, which asks"
	}
	msg := ref.Message
	if msg != "" {
		msg = strings.ToLower(msg[:1]) + msg[1:]
	}
	return msg
}

// pathTools are the tools whose path argument names a workspace file.
var pathTools = map[string]bool{"upload_file": true, "download_file": true, "list_files": true}

// canonicalArgs writes a call's path argument as the tool will use it
// (data/./x.csv/ is data/x.csv), so that the policy's rules on the path
// and the tool agree on what it names. A path the tool would refuse is
// left as it is, for the tool to refuse.
func canonicalArgs(raw json.RawMessage) json.RawMessage {
	var args map[string]json.RawMessage
	if json.Unmarshal(raw, &args) != nil {
		return raw
	}
	var p string
	if json.Unmarshal(args["path"], &p) != nil || p == "" {
		return raw
	}
	c := canonicalPath(p)
	if c == p {
		return raw
	}
	args["path"], _ = json.Marshal(c)
	out, err := json.Marshal(args)
	if err != nil {
		return raw
	}
	return out
}

// canonicalPath is p as the workspace resolves it, or p when it would
// refuse it.
func canonicalPath(p string) string {
	if c, err := workspace.CleanPath(p); err == nil {
		return c
	}
	return p
}
