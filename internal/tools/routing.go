package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/pysandbox/pysandbox/internal/govern"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/cluster"
	"github.com/pysandbox/pysandbox/internal/engine"
)

// Routing between replicas (internal/cluster). A call that names a
// pysandbox session another replica owns is decided here as any call is —
// policy, rate limits, approval, audit record — and then re-issued at the
// owner's internal endpoint with the caller's identity; the owner runs it
// after checking that the session is that identity's. The owner's own
// governance does not run again: the internal endpoint serves only the
// replicas, which hold its token. Reads of session files and of figures
// (resources/read) go the same way.

// sessionRef is implemented by inputs that name a session.
type sessionRef interface{ sessionRef() string }

func (in RunPythonInput) sessionRef() string      { return in.SessionID }
func (in SessionIDInput) sessionRef() string      { return in.SessionID }
func (in UploadFileInput) sessionRef() string     { return in.SessionID }
func (in ListFilesInput) sessionRef() string      { return in.SessionID }
func (in DownloadFileInput) sessionRef() string   { return in.SessionID }
func (in InstallPackageInput) sessionRef() string { return in.SessionID }

// routed sends a call whose session another replica owns to that
// replica; other calls go to h.
func routed[In, Out any](s *server, tool string, h mcp.ToolHandlerFor[In, Out]) mcp.ToolHandlerFor[In, Out] {
	return func(ctx context.Context, req *mcp.CallToolRequest, in In) (*mcp.CallToolResult, Out, error) {
		var zero Out
		ref, ok := any(in).(sessionRef)
		if !ok || ref.sessionRef() == "" {
			return h(ctx, req, in)
		}
		// An id no session could have is unknown at once: it is neither
		// parsed for its replica nor echoed whole (one of 20 MB cost the
		// server hundreds of MB in copies).
		if !plausibleID(ref.sessionRef()) {
			return nil, zero, errorResult(fmt.Sprintf("Unknown session (%s is not a session id). Create a session with create_session and use the session_id it returns.", shortQuote(ref.sessionRef())))
		}
		if s.cl == nil {
			return h(ctx, req, in)
		}
		m, local, err := s.cl.Route(ctx, ref.sessionRef())
		switch {
		case local:
			return h(ctx, req, in)
		case errors.Is(err, cluster.ErrLost):
			return nil, zero, errorResult(fmt.Sprintf("session %q: %v.", ref.sessionRef(), err))
		case err != nil:
			return nil, zero, refusal(govern.StatusBusy, fmt.Sprintf("session %q: %v.", ref.sessionRef(), err))
		}
		// The arguments as the client sent them: re-encoding would escape
		// <, > and & six bytes over, past the owner's bound on a request.
		args := req.Params.Arguments
		if len(args) == 0 {
			args, _ = json.Marshal(in)
		}
		res, err := s.fwd.CallProgress(ctx, m, &mcp.CallToolParams{Name: tool, Arguments: args}, identity(req), callIDOf(ctx), int64(len(args)), relayTo(ctx, req))
		if err != nil {
			if ctx.Err() != nil {
				return nil, zero, refusal(govern.StatusCancelled, "The call was cancelled.")
			}
			// The owner may have stopped between the lookup (or the route
			// remembered) and the call: the store says.
			s.cl.Unroute(m)
			if _, _, again := s.cl.Owner(ctx, ref.sessionRef(), false); errors.Is(again, cluster.ErrLost) {
				return nil, zero, errorResult(fmt.Sprintf("session %q: %v.", ref.sessionRef(), again))
			}
			return nil, zero, refusal(govern.StatusBusy, fmt.Sprintf("session %q: %v.", ref.sessionRef(), err))
		}
		return forwardedResult[Out](res)
	}
}

// relayTo sends the owner's progress notifications for a forwarded call
// on to its caller, with the caller's token; nil when the caller asked
// for none.
func relayTo(ctx context.Context, req *mcp.CallToolRequest) func(*mcp.ProgressNotificationParams) {
	tok := req.Params.GetProgressToken()
	if tok == nil || req.Session == nil {
		return nil
	}
	return func(p *mcp.ProgressNotificationParams) {
		req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: p.Progress, Total: p.Total, Message: p.Message})
	}
}

