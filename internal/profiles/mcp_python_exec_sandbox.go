package profiles

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/pep"
	"github.com/pysandbox/pysandbox/internal/tools"
)

// lu-zhengda's mcp-python-exec-sandbox: execute_python, check_environment
// and validate_script, each returning one text, which FastMCP also wraps
// as {"result": text}.

// wrapResultSchema is FastMCP's outputSchema of a tool returning str.
var wrapResultSchema = json.RawMessage(`{"type":"object","properties":{"result":{"type":"string"}},"required":["result"],"x-fastmcp-wrap-result":true}`)

// WrappedText is such a tool's structured result.
type WrappedText struct {
	Result string `json:"result"`
}

func wrapped(text string) (*mcp.CallToolResult, *WrappedText, error) {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, &WrappedText{Result: text}, nil
}

const executePythonDescription = `Execute a Python script in an isolated sandbox and return its output.

The script runs as a file (script semantics, not a REPL: print what you want to see), in a fresh process every call; nothing persists between calls.
Dependencies can be given in the dependencies parameter (PEP 508, pin versions: ["requests>=2.31", "pandas==2.2.3"]) or, preferably, in an inline PEP 723 block at the top of the script:

    # /// script
    # dependencies = ["requests>=2.31"]
    # ///

Both are merged (the parameter wins for the same package). timeout_seconds is clamped to 1..the server's maximum.
The result has --- stdout ---, --- stderr --- (each only when not empty, each cut at the server's output limit), --- exit_code: N ---, --- duration_ms: N --- and, when the script ran out of time, --- timed_out: true ---.`

const validateScriptLDescription = `Validate a script's inline metadata (PEP 723 block) and dependencies without running it.

Returns VALID with the script's requires-python and the merged dependency list, or INVALID: and the reason (malformed TOML in the metadata block, a dependency that is not a PEP 508 requirement, a package the server's policy refuses).`

const checkEnvironmentLDescription = `Report the execution environment: Python version, installer, platform, sandbox backend and status, timeouts, output limit.`

var executePythonSchema = json.RawMessage(`{"type":"object","properties":{"script":{"type":"string","title":"Script"},` +
	`"dependencies":{"anyOf":[{"type":"array","items":{"type":"string"}},{"type":"null"}],"default":null,"title":"Dependencies"},` +
	`"timeout_seconds":{"type":"integer","default":%d,"title":"Timeout Seconds"}},"required":["script"]}`)

var validateScriptLSchema = json.RawMessage(`{"type":"object","properties":{"script":{"type":"string","title":"Script"},` +
	`"dependencies":{"anyOf":[{"type":"array","items":{"type":"string"}},{"type":"null"}],"default":null,"title":"Dependencies"}},"required":["script"]}`)

// ExecutePythonInput is execute_python's input.
type ExecutePythonInput struct {
	Script         string   `json:"script"`
	Dependencies   []string `json:"dependencies"`
	TimeoutSeconds *int     `json:"timeout_seconds"`
	timeout        float64
}

// Governed: the call is a run_python call.
func (in ExecutePythonInput) Governed() any { return in.run() }

func (in ExecutePythonInput) run() tools.RunPythonInput {
	return tools.RunPythonInput{Code: in.Script, Dependencies: in.Dependencies, TimeoutSeconds: in.timeout, Filename: "script.py"}
}

// ValidateScriptLInput is validate_script's input.
type ValidateScriptLInput struct {
	Script       string   `json:"script"`
	Dependencies []string `json:"dependencies"`
}

// execLimits are the profile's timeouts and output cap, within the
// server's.
type execLimits struct {
	def, max time.Duration
	maxOut   int
}

