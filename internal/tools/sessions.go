package tools

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/deps"
	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/govern"
	"github.com/pysandbox/pysandbox/internal/pep"
	"github.com/pysandbox/pysandbox/internal/pydist"
)

// CreateSessionInput is create_session's input.
type CreateSessionInput struct {
	TTLSeconds    float64  `json:"ttl_seconds,omitempty" jsonschema:"Idle time in seconds after which the session expires and is deleted (default 600; the server's maximum applies). Every call on the session resets it."`
	PythonVersion string   `json:"python_version,omitempty" jsonschema:"Python for the session, e.g. \"3.12\": one the host has, or one the server downloads once (check_environment lists both). Default: the server's."`
	Dependencies  []string `json:"dependencies,omitempty" jsonschema:"PEP 508 requirements importable in every run of the session, e.g. [\"pandas>=2\"]. More can be added later with install_package."`
}

// CreateSessionOutput is create_session's result.
type CreateSessionOutput struct {
	Outcome
	SessionID string    `json:"session_id"`
	ExpiresAt time.Time `json:"expires_at,omitzero"`
}

// SessionIDInput names a session.
type SessionIDInput struct {
	SessionID string `json:"session_id" jsonschema:"The id create_session returned."`
}

// ListSessionsInput is empty.
type ListSessionsInput struct{}

// ListSessionsOutput is list_sessions' result.
type ListSessionsOutput struct {
	Outcome
	Sessions []engine.SessionInfo `json:"sessions"`
	// Note says why sessions that count against the caller's quota are
	// not listed (callers without a token).
	Note string `json:"note,omitempty"`
}

// CloseSessionOutput is close_session's result.
type CloseSessionOutput struct {
	Outcome
	SessionID string `json:"session_id"`
	Closed    bool   `json:"closed"`
}

const createSessionDescription = `Start a session: a long-lived Python interpreter in its own sandbox (same isolation and limits as run_python: no network, no host files) that keeps its state between calls. Pass the returned session_id to run_python to run code in it: variables, imports and files persist. It has a private working directory /work (size-capped) for files; use upload_file, list_files and download_file to move files in and out. Plots left open by a run come back as PNG images. The session is deleted after ttl_seconds without use, or by close_session. Use a session for multi-step work (load data, inspect, clean, plot); use run_python without session_id for one-off computations.`

func (s *server) addSessionTools(srv *mcp.Server) {
	addTool(s, srv, &mcp.Tool{
		Name:        "create_session",
		Title:       "Create a Python session",
		Description: strings.Replace(createSessionDescription, "no network,", s.networkWords()+",", 1),
		Annotations: &mcp.ToolAnnotations{OpenWorldHint: ptr(false), DestructiveHint: ptr(false)},
	}, s.createSession)
	addTool(s, srv, &mcp.Tool{
		Name:        "list_sessions",
		Title:       "List Python sessions",
		Description: "List your sessions: id, state (running or paused), when created and last used, when each expires, memory in use (running) or snapshot size (paused), and the number of runs. Only your own are listed: on a server without tokens, those this connection made or used, and none on the sessionless protocol (2026-07-28), where no connection ties calls together; keep the session_id create_session returns.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, s.listAllSessions)
	addTool(s, srv, &mcp.Tool{
		Name:        "close_session",
		Title:       "Close a Python session",
		Description: "Close a session: its interpreter is stopped and its working directory with every file in it is deleted. Download what you need first.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(true), IdempotentHint: true, OpenWorldHint: ptr(false)},
	}, s.closeSession)
}

func (s *server) createSession(ctx context.Context, req *mcp.CallToolRequest, in CreateSessionInput) (*mcp.CallToolResult, *CreateSessionOutput, error) {
	switch {
	case len(in.Dependencies) > pep.MaxDependencies:
		return nil, nil, errorResult(fmt.Sprintf("too many dependencies (%d; the limit is %d).", len(in.Dependencies), pep.MaxDependencies))
	case in.TTLSeconds < 0 || in.TTLSeconds != in.TTLSeconds:
		return nil, nil, errorResult("ttl_seconds must be a positive number of seconds.")
	}
	maxTTL := s.sessions.Config().MaxTTL
	if in.TTLSeconds > maxTTL.Seconds() {
		return nil, nil, errorResult(fmt.Sprintf("ttl_seconds %.0f is above this server's maximum of %.0f seconds; pass a smaller value.", in.TTLSeconds, maxTTL.Seconds()))
	}
	snet, attach := s.sessionNetwork(ctx, req)
	info, err := s.sessions.Create(ctx, time.Duration(in.TTLSeconds*float64(time.Second)), engine.CreateOptions{
		Dependencies: in.Dependencies, PythonVersion: in.PythonVersion, Progress: progressFunc(ctx, req), Owner: identity(req), Holder: callerOf(req).conn,
		Network: attach,
	})
	if err != nil {
		return nil, nil, sessionError(ctx, err)
	}
	s.keepSessionNet(info.ID, snet)
	out := &CreateSessionOutput{SessionID: info.ID, ExpiresAt: info.ExpiresAt}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf(
		"session %s created; pass session_id %q to run_python. It expires at %s unless used.", info.ID, info.ID, info.ExpiresAt.Format(time.RFC3339))}}}, out, nil
}