// forwardedResult is the owner's result as this replica's handler
// returns it: the SDK rebuilds the structured result from Out.
func forwardedResult[Out any](res *mcp.CallToolResult) (*mcp.CallToolResult, Out, error) {
	var out Out
	if res.StructuredContent != nil {
		data, err := json.Marshal(res.StructuredContent)
		if err == nil {
			err = json.Unmarshal(data, &out)
		}
		if err != nil {
			return nil, out, errorResult(fmt.Sprintf("the replica holding the session answered with a result this one cannot read: %v", err))
		}
	}
	res.StructuredContent = nil
	return res, out, nil
}

// errNotHere answers a call forwarded for a session this replica no
// longer serves (cluster.Cluster.Serves): the forwarding replica takes it
// for unreachable, forgets its route and asks the store.
var errNotHere = errors.New("this replica no longer serves the session: it is stopping, or handed the session to another")

// internalCall serves a call another replica forwarded: its identity and
// call id come with it.
func internalCall[In, Out any](cl *cluster.Cluster, calls *inbound, h mcp.ToolHandlerFor[In, Out]) mcp.ToolHandlerFor[In, Out] {
	return func(ctx context.Context, req *mcp.CallToolRequest, in In) (*mcp.CallToolResult, Out, error) {
		meta := req.Params.GetMeta()
		id, _ := meta[cluster.MetaIdentity].(string)
		callID, _ := meta[cluster.MetaCallID].(string)
		var zero Out
		if id == "" {
			return nil, zero, errorResult("a forwarded call without the caller's identity")
		}
		// Only calls on a session of this replica are forwarded here (and
		// list_sessions): nothing else may skip the forwarding replica's
		// governance.
		if ref, ok := any(in).(sessionRef); ok && ref.sessionRef() == "" {
			return nil, zero, errorResult("a forwarded call must name a session of this replica")
		} else if ok && cl != nil && !cl.Serves(ref.sessionRef()) {
			return nil, zero, errNotHere
		}
		if req.Extra == nil {
			req.Extra = &mcp.RequestExtra{}
		}
		req.Extra.TokenInfo = &auth.TokenInfo{UserID: id, Expiration: time.Now().Add(time.Hour)}
		ctx, done := calls.start(ctx, callID, id)
		defer done()
		return h(withCallID(ctx, callID), req, in)
	}
}

// registerInternal adds what other replicas forward to: the tools of
// sessions and the reads of session files and figures, without governance
// (the forwarding replica's decided).
func (s *server) registerInternal(srv *mcp.Server) {
	add := func(name string) *mcp.Tool {
		return &mcp.Tool{Name: name, Description: "internal: forwarded by another replica"}
	}
	addInternal(srv, add("run_python"), internalCall(s.cl, s.inbound, s.runPython))
	addInternal(srv, add("close_session"), internalCall(s.cl, s.inbound, s.closeSession))
	addInternal(srv, add("pause_session"), internalCall(s.cl, s.inbound, s.pauseSession))
	addInternal(srv, add("resume_session"), internalCall(s.cl, s.inbound, s.resumeSession))
	addInternal(srv, add("list_sessions"), internalCall(s.cl, s.inbound, s.listSessions))
	addInternal(srv, add("install_package"), internalCall(s.cl, s.inbound, s.installPackage))
	addInternal(srv, add("upload_file"), internalCall(s.cl, s.inbound, s.uploadFile))
	addInternal(srv, add("list_files"), internalCall(s.cl, s.inbound, s.listFiles))
	addInternal(srv, add("download_file"), internalCall(s.cl, s.inbound, s.downloadFile))
	addInternal(srv, add(cluster.CancelTool), s.cancelForwarded)
	// Reads of this replica's session files and figures, which only it
	// holds.
	srv.AddResourceTemplate(&mcp.ResourceTemplate{Name: "session-file", URITemplate: FileTemplate, Description: "internal: forwarded by another replica"}, internalResource(s.cl, fileSessionRef, s.readFileResource))
	srv.AddResourceTemplate(&mcp.ResourceTemplate{Name: "figure", URITemplate: FigureTemplate, Description: "internal: forwarded by another replica"}, internalResource(s.cl, figureRef, s.readFigure))
	srv.AddResourceTemplate(&mcp.ResourceTemplate{Name: "output", URITemplate: OutputTemplate, Description: "internal: forwarded by another replica"}, internalResource(s.cl, storedRef(outputPrefix), s.readStored(s.outputs)))
	srv.AddResourceTemplate(&mcp.ResourceTemplate{Name: "display", URITemplate: DisplayTemplate, Description: "internal: forwarded by another replica"}, internalResource(s.cl, storedRef(displayPrefix), s.readStored(s.displays)))
}