// execLimits: the server's default and maximum timeouts (its --timeout,
// alias --default-timeout, and --max-timeout, whose defaults are the
// peer's 30 s and 300 s), and the output cap.
func (o Options) execLimits(e *engine.Engine) execLimits {
	cfg := e.Config()
	l := execLimits{def: cfg.DefaultTimeout, max: cfg.MaxTimeout, maxOut: 102400}
	if l.def <= 0 {
		l.def = 30 * time.Second
	}
	if l.max <= 0 {
		l.max = 300 * time.Second
	}
	if o.MaxOutputBytes > 0 {
		l.maxOut = o.MaxOutputBytes
	}
	l.def = min(l.def, l.max)
	return l
}

func mcpPythonExecSandbox(opts Options) tools.Profile {
	return tools.Profile{
		Name:         "mcp-python-exec-sandbox",
		Tools:        []string{"execute_python", "check_environment", "validate_script"},
		ServerName:   "mcp-python-exec-sandbox",
		Instructions: "Execute Python scripts in a sandbox: execute_python runs a script (with dependencies), validate_script checks its metadata, check_environment describes the sandbox.",
		Register: func(h *tools.Host) {
			lim := opts.execLimits(h.Engine())
			tools.AddTool(h, &mcp.Tool{
				Name:         "execute_python",
				Description:  executePythonDescription,
				InputSchema:  json.RawMessage(fmt.Sprintf(string(executePythonSchema), int(lim.def.Seconds()))),
				OutputSchema: wrapResultSchema,
			}, func(ctx context.Context, req *mcp.CallToolRequest, in ExecutePythonInput) (*mcp.CallToolResult, *WrappedText, error) {
				in.timeout = clampTimeout(in.TimeoutSeconds, lim)
				res, refused := h.Run(ctx, req, in.run())
				if refused != nil {
					// A call refused before anything ran (a bad argument, a
					// quota, the sandbox): as the peer reports its own
					// failures, a FastMCP tool error.
					msg := "Error calling tool 'execute_python': " + refusalText(refused)
					return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: msg}}}, nil, nil
				}
				return wrapped(cutText(executePythonText(res, lim.maxOut), h.MaxReply()/2))
			})
			tools.AddTool(h, &mcp.Tool{
				Name:         "check_environment",
				Description:  checkEnvironmentLDescription,
				InputSchema:  json.RawMessage(`{"type":"object","properties":{}}`),
				OutputSchema: wrapResultSchema,
			}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, *WrappedText, error) {
				p, _ := h.Posture(ctx, req)
				return wrapped(checkEnvironmentText(p, lim))
			})
			tools.AddTool(h, &mcp.Tool{
				Name:         "validate_script",
				Description:  validateScriptLDescription,
				InputSchema:  validateScriptLSchema,
				OutputSchema: wrapResultSchema,
			}, func(ctx context.Context, req *mcp.CallToolRequest, in ValidateScriptLInput) (*mcp.CallToolResult, *WrappedText, error) {
				p, _ := h.Posture(ctx, req)
				return wrapped(validateText(in, p, h.CheckPackage))
			})
		},
	}
}

// clampTimeout: the peer's default when absent, then 1..max.
func clampTimeout(t *int, lim execLimits) float64 {
	s := lim.def.Seconds()
	if t != nil {
		s = float64(*t)
	}
	return max(1, min(s, lim.max.Seconds()))
}

// executePythonText is the peer's sectioned text. Each stream is cut at
// maxOut bytes (at a character boundary) with the peer's marker; what
// pysandbox itself says of a run (a memory limit, an output flood) is
// added to stderr, where the peer's clients look for trouble.
func executePythonText(res *engine.Result, maxOut int) string {
	stderr := res.Stderr
	if res.Message != "" && res.Status != engine.StatusSuccess && res.Status != engine.StatusError && res.Status != engine.StatusTimeout {
		if stderr != "" && !strings.HasSuffix(stderr, "\n") {
			stderr += "\n"
		}
		stderr += "pysandbox: " + res.Message + "\n"
	}
	var parts []string
	if res.Stdout != "" {
		parts = append(parts, "--- stdout ---\n"+truncateStream(res.Stdout, maxOut))
	}
	if stderr != "" {
		parts = append(parts, "--- stderr ---\n"+truncateStream(stderr, maxOut))
	}
	code := res.ExitCode
	if res.Status == engine.StatusTimeout {
		code = -9 // the peer's: its child was SIGKILLed
	}
	parts = append(parts, fmt.Sprintf("--- exit_code: %d ---", code), fmt.Sprintf("--- duration_ms: %d ---", res.DurationMS))
	if res.Status == engine.StatusTimeout {
		parts = append(parts, "--- timed_out: true ---")
	}
	return strings.Join(parts, "\n")
}

