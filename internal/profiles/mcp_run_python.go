package profiles

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/pysandbox/pysandbox/internal/govern"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/tools"
)

// Pydantic's mcp-run-python (retired): one tool, run_python_code, whose
// result is XML-tagged text. Its description and input schema are the
// peer's, verbatim (its own test asserts the schema), except that the
// description names the Python the server runs (the peer's said 3.13).
const runPythonCodeDescription = "Tool to execute Python code and return stdout, stderr, and return value.\n\n" +
	"The code may be async, and the value on the last line will be returned as the return value.\n\n" +
	"The code will be executed with Python %s.\n"

// runPythonCodeDescriptionFor is the description naming the engine's
// default interpreter (3.13, the peer's, when it has none).
func runPythonCodeDescriptionFor(e *engine.Engine) string {
	version := "3.13"
	if e != nil {
		if py := e.Config().Python; py != nil && py.Major > 0 {
			version = py.MajorMinor()
		}
	}
	return fmt.Sprintf(runPythonCodeDescription, version)
}

// runPythonCodeSchema is the peer's inputSchema (zod-to-json-schema,
// draft-07).
var runPythonCodeSchema = json.RawMessage(`{"type":"object","properties":{"python_code":{"type":"string","description":"Python code to run"},` +
	`"global_variables":{"type":"object","additionalProperties":{},"default":{},"description":"Map of global variables in context when the code is executed"}},` +
	`"required":["python_code"],"additionalProperties":false,"$schema":"http://json-schema.org/draft-07/schema#"}`)

// RunPythonCodeInput is mcp-run-python's run_python_code input.
type RunPythonCodeInput struct {
	PythonCode      string           `json:"python_code"`
	GlobalVariables tools.JSONInputs `json:"global_variables,omitempty"`
	deps            []string
}

// Governed: the call is a run_python call.
func (in RunPythonCodeInput) Governed() any { return in.run() }

func (in RunPythonCodeInput) run() tools.RunPythonInput {
	return tools.RunPythonInput{Code: in.PythonCode, Inputs: in.GlobalVariables, Dependencies: in.deps, Filename: "main.py"}
}

func mcpRunPython(opts Options) tools.Profile {
	return tools.Profile{
		Name:         "mcp-run-python",
		Tools:        []string{"run_python_code"},
		ServerName:   "MCP Run Python",
		Instructions: `Call the "run_python_code" tool with the Python code to run.`,
		Register: func(h *tools.Host) {
			tools.AddTool(h, &mcp.Tool{
				Name:        "run_python_code",
				Title:       "Run Python code",
				Description: runPythonCodeDescriptionFor(h.Engine()),
				InputSchema: runPythonCodeSchema,
			}, func(ctx context.Context, req *mcp.CallToolRequest, in RunPythonCodeInput) (*mcp.CallToolResult, any, error) {
				in.deps = opts.Deps
				res, refused := h.Run(ctx, req, in.run())
				if refused != nil {
					return xmlResult("run-error", "", nil, refusalText(refused), h.MaxReply()), nil, nil
				}
				return runPythonCodeResult(res, h.MaxReply()), nil, nil
			})
		},
	}
}

// runPythonCodeResult is the peer's XML-tagged text: <status> (success,
// run-error or install-error), <output> (stdout and stderr together),
// <return_value> (a str verbatim, anything else as JSON indented by 2),
// <error> (the traceback, naming main.py). isError is never set: run
// errors are in the text, as the peer's clients expect.
func runPythonCodeResult(res *engine.Result, maxReply int64) *mcp.CallToolResult {
	output := res.Stdout + withoutTraceback(res)
	switch {
	case res.Completed():
		// (Output cut to its head and tail, by pysandbox's output cap,
		// from a run that completed.)
		return xmlResult("success", output, res.ReturnValue, "", maxReply)
	case res.Status == engine.StatusInstallError:
		return xmlResult("install-error", output, nil, res.Message, maxReply)
	case res.Status == engine.StatusTimeout:
		// The peer has no timeout: say it as Python would.
		msg, _, _ := strings.Cut(res.Message, ";")
		return xmlResult("run-error", output, nil, "TimeoutError: "+msg, maxReply)
	}
	errText := res.Message
	if res.Error != nil && res.Error.Traceback != "" {
		errText = res.Error.Traceback
		if res.Message != "" && res.Status != engine.StatusError {
			errText = res.Message + "\n" + errText
		}
	}
	return xmlResult("run-error", output, nil, errText, maxReply)
}

// withoutTraceback is stderr without the traceback that ends it (the peer
// shows that in <error> only).
func withoutTraceback(res *engine.Result) string {
	if res.Error != nil && res.Error.Traceback != "" {
		return strings.TrimSuffix(res.Stderr, res.Error.Traceback)
	}
	return res.Stderr
}

func xmlResult(status, output string, ret any, errText string, maxReply int64) *mcp.CallToolResult {
	var b strings.Builder
	b.WriteString("<status>" + status + "</status>")
	if output != "" {
		b.WriteString("\n<output>\n" + escapeTags(strings.TrimSuffix(output, "\n")) + "\n</output>")
	}
	if ret != nil {
		b.WriteString("\n<return_value>\n" + escapeTags(returnText(ret)) + "\n</return_value>")
	}
	if errText != "" {
		b.WriteString("\n<error>\n" + escapeTags(errText) + "\n</error>")
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: cutText(b.String(), maxReply)}}}
}

// returnText renders a return value as the peer does: a str verbatim,
// anything else as JSON indented by two spaces.
func returnText(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	b, _ := govern.PlainJSON(v, "  ")
	return string(b)
}

// escapeTags keeps a section's text from closing it: the peer escapes a
// literal closing tag as &lt;/output&gt; and so on.
func escapeTags(s string) string {
	for _, tag := range []string{"status", "output", "return_value", "error", "dependencies"} {
		s = strings.ReplaceAll(s, "</"+tag+">", "&lt;/"+tag+"&gt;")
	}
	return s
}

// refusalText is the message of a result that refused a call.
func refusalText(r *govern.Refusal) string { return r.Message }

// cutText bounds a text result by the server's reply limit, as it goes
// on the wire (JSON escapes included), at a character boundary.
func cutText(s string, maxReply int64) string {
	const note = "\n... [cut: the reply was larger than the server's limit]"
	for n := 0; n < 20; n++ {
		enc, _ := json.Marshal(s)
		if maxReply <= 0 || int64(len(enc)) <= maxReply {
			return s
		}
		limit := int(float64(len(s)) * float64(maxReply) / float64(len(enc)) * 0.95)
		s = strings.TrimSuffix(engine.Head(s, limit), note) + note
	}
	return s
}