func (s *server) listSessions(ctx context.Context, req *mcp.CallToolRequest, _ ListSessionsInput) (*mcp.CallToolResult, *ListSessionsOutput, error) {
	// Each caller sees only its own sessions (see caller.lists).
	list := []engine.SessionInfo{}
	me := callerOf(req)
	hidden := 0
	for _, i := range s.sessions.List() {
		switch {
		case me.lists(i.Owner, i.Holder):
			list = append(list, i)
		case i.Owner == me.id:
			hidden++
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d session(s)\n", len(list))
	for _, i := range list {
		if i.State == engine.StatePaused {
			fmt.Fprintf(&b, "%s: paused at %s, %d runs, snapshot %s, deleted at %s unless resumed\n", i.ID, i.LastUsed.Format(time.RFC3339), i.Runs, byteSize(i.SnapshotBytes, false),
				i.ExpiresAt.Format(time.RFC3339))
			continue
		}
		fmt.Fprintf(&b, "%s: %d runs, %d MiB, last used %s, expires %s\n", i.ID, i.Runs, i.MemoryBytes>>20,
			i.LastUsed.Format(time.RFC3339), i.ExpiresAt.Format(time.RFC3339))
	}
	out := &ListSessionsOutput{Sessions: list}
	switch {
	case hidden > 0 && me.conn == "":
		// (hidden counts only callers without a token.)
		out.Note = fmt.Sprintf("%d session(s) of callers without a token exist (running or paused). None is listed to this call: it came without an MCP session (the sessionless protocol, 2026-07-28), so nothing ties it to the calls that made them, and on a server without tokens an id is the only proof of whose a session is. Use the session_id create_session returned to you; a session nobody uses closes after being idle for its time to live (a paused one after the server's paused time to live).", hidden)
	case hidden > 0:
		out.Note = fmt.Sprintf("%d more session(s) of callers without a token exist (running or paused). Their ids are not listed: on a server without tokens an id is the only proof of whose a session is, so only the connection that made or last used a session sees it here. Use the session_id create_session returned to you (it works from any connection); a session nobody uses closes after being idle for its time to live (a paused one after the server's paused time to live).", hidden)
	}
	if out.Note != "" {
		b.WriteString(out.Note + "\n")
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: b.String()}}}, out, nil
}

func (s *server) closeSession(ctx context.Context, req *mcp.CallToolRequest, in SessionIDInput) (*mcp.CallToolResult, *CloseSessionOutput, error) {
	err := s.ownSession(req, in.SessionID)
	if err == nil {
		err = s.sessions.Close(in.SessionID)
	}
	if err != nil {
		// An ended session is its owner's to hear of (CheckOwner).
		if gone, ok := errors.AsType[*engine.SessionGoneError](err); ok {
			// What the caller asked for is so already: nothing to close,
			// and no failure (the tool is idempotent).
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("session %s had already ended (%s); there is nothing left to close.", in.SessionID, gone.Why)}}},
				&CloseSessionOutput{SessionID: in.SessionID, Closed: false}, nil
		}
		return nil, nil, sessionError(ctx, err)
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "session " + in.SessionID + " closed; its files are deleted."}}},
		&CloseSessionOutput{SessionID: in.SessionID, Closed: true}, nil
}