func truncateStream(s string, maxOut int) string {
	if len(s) <= maxOut {
		return s
	}
	head := engine.Head(s, maxOut)
	if maxOut < 1024 {
		return head + fmt.Sprintf("\n... [truncated at %d bytes]", maxOut)
	}
	return head + fmt.Sprintf("\n... [truncated at %dKB]", maxOut/1024)
}

// checkEnvironmentText is the peer's nine lines, with pysandbox's truth.
func checkEnvironmentText(p *engine.Posture, lim execLimits) string {
	py, status := "unknown", "unusable: "+strings.Join(p.Problems, "; ")
	if p.Python != nil {
		py = p.Python.MajorMinor()
	}
	if p.Usable() {
		status = fmt.Sprintf("%s (namespaces, seccomp, %s memory limit, %s)", p.Posture, p.Limits.MemoryEnforcedBy, p.Network)
	}
	warm := "disabled"
	if p.Pool != nil {
		warm = "enabled (warm pool)"
	}
	return strings.Join([]string{
		"Python version: " + py,
		"uv: pysandbox installer (pip or uv, in a sandbox of its own; environments cached)",
		"Platform: " + platform(),
		"Sandbox backend: " + p.Backend,
		"Sandbox status: " + status,
		fmt.Sprintf("Default timeout: %ds", int(lim.def.Seconds())),
		fmt.Sprintf("Max timeout: %ds", int(lim.max.Seconds())),
		fmt.Sprintf("Max output: %d bytes", lim.maxOut),
		"Cache warming: " + warm,
	}, "\n")
}

func platform() string {
	arch := map[string]string{"amd64": "x86_64", "arm64": "aarch64"}[runtime.GOARCH]
	if arch == "" {
		arch = runtime.GOARCH
	}
	return "Linux " + arch
}

// validateText is the peer's VALID / INVALID text. Unlike the peer, a
// dependency must be a PEP 508 requirement, and one the server's package
// rules refuse is INVALID.
func validateText(in ValidateScriptLInput, p *engine.Posture, check func(string) error) string {
	meta, err := pep.ParseScriptMetadata(in.Script)
	if err != nil {
		return "INVALID: Malformed TOML in script metadata: " + err.Error()
	}
	requires := ""
	var deps []string
	if meta != nil {
		requires, deps = meta.RequiresPython, meta.Dependencies
	}
	if requires == "" && p.Python != nil {
		requires = ">=" + p.Python.MajorMinor()
	}
	// Merged by normalised name; the parameter wins.
	merged := map[string]int{}
	var out []string
	for _, list := range [][]string{deps, in.Dependencies} {
		for _, d := range list {
			r, err := pep.ParseRequirement(d)
			if err != nil {
				return fmt.Sprintf("INVALID: dependency %q is not a PEP 508 requirement: %v", d, err)
			}
			if err := check(r.Normalized); err != nil {
				return fmt.Sprintf("INVALID: the server's package policy refuses it: %v", err)
			}
			if i, ok := merged[r.Normalized]; ok {
				out[i] = d
				continue
			}
			merged[r.Normalized] = len(out)
			out = append(out, d)
		}
	}
	var b strings.Builder
	b.WriteString("VALID\nrequires-python: " + requires + "\n")
	if len(out) == 0 {
		b.WriteString("dependencies: none")
	} else {
		fmt.Fprintf(&b, "dependencies (%d):", len(out))
		for _, d := range out {
			b.WriteString("\n  - " + d)
		}
	}
	return b.String()
}
