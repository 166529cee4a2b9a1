package tools

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/govern"
	"github.com/pysandbox/pysandbox/internal/snapshot"
)

// PauseSessionOutput is pause_session's result.
type PauseSessionOutput struct {
	Outcome
	SessionID string `json:"session_id"`
	Paused    bool   `json:"paused"`
	// SnapshotBytes is what the snapshot takes on disk.
	SnapshotBytes int64 `json:"snapshot_bytes"`
	// Saved are the variables saved; Unsaveable those that could not be,
	// with why (they will be missing after the resume).
	Saved      []string              `json:"saved"`
	Unsaveable []snapshot.Unsaveable `json:"unsaveable,omitempty"`
	Files      int                   `json:"files"`
	// Skipped are workspace entries left out (symlinks, special files).
	Skipped   []string  `json:"skipped,omitempty"`
	ExpiresAt time.Time `json:"expires_at,omitzero"`
}

// ResumeSessionOutput is resume_session's result.
type ResumeSessionOutput struct {
	Outcome
	SessionID string `json:"session_id"`
	// Resumed is false when the session was running already.
	Resumed  bool       `json:"resumed"`
	PausedAt *time.Time `json:"paused_at,omitempty"`
	Restored []string   `json:"restored,omitempty"`
	// NotRestored are the variables that did not come back, with why.
	NotRestored []snapshot.Unsaveable `json:"not_restored,omitempty"`
	Files       int                   `json:"files"`
	// FilesNotRestored are saved files that could not be written back
	// (the workspace full, a file too large), as "path: why".
	FilesNotRestored []string `json:"files_not_restored,omitempty"`
}

const pauseSessionDescription = `Pause a session: its variables (saved object by object: data, functions and classes defined in it; modules are imported again), its files and its installed packages are saved to the server's disk, and its interpreter is stopped, freeing its memory. The session keeps its id: resume_session, or any call on it (run_python, upload_file, ...), brings it back as it was. Variables that cannot be saved (open files, sockets, threads, generators) are listed in the result and will be missing. A paused session is deleted after the server's paused time to live (list_sessions shows when). Sessions are also paused when the server restarts.`

const resumeSessionDescription = `Resume a paused session under the same id: its variables, files and packages come back as they were when it was paused. Any call on a paused session resumes it too, so this is only needed to resume ahead of use. The result lists what did not come back.`

// addPauseTools adds pause_session and resume_session. A server that
// keeps no snapshots offers them too, and its pause_session says why it
// cannot, rather than the tool being missing without a word.
func (s *server) addPauseTools(srv *mcp.Server) {
	addTool(s, srv, &mcp.Tool{
		Name:        "pause_session",
		Title:       "Pause a Python session",
		Description: pauseSessionDescription,
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(false), IdempotentHint: false, OpenWorldHint: ptr(false)},
	}, s.pauseSession)
	addTool(s, srv, &mcp.Tool{
		Name:        "resume_session",
		Title:       "Resume a paused Python session",
		Description: resumeSessionDescription,
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(false), IdempotentHint: true, OpenWorldHint: ptr(false)},
	}, s.resumeSession)
}