// InstallPackageInput is install_package's input.
type InstallPackageInput struct {
	SessionID string   `json:"session_id" jsonschema:"The session to install into."`
	Packages  []string `json:"packages" jsonschema:"PEP 508 requirements, e.g. [\"requests\", \"pandas>=2\"]."`
}

// InstallPackageOutput is install_package's result.
type InstallPackageOutput struct {
	SessionID    string   `json:"session_id"`
	Status       string   `json:"status"` // "installed" or "install_error"
	Requirements []string `json:"requirements"`
	// Preinstalled: the server's Python met every requirement of the
	// session as it is, so nothing was installed; these are its copies.
	Preinstalled []string `json:"preinstalled,omitempty" jsonschema:"set when the server's Python already has every package the session asked for, in versions that meet them, so nothing was installed: name and version of each"`
	Message      string   `json:"message,omitempty"`
	// Resumed: see RunPythonOutput.Resumed.
	Resumed string `json:"resumed,omitempty" jsonschema:"set when the session was paused and this call resumed it: what was restored and what was not"`
}

func (o *InstallPackageOutput) setResumed(s string) { o.Resumed = s }

func (s *server) addInstallPackage(srv *mcp.Server) {
	addTool(s, srv, &mcp.Tool{
		Name:  "install_package",
		Title: "Install packages into a session",
		Description: "Install Python packages (PEP 508 requirements) into a session; they can be imported from its next run_python call on. " +
			"The installer runs in a sandbox of its own and its result is cached, so installing the same set again is instant. Modules the session already imported keep their old version. " +
			"Wheels only unless the server allows source builds. A package the server's Python already has, in a version that meets the requirement, is not installed again (the reply lists it in preinstalled).",
		Annotations: &mcp.ToolAnnotations{OpenWorldHint: ptr(true)},
	}, s.installPackage)
}

func (s *server) installPackage(ctx context.Context, req *mcp.CallToolRequest, in InstallPackageInput) (*mcp.CallToolResult, *InstallPackageOutput, error) {
	if len(in.Packages) == 0 || len(in.Packages) > pep.MaxDependencies {
		return nil, nil, errorResult(fmt.Sprintf("packages must list 1 to %d requirements.", pep.MaxDependencies))
	}
	if _, err := s.ownAwake(ctx, req, in.SessionID); err != nil {
		return nil, nil, sessionError(ctx, err)
	}
	release, refused := s.takeQuota(ctx, req)
	if refused != nil {
		return nil, nil, refused
	}
	defer release()
	inst, err := s.sessions.Install(ctx, in.SessionID, in.Packages, progressFunc(ctx, req))
	var ie *deps.InstallError
	var reqErr *engine.RequestError
	switch {
	case errors.As(err, &ie):
		msg := ie.Summary() + ". " + ie.Advice()
		out := &InstallPackageOutput{SessionID: in.SessionID, Status: "install_error", Requirements: in.Packages, Message: msg}
		text := "install_error: " + msg
		if ie.Cut() {
			// The installer's own words, whole when the summary had to cut
			// them (with no index reached they only say that no package
			// was found, which is not the cause: Cut is false then).
			text += "\n" + strings.Join(ie.Lines, "\n")
		}
		return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: text}}}, out, nil
	case errors.As(err, &reqErr):
		return nil, nil, errorResult(reqErr.Error() + ".")
	case err != nil:
		return nil, nil, sessionError(ctx, err)
	}
	out := &InstallPackageOutput{SessionID: in.SessionID, Status: "installed", Requirements: append([]string{}, inst.Requirements...), Preinstalled: inst.Preinstalled}
	text := "installed: " + strings.Join(inst.Requirements, ", ")
	if len(inst.Preinstalled) > 0 {
		text = "already in the server's Python, nothing installed: " + strings.Join(inst.Preinstalled, ", ")
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text + "; import them in the next run_python call"}}}, out, nil
}

