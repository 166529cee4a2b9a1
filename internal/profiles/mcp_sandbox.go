package profiles

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/pysandbox/pysandbox/internal/govern"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/tools"
)

// JohanLi233's mcp-sandbox: sandboxes named by a sandbox_id, each a
// pysandbox session here (the peer's is a Docker container on the bridge
// network, without a timeout). Results are dicts sent as JSON text
// indented by two spaces; errors are dicts too, isError stays false.

// SandboxIDInput names a sandbox.
type SandboxIDInput struct {
	SandboxID string `json:"sandbox_id"`
}

// CreateSandboxInput is create_sandbox's input.
type CreateSandboxInput struct {
	Name *string `json:"name"`
}

// Governed: a session.
func (in CreateSandboxInput) Governed() any { return tools.CreateSessionInput{} }

// ExecuteCodeInput is execute_python_code's input.
type ExecuteCodeInput struct {
	SandboxID string `json:"sandbox_id"`
	Code      string `json:"code"`
}

// Governed: a run in the session.
func (in ExecuteCodeInput) Governed() any {
	return tools.RunPythonInput{Code: in.Code, SessionID: in.SandboxID}
}

// PackageInput is install_package_in_sandbox's and
// check_package_installation_status's input.
type PackageInput struct {
	SandboxID   string `json:"sandbox_id"`
	PackageName string `json:"package_name"`
}

// Governed: an install into the session.
func (in PackageInput) Governed() any {
	return tools.InstallPackageInput{SessionID: in.SandboxID, Packages: []string{in.PackageName}}
}

// TerminalInput is execute_terminal_command's input.
type TerminalInput struct {
	SandboxID string `json:"sandbox_id"`
	Command   string `json:"command"`
}

// Governed: a run in the session (of a shell command).
func (in TerminalInput) Governed() any {
	return tools.RunPythonInput{Code: "# shell command, run with /bin/sh -c:\n" + in.Command, SessionID: in.SandboxID}
}

// UploadInput is upload_file_to_sandbox's input.
type UploadInput struct {
	SandboxID     string `json:"sandbox_id"`
	LocalFilePath string `json:"local_file_path"`
	DestPath      string `json:"dest_path"`
}

const accessDenied = "Access denied. You don't have permission to access this sandbox."

// terminalCode runs a shell command inside the session's sandbox, with
// its limits: the same processes, memory and timeout as any run.
// The command's output is the run's own (bounded like any run's), its
// exit code the return value.
const terminalCode = `import subprocess as _sp, sys as _sys
_sys.stdout.flush()
_sys.stderr.flush()
_sp.run(["/bin/sh", "-c", _command], cwd="/work", stdin=_sp.DEVNULL).returncode
`

// versionCode is the installed version of a distribution, or None.
const versionCode = `import importlib.metadata as _md
try:
    _v = _md.version(_name)
except _md.PackageNotFoundError:
    _v = None
_v
`

// newFilesCode lists the entries of /work changed since the run began.
// (Dot entries are left out: pysandbox keeps its own there.)
const newFilesCode = `import os as _os
sorted("/work/" + e.name for e in _os.scandir("/work") if not e.name.startswith(".") and e.stat(follow_symlinks=False).st_ctime >= _since)
`

type sandboxes struct {
	mu    sync.Mutex
	names map[string]sandboxEntry // by session id, while the session lives
}

// sandboxEntry is what the peer keeps of a sandbox that a session does
// not: its name and the packages installed.
type sandboxEntry struct {
	owner, name string
	pkgs        map[string]string // package -> version
}

// maxSandboxName bounds a sandbox's name.
const maxSandboxName = 256

// prune forgets the sandboxes whose sessions are gone, so that what is
// kept is bounded by the sessions open.
func (sb *sandboxes) prune(h *tools.Host) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	for id := range sb.names {
		if !h.SessionExists(id) {
			delete(sb.names, id)
		}
	}
}

