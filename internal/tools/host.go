package tools

import (
	"context"
	"errors"
	"slices"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/govern"
)

// Profile is a set of tools with another server's names, parameters and
// result formats (internal/profiles), served instead of or beside
// pysandbox's own. Its tools run on the same engine, under the same
// limits, policy, approval, rate limits, quotas and audit log: they are
// registered through a Host, which gives them nothing else.
type Profile struct {
	// Name is what --tools calls it, e.g. "mcp-run-python".
	Name string
	// Tools are the names its tools have (the policy file names them so).
	Tools []string
	// ServerName and Instructions are what the server says of itself
	// when this profile is the only one served.
	ServerName, Instructions string
	// Register adds the tools; it is called again when the policy
	// changes (adding a tool again replaces it).
	Register func(h *Host)
}

// Host is what a Profile builds its tools on.
type Host struct {
	s   *server
	srv *mcp.Server
}

// AddTool registers a profile's tool behind the policy's per-call checks,
// like pysandbox's own. An input that implements Governed is judged as
// the native input it stands for (its packages against the package rules,
// its code shown to whoever approves it).
func AddTool[In, Out any](h *Host, t *mcp.Tool, fn mcp.ToolHandlerFor[In, Out]) {
	addTool(h.s, h.srv, t, fn)
}

// Governed is implemented by a profile tool's input: the native input
// (RunPythonInput, CreateSessionInput, InstallPackageInput) the call
// amounts to, for the package rules and the approval prompt.
type Governed interface{ Governed() any }

// Run runs code as run_python does. When nothing ran, refused is the
// result to return (a quota, a bad argument, a sandbox that cannot start).
func (h *Host) Run(ctx context.Context, req *mcp.CallToolRequest, in RunPythonInput) (res *engine.Result, refused *govern.Refusal) {
	res, _, refused = h.s.execute(ctx, req, in)
	// The call's record is made from this run: the profile's result is
	// its peer's format.
	if c, ok := h.s.inflight.Load(req); ok {
		c := c.(*inflight)
		c.mu.Lock()
		c.run, c.refused = res, refused
		c.mu.Unlock()
	}
	return res, refused
}

// Helper runs code of the profile's own in a session (listing files,
// reading a version): unlike Run, its outcome is not the call's.
func (h *Host) Helper(ctx context.Context, req *mcp.CallToolRequest, in RunPythonInput) (*engine.Result, *govern.Refusal) {
	res, _, refused := h.s.execute(ctx, req, in)
	return res, refused
}

// SessionExists says whether a session of that id is open (anyone's).
func (h *Host) SessionExists(id string) bool {
	for _, i := range h.s.sessions.List() {
		if i.ID == id {
			return true
		}
	}
	return false
}

// CreateSession is create_session; refused is set when none was created.
func (h *Host) CreateSession(ctx context.Context, req *mcp.CallToolRequest, in CreateSessionInput) (*CreateSessionOutput, *govern.Refusal) {
	_, out, err := h.s.createSession(ctx, req, in)
	return out, asRefusal(err)
}

// asRefusal is a handler's error as the refusal it is (any error a
// handler returns is one).
func asRefusal(err error) *govern.Refusal {
	var r *govern.Refusal
	if err != nil && !errors.As(err, &r) {
		r = refusal(govern.StatusSandboxError, err.Error())
	}
	return r
}

// Install is install_package; the result says installed or
// install_error, refused that nothing was tried.
func (h *Host) Install(ctx context.Context, req *mcp.CallToolRequest, in InstallPackageInput) (*InstallPackageOutput, *govern.Refusal) {
	_, out, err := h.s.installPackage(ctx, req, in)
	ref := asRefusal(err)
	// The call's record is made from this install.
	if c, ok := h.s.inflight.Load(req); ok {
		c := c.(*inflight)
		c.mu.Lock()
		if ref != nil {
			c.refused = ref
		} else if out != nil {
			o := out.outcome()
			c.other = &o
		}
		c.mu.Unlock()
	}
	return out, ref
}

// Upload is upload_file (content from the client, never a host path).
func (h *Host) Upload(ctx context.Context, req *mcp.CallToolRequest, in UploadFileInput) (*FileOutput, *govern.Refusal) {
	_, out, err := h.s.uploadFile(ctx, req, in)
	return out, asRefusal(err)
}

// Sessions are the caller's open sessions, oldest first.
func (h *Host) Sessions(req *mcp.CallToolRequest) []engine.SessionInfo {
	me := callerOf(req)
	var out []engine.SessionInfo
	for _, i := range h.s.sessions.List() {
		if me.lists(i.Owner, i.Holder) {
			out = append(out, i)
		}
	}
	slices.SortFunc(out, func(a, b engine.SessionInfo) int { return a.Created.Compare(b.Created) })
	return out
}

// OwnSession reports whether the caller may use the session.
func (h *Host) OwnSession(req *mcp.CallToolRequest, id string) bool {
	return h.s.ownSession(req, id) == nil
}

// Identity is the caller's identity, as the audit log names it.
func (h *Host) Identity(req *mcp.CallToolRequest) string { return identity(req) }

// Refusal is a call refused before anything ran, with its status and a
// message saying what to do (see refusal).
func Refusal(status govern.Status, msg string) *govern.Refusal { return refusal(status, msg) }

// CallerKey tells this caller apart from every other, for what a profile
// keeps per caller: "" when nothing can (HTTP without a token on the
// sessionless protocol), and then nothing may be kept for it.
func (h *Host) CallerKey(req *mcp.CallToolRequest) string { return callerOf(req).key() }

// Posture is the sandbox as measured, with the policy in force
// (check_environment's result), and its text.
func (h *Host) Posture(ctx context.Context, req *mcp.CallToolRequest) (*engine.Posture, string) {
	res, p, _ := h.s.checkEnvironment(ctx, req, CheckEnvironmentInput{})
	return p, resultText(res)
}

// Engine is the engine the tools run on (for its limits).
func (h *Host) Engine() *engine.Engine { return h.s.eng }

// MaxReply bounds a result on the wire, as for the native tools.
func (h *Host) MaxReply() int64 { return h.s.maxReply - replyOverhead }

// NetworkOn says whether runs reach a network (through the proxy).
func (h *Host) NetworkOn() bool { return h.s.networkOn() }

// CheckPackage says whether the policy's package rules allow a package
// (its PEP 503 name), and why not.
func (h *Host) CheckPackage(name string) error { return h.s.gov.Policy().Packages.Check(name) }

// FileURI is the resource URI of a session file (FileTemplate), which a
// client reads with resources/read.
func FileURI(sessionID, p string) string { return fileURI(sessionID, p) }