// ownSession refuses a session another caller created: sessions are
// private to the token that created them, and without a token to whoever
// holds their id (see caller.go). Using a session from a connection
// attaches it there.
func (s *server) ownSession(req mcp.Request, id string) error {
	c := callerOf(req)
	if err := s.sessions.CheckOwner(id, c.id); err != nil {
		return err
	}
	if c.anonymous() {
		s.sessions.Attach(id, c.conn)
	}
	return nil
}

// ownAwake is ownSession, then wake: a call on a paused session resumes
// it first.
func (s *server) ownAwake(ctx context.Context, req *mcp.CallToolRequest, id string) (*engine.ResumeResult, error) {
	if err := s.ownSession(req, id); err != nil {
		return nil, err
	}
	res, err := s.wake(ctx, req, id)
	if res != nil {
		if v, ok := s.inflight.Load(req); ok {
			call := v.(*inflight)
			call.mu.Lock()
			call.resumed = res.Summary()
			call.mu.Unlock()
		}
	}
	return res, err
}

// sessionError turns a session failure into a message the agent can act on.
func sessionError(ctx context.Context, err error) *govern.Refusal {
	if res, ok := deniedError(err); ok {
		return res
	}
	var gone *engine.SessionGoneError
	var paused *engine.PausedError
	var reqErr *engine.RequestError
	var ie *deps.InstallError
	var pe *pydist.InstallError
	switch {
	case errors.As(err, &reqErr):
		return errorResult(reqErr.Error() + ".")
	case errors.As(err, &ie):
		return refusal(govern.StatusInstallError, "install_error: "+ie.Summary()+". "+ie.Advice())
	case errors.As(err, &pe):
		return refusal(govern.StatusInstallError, "install_error: "+pe.Error()+"; retry later, or tell the server's operator")
	case errors.As(err, &gone):
		return errorResult(gone.Error() + ".")
	case errors.As(err, &paused):
		return errorResult(paused.Error() + ".")
	case errors.Is(err, engine.ErrNoSession):
		return errorResult(fmt.Sprintf("Unknown session: %v. Create a session with create_session and use the session_id it returns.", err))
	case errors.Is(err, engine.ErrBusy):
		return busyResult(err)
	case errors.Is(err, engine.ErrSessionQuota):
		msg := fmt.Sprintf("Refused by your quota: %v. Nothing was created.", err)
		if q := (*engine.QuotaError)(nil); errors.As(err, &q) && q.Owner == anonymous {
			msg = fmt.Sprintf("Refused by the session quota of callers without a token: together they have %d sessions open, all the quota allows (nothing tells such callers apart, so they share it). Nothing was created. Close a session you no longer need with close_session, using the session_id create_session gave you (on a connection with an MCP session, list_sessions shows the ones it made or used); or wait: one expires at %s unless used. A session whose MCP session has ended stops counting; one made or last used on the sessionless protocol counts until it is closed or expires. A server started with --auth-token-file gives each token a quota of its own.",
				q.Open, q.NextExpiry.UTC().Format(time.RFC3339))
		}
		return refusal(govern.StatusQuota, msg)
	case errors.Is(err, engine.ErrDraining):
		return refusal(govern.StatusBusy, fmt.Sprintf("Cannot create a session: %v.", err))
	case errors.As(err, new(*engine.NoRoomError)):
		return refusal(govern.StatusBusy, err.Error()+".")
	case errors.Is(err, engine.ErrTooManySessions):
		return refusal(govern.StatusBusy, fmt.Sprintf("Cannot create another session: %v.", err))
	}
	return refusal(govern.StatusSandboxError, fmt.Sprintf("The session operation failed: %v.", err))
}

// outcome is the install's, for its record.
func (o *InstallPackageOutput) outcome() govern.Outcome {
	out := govern.Outcome{Status: o.Status}
	if o.Status != "installed" {
		out.Error = o.Message
	}
	return out
}
