package profiles

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/tools"
)

// shibing624's mcp-run-python-code (Python Code Runner): run_python_code,
// save_to_file_and_run, pip_install_package and run_python_file, each
// returning one plain text. The peer runs exec() inside its own process
// and pip-installs into its own environment; here every call runs in the
// sandbox, and files and packages live in a session of the caller's own.

// RunCodeInput is run_python_code's input.
type RunCodeInput struct {
	Code string `json:"code" jsonschema:"the Python code to run"`
}

// Governed: a one-shot run.
func (in RunCodeInput) Governed() any { return tools.RunPythonInput{Code: in.Code} }

// SaveAndRunInput is save_to_file_and_run's input.
type SaveAndRunInput struct {
	FileName         string  `json:"file_name" jsonschema:"the file to save the code to, relative to the working directory"`
	Code             string  `json:"code" jsonschema:"the Python code to save and run"`
	VariableToReturn *string `json:"variable_to_return,omitempty" jsonschema:"a global variable whose value (str) is returned"`
	Overwrite        *bool   `json:"overwrite,omitempty" jsonschema:"overwrite the file when it exists (default true)"`
}

// workspaceSubject stands for the caller's workspace session, whose id is
// known only once the call runs, as the session a run is governed in.
// It matters: the policy then derives the code's facts in a sandbox of
// their own before the call, as for any session's run, rather than taking
// them from the run (whose code is runFileCode, not the caller's, and
// whose worker has run the caller's code before).
const workspaceSubject = "(your workspace)"

// Governed: a run of this code, in the caller's workspace.
func (in SaveAndRunInput) Governed() any {
	return tools.RunPythonInput{Code: in.Code, SessionID: workspaceSubject}
}

// RunFileInput is run_python_file's input.
type RunFileInput struct {
	FileName         string  `json:"file_name" jsonschema:"the file to run, relative to the working directory"`
	VariableToReturn *string `json:"variable_to_return,omitempty" jsonschema:"a global variable whose value (str) is returned"`
}

// Governed: a run (of a file already there), in the caller's workspace.
func (in RunFileInput) Governed() any {
	return tools.RunPythonInput{Code: "# runs the file " + in.FileName + " of the caller's workspace", SessionID: workspaceSubject}
}

// PipInstallInput is pip_install_package's input.
type PipInstallInput struct {
	PackageName string `json:"package_name" jsonschema:"the package to install (a PEP 508 requirement)"`
}

// Governed: an install.
func (in PipInstallInput) Governed() any {
	return tools.InstallPackageInput{Packages: []string{in.PackageName}}
}

// runFileCode runs a file of the workspace as __main__ and writes the
// named variable's str() after a marker line (the marker is random per
// call, so the file's own output cannot fake it), on stdout, which is not
// bounded like a return value; the return value says whether it was
// found. The file name and variable come in as inputs, never pasted into
// code.
const runFileCode = `import runpy as _runpy, os as _os, sys as _sys
_globals = _runpy.run_path(_os.path.join("/work", _file), run_name="__main__")
_value = _globals.get(_var) if _var else None
if _value is not None:
    _sys.stdout.write("\n" + _marker + "\n" + str(_value))
_value is not None
`

// sSchema is the official SDK's (pydantic's) inputSchema of a tool.
func sSchema(tool string, props string, required ...string) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"type":"object","properties":{%s},"required":["%s"],"title":"%sArguments"}`, props, strings.Join(required, `","`), tool))
}

// sOutput is its outputSchema of a tool returning str.
func sOutput(tool string) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"type":"object","properties":{"result":{"type":"string","title":"Result"}},"required":["result"],"title":"%sOutput"}`, tool))
}

const varToReturn = `"variable_to_return":{"anyOf":[{"type":"string"},{"type":"null"}],"default":null,"title":"Variable To Return"}`