func (s *server) pauseSession(ctx context.Context, req *mcp.CallToolRequest, in SessionIDInput) (*mcp.CallToolResult, *PauseSessionOutput, error) {
	if err := s.ownSession(req, in.SessionID); err != nil {
		return nil, nil, sessionError(ctx, err)
	}
	res, err := s.sessions.Pause(ctx, in.SessionID)
	if owner, paused := s.sessions.Paused(in.SessionID); err != nil && paused && owner == identity(req) {
		out := &PauseSessionOutput{SessionID: in.SessionID, Paused: true}
		for _, i := range s.sessions.List() {
			if i.ID == in.SessionID {
				out.SnapshotBytes, out.ExpiresAt = i.SnapshotBytes, i.ExpiresAt
			}
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("session %s is paused already; it expires at %s unless resumed.", in.SessionID, out.ExpiresAt.Format(time.RFC3339))}}}, out, nil
	}
	if err != nil {
		return nil, nil, pauseError(ctx, err)
	}
	out := &PauseSessionOutput{SessionID: res.ID, Paused: true, SnapshotBytes: res.Bytes, Saved: res.Saved, Unsaveable: res.Unsaveable,
		Files: res.Files, Skipped: res.Skipped, ExpiresAt: res.ExpiresAt.UTC()}
	var b strings.Builder
	fmt.Fprintf(&b, "session %s paused: %d variables and %d files saved (%s on disk); its memory is freed. Any call on it, or resume_session, brings it back. It is deleted at %s unless resumed.",
		res.ID, len(res.Saved), res.Files, byteSize(res.Bytes, false), out.ExpiresAt.Format(time.RFC3339))
	if len(res.Unsaveable) > 0 {
		b.WriteString("\nNot saved (define these again after resuming):")
		for i, u := range res.Unsaveable {
			if i == 30 {
				fmt.Fprintf(&b, "\n  ... and %d more", len(res.Unsaveable)-30)
				break
			}
			fmt.Fprintf(&b, "\n  %s: %s", u.Name, u.Reason)
		}
	}
	for _, sk := range res.Skipped {
		b.WriteString("\nNot saved: " + sk)
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: b.String()}}}, out, nil
}

func (s *server) resumeSession(ctx context.Context, req *mcp.CallToolRequest, in SessionIDInput) (*mcp.CallToolResult, *ResumeSessionOutput, error) {
	if err := s.ownSession(req, in.SessionID); err != nil {
		return nil, nil, sessionError(ctx, err)
	}
	res, err := s.wake(ctx, req, in.SessionID)
	if err != nil {
		return nil, nil, sessionError(ctx, err)
	}
	if res == nil {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "session " + in.SessionID + " is running; nothing to resume."}}},
			&ResumeSessionOutput{SessionID: in.SessionID}, nil
	}
	paused := res.PausedAt.UTC()
	out := &ResumeSessionOutput{SessionID: in.SessionID, Resumed: true, PausedAt: &paused, Restored: res.Restored, Files: res.Files, FilesNotRestored: res.SkippedFiles}
	out.NotRestored = append(append(out.NotRestored, res.Unsaveable...), res.Failed...)
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: res.Summary() + "."}}}, out, nil
}

// wake resumes the session id names when it is paused (the caller owns
// it: ownSession said so), as resume_session does; a running session
// gives nil.
func (s *server) wake(ctx context.Context, req *mcp.CallToolRequest, id string) (*engine.ResumeResult, error) {
	if _, paused := s.sessions.Paused(id); !paused {
		return nil, nil
	}
	snet, attach := s.sessionNetwork(ctx, req)
	res, err := s.sessions.Resume(ctx, id, engine.ResumeOptions{Owner: identity(req), Holder: callerOf(req).conn, Progress: progressFunc(ctx, req), Network: attach})
	if err != nil {
		return nil, err
	}
	if res != nil {
		s.keepSessionNet(id, snet)
	}
	return res, nil
}

// pauseError is a pause's failure, as the agent should read it.
func pauseError(ctx context.Context, err error) *govern.Refusal {
	switch {
	case errors.Is(err, engine.ErrSnapshotTooBig):
		return refusal(govern.StatusQuota, fmt.Sprintf("Not paused: %v.", err))
	case errors.Is(err, engine.ErrPausedQuota):
		return refusal(govern.StatusQuota, fmt.Sprintf("Not paused: %v.", err))
	case errors.Is(err, engine.ErrNoSnapshots):
		return errorResult(fmt.Sprintf("Not paused: %v. The session keeps running; close it with close_session when done.", err))
	case errors.Is(err, snapshot.ErrDiskFull):
		return refusal(govern.StatusSandboxError, fmt.Sprintf("Not paused: %v; the session keeps running. Tell the server's operator.", err))
	}
	return sessionError(ctx, err)
}
