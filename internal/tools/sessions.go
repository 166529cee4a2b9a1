package tools

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/engine"
)

// CreateSessionInput is create_session's input.
type CreateSessionInput struct {
	TTLSeconds    float64  `json:"ttl_seconds,omitempty" jsonschema:"Idle time in seconds after which the session expires and is deleted (default 600; the server's maximum applies). Every call on the session resets it."`
	PythonVersion string   `json:"python_version,omitempty" jsonschema:"Reserved: not supported yet. Omit it."`
	Dependencies  []string `json:"dependencies,omitempty" jsonschema:"Reserved: not supported yet. Omit it."`
}

// CreateSessionOutput is create_session's result.
type CreateSessionOutput struct {
	SessionID string    `json:"session_id"`
	ExpiresAt time.Time `json:"expires_at"`
}

// SessionIDInput names a session.
type SessionIDInput struct {
	SessionID string `json:"session_id" jsonschema:"The id create_session returned."`
}

// ListSessionsInput is empty.
type ListSessionsInput struct{}

// ListSessionsOutput is list_sessions' result.
type ListSessionsOutput struct {
	Sessions []engine.SessionInfo `json:"sessions"`
}

// CloseSessionOutput is close_session's result.
type CloseSessionOutput struct {
	SessionID string `json:"session_id"`
	Closed    bool   `json:"closed"`
}

const createSessionDescription = `Start a session: a long-lived Python interpreter in its own sandbox (same isolation and limits as run_python: no network, no host files) that keeps its state between calls. Pass the returned session_id to run_python to run code in it: variables, imports and files persist. It has a private working directory /work (size-capped) for files; use upload_file, list_files and download_file to move files in and out. Plots left open by a run come back as PNG images. The session is deleted after ttl_seconds without use, or by close_session. Use a session for multi-step work (load data, inspect, clean, plot); use run_python without session_id for one-off computations.`

func (s *server) addSessionTools(srv *mcp.Server) {
	mcp.AddTool(srv, &mcp.Tool{
		Name:        "create_session",
		Title:       "Create a Python session",
		Description: createSessionDescription,
		Annotations: &mcp.ToolAnnotations{OpenWorldHint: ptr(false), DestructiveHint: ptr(false)},
	}, s.createSession)
	mcp.AddTool(srv, &mcp.Tool{
		Name:        "list_sessions",
		Title:       "List Python sessions",
		Description: "List the open sessions: id, when created and last used, when each expires, memory in use and the number of runs.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, s.listSessions)
	mcp.AddTool(srv, &mcp.Tool{
		Name:        "close_session",
		Title:       "Close a Python session",
		Description: "Close a session: its interpreter is stopped and its working directory with every file in it is deleted. Download what you need first.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(true), IdempotentHint: true, OpenWorldHint: ptr(false)},
	}, s.closeSession)
}

func (s *server) createSession(ctx context.Context, req *mcp.CallToolRequest, in CreateSessionInput) (*mcp.CallToolResult, *CreateSessionOutput, error) {
	switch {
	case in.PythonVersion != "":
		return errorResult("python_version is not supported by this server yet: sessions use the interpreter named by check_environment. Remove python_version."), nil, nil
	case len(in.Dependencies) > 0:
		return errorResult("dependencies are not supported by this server yet: only the standard library and the interpreter's preinstalled packages can be imported. Remove dependencies."), nil, nil
	case in.TTLSeconds < 0 || in.TTLSeconds != in.TTLSeconds:
		return errorResult("ttl_seconds must be a positive number of seconds."), nil, nil
	}
	maxTTL := s.sessions.Config().MaxTTL
	if in.TTLSeconds > maxTTL.Seconds() {
		return errorResult(fmt.Sprintf("ttl_seconds %.0f is above this server's maximum of %.0f seconds; pass a smaller value.", in.TTLSeconds, maxTTL.Seconds())), nil, nil
	}
	info, err := s.sessions.Create(ctx, time.Duration(in.TTLSeconds*float64(time.Second)))
	if err != nil {
		return sessionError(err), nil, nil
	}
	out := &CreateSessionOutput{SessionID: info.ID, ExpiresAt: info.ExpiresAt}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf(
		"session %s created; pass session_id %q to run_python. It expires at %s unless used.", info.ID, info.ID, info.ExpiresAt.Format(time.RFC3339))}}}, out, nil
}

func (s *server) listSessions(ctx context.Context, req *mcp.CallToolRequest, _ ListSessionsInput) (*mcp.CallToolResult, *ListSessionsOutput, error) {
	list := s.sessions.List()
	var b strings.Builder
	fmt.Fprintf(&b, "%d open session(s)\n", len(list))
	for _, i := range list {
		fmt.Fprintf(&b, "%s: %d runs, %d MiB, last used %s, expires %s\n", i.ID, i.Runs, i.MemoryBytes>>20,
			i.LastUsed.Format(time.RFC3339), i.ExpiresAt.Format(time.RFC3339))
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: b.String()}}}, &ListSessionsOutput{Sessions: list}, nil
}

func (s *server) closeSession(ctx context.Context, req *mcp.CallToolRequest, in SessionIDInput) (*mcp.CallToolResult, *CloseSessionOutput, error) {
	if err := s.sessions.Close(in.SessionID); err != nil {
		return sessionError(err), nil, nil
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "session " + in.SessionID + " closed; its files are deleted."}}},
		&CloseSessionOutput{SessionID: in.SessionID, Closed: true}, nil
}

// sessionError turns a session failure into a message the agent can act on.
func sessionError(err error) *mcp.CallToolResult {
	var gone *engine.SessionGoneError
	switch {
	case errors.As(err, &gone):
		return errorResult(gone.Error() + ".")
	case errors.Is(err, engine.ErrNoSession):
		return errorResult(fmt.Sprintf("Unknown session (%v). Create a session with create_session and use the session_id it returns.", err))
	case errors.Is(err, engine.ErrTooManySessions):
		return errorResult(fmt.Sprintf("Cannot create another session: %v.", err))
	}
	return errorResult(fmt.Sprintf("The session operation failed: %v.", err))
}