func mcpRunPythonCode(Options) tools.Profile {
	ws := newWorkspaces()
	return tools.Profile{
		Name:         "mcp-run-python-code",
		Tools:        []string{"run_python_code", "save_to_file_and_run", "pip_install_package", "run_python_file"},
		ServerName:   "RunPythonCodeServer",
		Instructions: "Execute Python code, install python packages, and run Python files",
		Register: func(h *tools.Host) {
			tools.AddTool(h, &mcp.Tool{
				Name:         "run_python_code",
				Description:  "Run Python code in a sandbox and return what it printed (stdout), or \"Error: ...\" with the traceback when it raised.",
				InputSchema:  sSchema("run_python_code", `"code":{"type":"string","title":"Code"}`, "code"),
				OutputSchema: sOutput("run_python_code"),
			}, func(ctx context.Context, req *mcp.CallToolRequest, in RunCodeInput) (*mcp.CallToolResult, *WrappedText, error) {
				res, refused := h.Run(ctx, req, tools.RunPythonInput{Code: in.Code, Filename: "<string>"})
				if refused != nil {
					return wrappedCut(h, "Error: "+refusalText(refused))
				}
				if res.Status != engine.StatusSuccess {
					return wrappedCut(h, runError(res))
				}
				return wrappedCut(h, strings.TrimSpace(res.Stdout))
			})
			tools.AddTool(h, &mcp.Tool{
				Name: "save_to_file_and_run",
				Description: "Save Python code to a file in your workspace and run it. Returns the str() of variable_to_return when given, " +
					"\"Variable NAME not found\" when it is missing or None, else \"successfully ran PATH\".",
				InputSchema: sSchema("save_to_file_and_run", `"file_name":{"type":"string","title":"File Name"},"code":{"type":"string","title":"Code"},`+varToReturn+
					`,"overwrite":{"type":"boolean","default":true,"title":"Overwrite"}`, "file_name", "code"),
				OutputSchema: sOutput("save_to_file_and_run"),
			}, func(ctx context.Context, req *mcp.CallToolRequest, in SaveAndRunInput) (*mcp.CallToolResult, *WrappedText, error) {
				fail := func(msg string) (*mcp.CallToolResult, *WrappedText, error) {
					return wrappedCut(h, "Error saving and running code: "+msg)
				}
				name, err := workspaceName(in.FileName)
				if err != nil {
					return fail(err.Error())
				}
				session, refused := ws.get(ctx, h, req)
				if refused != nil {
					return fail(refusalText(refused))
				}
				if in.Overwrite != nil && !*in.Overwrite {
					res, refused := helperIn(ctx, h, req, session, "import os\nos.path.exists(os.path.join('/work', _file))", map[string]any{"_file": name})
					if refused != nil {
						return fail(refusalText(refused))
					}
					if res.ReturnValue == true {
						return wrappedCut(h, "File "+in.FileName+" already exists")
					}
				}
				if _, refused := h.Upload(ctx, req, tools.UploadFileInput{SessionID: session, Path: name, Content: in.Code}); refused != nil {
					return fail(refusalText(refused))
				}
				return runFile(ctx, h, req, session, name, in.VariableToReturn, "Error saving and running code: ")
			})
			tools.AddTool(h, &mcp.Tool{
				Name:         "run_python_file",
				Description:  "Run a Python file of your workspace (saved by save_to_file_and_run). Returns the str() of variable_to_return when given, else \"successfully ran PATH\".",
				InputSchema:  sSchema("run_python_file", `"file_name":{"type":"string","title":"File Name"},`+varToReturn, "file_name"),
				OutputSchema: sOutput("run_python_file"),
			}, func(ctx context.Context, req *mcp.CallToolRequest, in RunFileInput) (*mcp.CallToolResult, *WrappedText, error) {
				name, err := workspaceName(in.FileName)
				if err != nil {
					return wrappedCut(h, "Error running file: "+err.Error())
				}
				session, refused := ws.get(ctx, h, req)
				if refused != nil {
					return wrappedCut(h, "Error running file: "+refusalText(refused))
				}
				return runFile(ctx, h, req, session, name, in.VariableToReturn, "Error running file: ")
			})
			tools.AddTool(h, &mcp.Tool{
				Name: "pip_install_package",
				Description: "Install a Python package into your workspace's environment (in a sandbox, never into the server's): " +
					"your later save_to_file_and_run and run_python_file calls can import it.",
				InputSchema:  sSchema("pip_install_package", `"package_name":{"type":"string","title":"Package Name"}`, "package_name"),
				OutputSchema: sOutput("pip_install_package"),
			}, func(ctx context.Context, req *mcp.CallToolRequest, in PipInstallInput) (*mcp.CallToolResult, *WrappedText, error) {
				session, refused := ws.get(ctx, h, req)
				if refused != nil {
					return wrappedCut(h, fmt.Sprintf("Error installing package %s: %s", in.PackageName, refusalText(refused)))
				}
				out, refused := h.Install(ctx, req, tools.InstallPackageInput{SessionID: session, Packages: []string{in.PackageName}})
				switch {
				case refused != nil:
					return wrappedCut(h, fmt.Sprintf("Error installing package %s: %s", in.PackageName, refusalText(refused)))
				case out.Status != "installed":
					return wrappedCut(h, fmt.Sprintf("Error installing package %s: %s", in.PackageName, out.Message))
				}
				return wrappedCut(h, fmt.Sprintf("Successfully installed package %s\n%s", in.PackageName, strings.Join(out.Requirements, "\n")))
			})
		},
	}
}