// routedResource sends a resources/read of what another replica holds to
// that replica, with the caller's identity; ref names the id the URI
// carries (a session's, or a figure's), "" when it carries none. The owner
// checks that the resource is the caller's, so a caller without it gets
// "Resource not found" there, as for one that does not exist. The policy's
// rule on reads (the governor's middleware) was applied here already,
// where the client's request arrived.
func routedResource(s *server, ref func(uri string) string, h mcp.ResourceHandler) mcp.ResourceHandler {
	if s.cl == nil {
		return h
	}
	return func(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		uri := req.Params.URI
		id := ref(uri)
		if id == "" {
			return h(ctx, req)
		}
		if !plausibleID(id) {
			return nil, mcp.ResourceNotFoundError(uri)
		}
		m, local, err := s.cl.Route(ctx, id)
		// Twice at most: the owner may have stopped, or handed the session
		// to another replica, between the lookup (or the route remembered)
		// and the read; then the store says where it is now.
		for attempt := 0; err == nil; attempt++ {
			if local {
				return h(ctx, req)
			}
			var res *mcp.ReadResourceResult
			res, err = s.fwd.ReadResource(ctx, m, uri, identity(req))
			var answered *jsonrpc.Error
			if err == nil || errors.As(err, &answered) || ctx.Err() != nil {
				return res, err
			}
			s.cl.Unroute(m)
			next, nextLocal, again := s.cl.Owner(ctx, id, false)
			if again != nil {
				err = again
				break
			}
			if attempt > 0 || !nextLocal && next.Tag() == m.Tag() {
				break // the same replica, which just failed
			}
			m, local, err = next, nextLocal, nil
		}
		if errors.Is(err, cluster.ErrLost) {
			// Said of a figure as of a session file: ErrLost's own words
			// speak of sessions.
			return nil, fmt.Errorf("%s is lost: the server that held it stopped", uri)
		}
		return nil, fmt.Errorf("%s: %v", uri, err)
	}
}

// internalResource serves a read another replica forwarded, for the
// identity that came with it. ref is the id in the URI of what holds the
// resource: a read of what this replica no longer serves (a session it
// handed over as it stops) is answered so that the forwarding replica
// asks the store again, as a forwarded call is (errNotHere).
func internalResource(cl *cluster.Cluster, ref func(uri string) string, h mcp.ResourceHandler) mcp.ResourceHandler {
	return func(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		id, _ := req.Params.GetMeta()[cluster.MetaIdentity].(string)
		if id == "" {
			return nil, errors.New("a forwarded read without the caller's identity")
		}
		if at := ref(req.Params.URI); cl != nil && at != "" && !cl.Serves(at) {
			return nil, &jsonrpc.Error{Code: cluster.CodeNotHere, Message: errNotHere.Error()}
		}
		if req.Extra == nil {
			req.Extra = &mcp.RequestExtra{}
		}
		req.Extra.TokenInfo = &auth.TokenInfo{UserID: id, Expiration: time.Now().Add(time.Hour)}
		res, err := h(ctx, req)
		if res != nil {
			// The forwarding replica's client would cache a read with a
			// time to live by its URI alone, on the connection every
			// caller shares: nothing read for one may be kept for another.
			res.Cacheable = mcp.Cacheable{}
		}
		return res, err
	}
}