func mcpSandbox(Options) tools.Profile {
	sb := &sandboxes{names: map[string]sandboxEntry{}}
	return tools.Profile{
		Name: "mcp-sandbox",
		Tools: []string{"create_sandbox", "list_sandboxes", "execute_python_code", "install_package_in_sandbox",
			"check_package_installation_status", "execute_terminal_command", "upload_file_to_sandbox"},
		ServerName:   "Python Sandbox",
		Instructions: "Create a sandbox with create_sandbox, then run code in it with execute_python_code (files and installed packages persist in the sandbox).",
		Register:     func(h *tools.Host) { sb.register(h) },
	}
}

func (sb *sandboxes) register(h *tools.Host) {
	reply := func(v any) (*mcp.CallToolResult, any, error) {
		return textResult(jsonText(v), h.MaxReply()), nil, nil
	}
	// own answers the peer's "access denied" for a sandbox that is not
	// the caller's (or does not exist).
	own := func(req *mcp.CallToolRequest, id string) bool {
		return id != "" && h.OwnSession(req, id)
	}
	// denied is the answer for a sandbox the caller cannot use: the
	// peer's words for one that is not theirs, and what happened to one
	// that was and has ended (it expired, or a run broke a limit).
	denied := func(req *mcp.CallToolRequest, id string) (*mcp.CallToolResult, any, error) {
		sb.mu.Lock()
		e, known := sb.names[id]
		sb.mu.Unlock()
		if known && e.owner == h.CallerKey(req) && e.owner != "" {
			return reply(map[string]any{"error": "Sandbox " + id + " has ended (it expired, or a run exceeded a limit and took it down); create a new one with create_sandbox."})
		}
		return reply(map[string]any{"error": accessDenied})
	}
	tools.AddTool(h, &mcp.Tool{
		Name:        "create_sandbox",
		Description: "Create a new Python sandbox and return its sandbox_id. Files and installed packages persist in it between calls.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"name":{"anyOf":[{"type":"string"},{"type":"null"}],"default":null,"title":"Name"}}}`),
	}, func(ctx context.Context, req *mcp.CallToolRequest, in CreateSandboxInput) (*mcp.CallToolResult, any, error) {
		if in.Name != nil && len(*in.Name) > maxSandboxName {
			return reply(orderedMap{{"error", true}, {"message", fmt.Sprintf("The name is too long (%d bytes; at most %d).", len(*in.Name), maxSandboxName)}})
		}
		sb.prune(h)
		n := len(h.Sessions(req))
		out, refused := h.CreateSession(ctx, req, tools.CreateSessionInput{})
		if refused != nil {
			return reply(orderedMap{{"error", true}, {"message", refusalText(refused)}})
		}
		name := fmt.Sprintf("Sandbox %d", n+1)
		if in.Name != nil && *in.Name != "" {
			name = *in.Name
		}
		sb.mu.Lock()
		sb.names[out.SessionID] = sandboxEntry{owner: h.CallerKey(req), name: name, pkgs: map[string]string{}}
		sb.mu.Unlock()
		return reply(orderedMap{{"sandbox_id", out.SessionID}, {"user_id", h.Identity(req)}, {"name", name}, {"status", "active"}})
	})
	tools.AddTool(h, &mcp.Tool{
		Name:        "list_sandboxes",
		Description: "List your sandboxes with their names and installed packages.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{}}`),
	}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		var list []any
		for _, s := range h.Sessions(req) {
			sb.mu.Lock()
			e := sb.names[s.ID]
			name := e.name
			pkgs := []any{}
			for _, p := range slices.Sorted(maps.Keys(e.pkgs)) {
				pkgs = append(pkgs, orderedMap{{"name", p}, {"version", e.pkgs[p]}})
			}
			sb.mu.Unlock()
			list = append(list, orderedMap{{"sandbox_id", s.ID}, {"name", name}, {"installed_packages", pkgs}})
		}
		if len(list) == 0 {
			// The peer (FastMCP 2.5) sends an empty list as no content.
			return &mcp.CallToolResult{Content: []mcp.Content{}}, nil, nil
		}
		return reply(list)
	})
	tools.AddTool(h, &mcp.Tool{
		Name:        "execute_python_code",
		Description: "Run Python code in a sandbox. Returns stdout, stderr, exit_code, and the files the code created or changed in the working directory, with links to read them (MCP resources).",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"sandbox_id":{"type":"string","title":"Sandbox Id"},"code":{"type":"string","title":"Code"}},"required":["sandbox_id","code"]}`),
	}, func(ctx context.Context, req *mcp.CallToolRequest, in ExecuteCodeInput) (*mcp.CallToolResult, any, error) {
		if !own(req, in.SandboxID) {
			return denied(req, in.SandboxID)
		}
		// A file's ctime comes from the kernel's coarse clock, up to a
		// tick (10 ms at HZ=100) behind time.Now: without the margin a
		// file written at once can look older than the run.
		since := float64(time.Now().Add(-20*time.Millisecond).UnixNano()) / 1e9
		res, refused := runIn(ctx, h, req, in.SandboxID, in.Code, "/tmp/code_to_run.py", nil)
		if refused != nil {
			return reply(orderedMap{{"error", refusalText(refused)}, {"stdout", ""}, {"stderr", ""}, {"exit_code", 1}, {"files", []string{}}, {"file_links", []string{}}})
		}
		files, links := []string{}, []string{}
		if fr, ref := helperIn(ctx, h, req, in.SandboxID, newFilesCode, map[string]any{"_since": since}); ref == nil && fr.Status == engine.StatusSuccess {
			if l, ok := fr.ReturnValue.([]any); ok {
				for _, f := range l {
					if p, ok := f.(string); ok {
						files = append(files, p)
						links = append(links, tools.FileURI(in.SandboxID, strings.TrimPrefix(p, "/work/")))
					}
				}
			}
		}
		stderr := res.Stderr
		if res.Status != engine.StatusSuccess && res.Status != engine.StatusError && res.Message != "" {
			stderr += "pysandbox: " + res.Message + "\n"
		}
		field := int(h.MaxReply() / 16) // two fields, JSON escapes up to six bytes a byte
		return reply(orderedMap{{"stdout", cutString(res.Stdout, field)}, {"stderr", cutString(stderr, field)}, {"exit_code", res.ExitCode}, {"files", files}, {"file_links", links}})
	})
	install := func(ctx context.Context, req *mcp.CallToolRequest, in PackageInput) (*mcp.CallToolResult, any, error) {
		if !own(req, in.SandboxID) {
			return denied(req, in.SandboxID)
		}
		out, refused := h.Install(ctx, req, tools.InstallPackageInput{SessionID: in.SandboxID, Packages: []string{in.PackageName}})
		end := float64(time.Now().UnixMilli()) / 1000
		switch {
		case refused != nil:
			return reply(orderedMap{{"status", "failed"}, {"message", "Failed to install " + in.PackageName}, {"complete", true}, {"success", false}, {"stderr", refusalText(refused)}, {"end_time", end}})
		case out.Status != "installed":
			return reply(orderedMap{{"status", "failed"}, {"message", "Failed to install " + in.PackageName}, {"complete", true}, {"success", false}, {"stderr", out.Message}, {"end_time", end}})
		}
		sb.noteVersion(ctx, h, req, in)
		return reply(orderedMap{{"status", "success"}, {"message", "Successfully installed " + in.PackageName}, {"complete", true}, {"success", true}, {"end_time", end}})
	}
	tools.AddTool(h, &mcp.Tool{
		Name:        "install_package_in_sandbox",
		Description: "Install a Python package in a sandbox (in a sandbox of its own, cached; never on the server). Waits until it is installed.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"sandbox_id":{"type":"string","title":"Sandbox Id"},"package_name":{"type":"string","title":"Package Name"}},"required":["sandbox_id","package_name"]}`),
	}, install)
	tools.AddTool(h, &mcp.Tool{
		Name:        "check_package_installation_status",
		Description: "Check whether a package is installed in a sandbox.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"sandbox_id":{"type":"string","title":"Sandbox Id"},"package_name":{"type":"string","title":"Package Name"}},"required":["sandbox_id","package_name"]}`),
	}, func(ctx context.Context, req *mcp.CallToolRequest, in struct {
		SandboxID   string `json:"sandbox_id"`
		PackageName string `json:"package_name"`
	}) (*mcp.CallToolResult, any, error) {
		if !own(req, in.SandboxID) {
			return denied(req, in.SandboxID)
		}
		v := sb.version(ctx, h, req, PackageInput(in))
		if v == "" {
			return reply(orderedMap{{"status", "not_found"}, {"message", "No installation record found for " + in.PackageName}, {"complete", false}, {"success", false}})
		}
		return reply(orderedMap{{"status", "success"}, {"message", "Successfully installed " + in.PackageName}, {"complete", true}, {"success", true}, {"version", v}})
	})
	tools.AddTool(h, &mcp.Tool{
		Name:        "execute_terminal_command",
		Description: "Run a shell command in a sandbox (inside it, with its limits), in its working directory.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"sandbox_id":{"type":"string","title":"Sandbox Id"},"command":{"type":"string","title":"Command"}},"required":["sandbox_id","command"]}`),
	}, func(ctx context.Context, req *mcp.CallToolRequest, in TerminalInput) (*mcp.CallToolResult, any, error) {
		if !own(req, in.SandboxID) {
			return denied(req, in.SandboxID)
		}
		res, refused := runIn(ctx, h, req, in.SandboxID, terminalCode, "<terminal>", map[string]any{"_command": in.Command})
		switch {
		case refused != nil:
			return reply(orderedMap{{"stdout", ""}, {"stderr", refusalText(refused)}, {"exit_code", -1}})
		case res.Status != engine.StatusSuccess:
			return reply(orderedMap{{"stdout", res.Stdout}, {"stderr", res.Stderr + res.Message}, {"exit_code", -1}})
		}
		field := int(h.MaxReply() / 16)
		code, err := strconv.Atoi(fmt.Sprint(res.ReturnValue))
		if err != nil {
			code = -1
		}
		return reply(orderedMap{{"stdout", cutString(res.Stdout, field)}, {"stderr", cutString(res.Stderr, field)}, {"exit_code", code}})
	})
	tools.AddTool(h, &mcp.Tool{
		Name: "upload_file_to_sandbox",
		Description: "Not available on pysandbox: it never reads files from the server's own disk by path. " +
			"Write files from code with execute_python_code, or ask the operator to serve pysandbox's own tools (upload_file takes the content).",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"sandbox_id":{"type":"string","title":"Sandbox Id"},"local_file_path":{"type":"string","title":"Local File Path"},` +
			`"dest_path":{"type":"string","default":"/app/results","title":"Dest Path"}},"required":["sandbox_id","local_file_path"]}`),
	}, func(ctx context.Context, req *mcp.CallToolRequest, in UploadInput) (*mcp.CallToolResult, any, error) {
		return reply(orderedMap{{"success", false}, {"error", true}, {"message", "pysandbox does not read files from the server's host by path (" + in.LocalFilePath +
			"): that would let any agent read the server's files. Write the file from code with execute_python_code instead."}})
	})
}

func (sb *sandboxes) version(ctx context.Context, h *tools.Host, req *mcp.CallToolRequest, in PackageInput) string {
	res, refused := helperIn(ctx, h, req, in.SandboxID, versionCode, map[string]any{"_name": in.PackageName})
	if refused != nil || res.Status != engine.StatusSuccess {
		return ""
	}
	v, _ := res.ReturnValue.(string)
	return v
}

func (sb *sandboxes) noteVersion(ctx context.Context, h *tools.Host, req *mcp.CallToolRequest, in PackageInput) {
	v := sb.version(ctx, h, req, in)
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if e, ok := sb.names[in.SandboxID]; ok && len(e.pkgs) < 256 {
		e.pkgs[cutString(in.PackageName, 200)] = v
	}
}

// orderedMap is a JSON object that keeps its keys' order, as the peer's
// dicts do.
type orderedMap []struct {
	k string
	v any
}

func (m orderedMap) MarshalJSON() ([]byte, error) {
	var b strings.Builder
	b.WriteByte('{')
	for i, kv := range m {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := govern.PlainJSON(kv.k, "")
		v, err := govern.PlainJSON(kv.v, "")
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return []byte(b.String()), nil
}

// cutString shortens a string field of a result to n bytes, at a
// character boundary, saying so: the JSON around it stays valid.
func cutString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	head := engine.Head(s, n)
	return head + fmt.Sprintf("\n... [%d more bytes cut: the reply would be larger than the server's limit]", len(s)-len(head))
}