// runFile runs a workspace file, answering as the peer does.
func runFile(ctx context.Context, h *tools.Host, req *mcp.CallToolRequest, session, name string, variable *string, errPrefix string) (*mcp.CallToolResult, *WrappedText, error) {
	v := ""
	if variable != nil {
		v = *variable
	}
	marker := "--pysandbox-value-" + randomHex() + "--"
	res, refused := runIn(ctx, h, req, session, runFileCode, "<run_file>", map[string]any{"_file": name, "_var": v, "_marker": marker})
	switch {
	case refused != nil:
		return wrappedCut(h, errPrefix+refusalText(refused))
	case res.Status == engine.StatusTimeout:
		msg, _, _ := strings.Cut(res.Message, ";")
		return wrappedCut(h, errPrefix+"TimeoutError: "+msg)
	case !res.Completed():
		msg := res.Message
		if res.Error != nil {
			msg = pyErrorText(res.Error.Type, res.Error.Message)
		}
		return wrappedCut(h, errPrefix+msg)
	case v == "":
		return wrappedCut(h, "successfully ran "+path.Join("/work", name))
	case res.ReturnValue != true:
		return wrappedCut(h, "Variable "+v+" not found")
	}
	i := strings.LastIndex(res.Stdout, "\n"+marker+"\n")
	if i < 0 {
		// Cut away by the output bound, with the head of the output.
		return wrappedCut(h, errPrefix+"the value of "+v+" was larger than the server's output limit")
	}
	return wrappedCut(h, res.Stdout[i+len(marker)+2:])
}

func randomHex() string {
	b := make([]byte, 12)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// pyErrorText is str(exception) the way the peer shows an OSError:
// "[Errno 2] No such file or directory: '...'" is the message already.
func pyErrorText(typ, msg string) string {
	if msg == "" {
		return typ
	}
	return msg
}

// runError is the peer's "Error: MESSAGE\n\nTraceback:\nTRACEBACK".
func runError(res *engine.Result) string {
	if res.Status == engine.StatusTimeout {
		// The peer has no timeout; its clients read "Error: ...".
		msg, _, _ := strings.Cut(res.Message, ";")
		return "Error: TimeoutError: " + msg
	}
	if res.Error == nil {
		return "Error: " + res.Message
	}
	msg := res.Error.Message
	if res.Status != engine.StatusError && res.Message != "" {
		msg = res.Message
	}
	if msg == "" {
		msg = res.Error.Type
	}
	return "Error: " + msg + "\n\nTraceback:\n" + res.Error.Traceback
}

// workspaceName checks a file name from a client: a relative path inside
// the workspace. The peer took any path, absolute or with "..", on the
// server's own disk.
func workspaceName(name string) (string, error) {
	clean := path.Clean(strings.TrimSpace(name))
	switch {
	case name == "" || clean == ".":
		return "", fmt.Errorf("file_name is required")
	case path.IsAbs(clean) || clean == ".." || strings.HasPrefix(clean, "../"):
		return "", fmt.Errorf("file_name %q must be a relative path inside your workspace (no leading / and no ..)", name)
	case strings.ContainsAny(name, "\x00\n\r"):
		return "", fmt.Errorf("file_name %q holds a character a file name cannot", name)
	}
	return clean, nil
}