// listAllSessions is list_sessions across the replicas: this one's and
// each live other's, for the caller.
func (s *server) listAllSessions(ctx context.Context, req *mcp.CallToolRequest, in ListSessionsInput) (*mcp.CallToolResult, *ListSessionsOutput, error) {
	res, out, err := s.listSessions(ctx, req, in)
	if s.cl == nil || err != nil || out == nil {
		return res, out, err
	}
	members, merr := s.cl.Members(ctx)
	if merr == nil {
		// Only a list read whole says who is gone: after a failed read,
		// forgetting every peer would cut calls in flight to all of them.
		s.fwd.Forget(members)
	}
	// Every other replica at once, each for a few seconds at most: one
	// that does not answer is left out, and said so.
	type answer struct {
		name string
		list []engine.SessionInfo
		ok   bool
	}
	answers := make(chan answer, len(members))
	asked := 0
	for _, m := range members {
		if m.Tag() == s.cl.Self().Tag() {
			continue
		}
		asked++
		go func() {
			actx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			r, ferr := s.fwd.Call(actx, m, &mcp.CallToolParams{Name: "list_sessions", Arguments: map[string]any{}}, identity(req), callIDOf(ctx), 1)
			if ferr != nil || r.IsError {
				answers <- answer{name: m.Name}
				return
			}
			_, more, _ := forwardedResult[*ListSessionsOutput](r)
			a := answer{name: m.Name, ok: true}
			if more != nil {
				a.list = more.Sessions
			}
			answers <- a
		}()
	}
	var missing []string
	for i := 0; i < asked; i++ {
		a := <-answers
		if !a.ok {
			missing = append(missing, a.name)
			continue
		}
		out.Sessions = append(out.Sessions, a.list...)
	}
	out.Sessions = onePerID(out.Sessions)
	text := fmt.Sprintf("%d session(s)\n", len(out.Sessions))
	for _, i := range out.Sessions {
		if i.State == engine.StatePaused {
			text += fmt.Sprintf("%s: paused at %s, %d runs, snapshot %s, deleted at %s unless resumed\n", i.ID, i.LastUsed.Format(time.RFC3339), i.Runs, byteSize(i.SnapshotBytes, false),
				i.ExpiresAt.Format(time.RFC3339))
			continue
		}
		text += fmt.Sprintf("%s: %d runs, %d MiB, last used %s, expires %s\n", i.ID, i.Runs, i.MemoryBytes>>20,
			i.LastUsed.Format(time.RFC3339), i.ExpiresAt.Format(time.RFC3339))
	}
	if merr != nil || len(missing) > 0 {
		text += fmt.Sprintf("(some servers could not be asked: %v %v; their sessions are not listed)\n", missing, merr)
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, out, nil
}

// onePerID lists each session once. A paused session lives on one
// replica, but while a stopping replica hands it over both hold it for a
// moment (and a copy may be left behind by a replica killed then): the
// running one is the session, else the first listed (this replica's).
func onePerID(list []engine.SessionInfo) []engine.SessionInfo {
	at := make(map[string]int, len(list))
	out := list[:0:0]
	for _, i := range list {
		if j, seen := at[i.ID]; seen {
			if out[j].State == engine.StatePaused && i.State != engine.StatePaused {
				out[j] = i
			}
			continue
		}
		at[i.ID] = len(out)
		out = append(out, i)
	}
	return out
}

// maxSessionIDBytes bounds a session id: ours are "s-", 32 hex digits and, with
// replicas, the replica's name and incarnation.
const maxSessionIDBytes = 200

// plausibleID reports whether id could be a session's: short, and only
// the characters ids are made of.
func plausibleID(id string) bool {
	if len(id) == 0 || len(id) > maxSessionIDBytes {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.' || r == '_') {
			return false
		}
	}
	return true
}

// shortQuote quotes the head of an agent's value for a message.
func shortQuote(v string) string {
	if len(v) > 64 {
		return fmt.Sprintf("%q… (%d bytes)", engine.Head(v, 64), len(v))
	}
	return fmt.Sprintf("%q", v)
}
