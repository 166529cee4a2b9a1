package tools

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/pysandbox/pysandbox/internal/govern"
	"math"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/engine"
)

// RunPythonInput is run_python's input: the code, and optionally a
// session to run in, dependencies to install first and the interpreter.
type RunPythonInput struct {
	Code           string     `json:"code" jsonschema:"Python 3 source code to run. The value of the last expression statement is returned as return_value, like a notebook cell. Top-level await works. Print to show output."`
	TimeoutSeconds float64    `json:"timeout_seconds,omitempty" jsonschema:"Wall-clock limit in seconds (default 30; the server's maximum applies). Every process the code started is killed when it passes. Many clients give up on a call after 60 s without news: pass a progress token (and let progress reset the client's timeout) and the server sends the run's output and a heartbeat every 5 s."`
	Inputs         JSONInputs `json:"inputs,omitempty" jsonschema:"JSON values to pass in: each key becomes a global variable of that name before the code runs. This is how to give the code data: its stdin is empty (input() raises EOFError)."`
	SessionID      string     `json:"session_id,omitempty" jsonschema:"Run in this session (from create_session): its variables, imports and files persist between calls. Omit for a fresh sandbox."`
	Dependencies   []string   `json:"dependencies,omitempty" jsonschema:"PEP 508 requirements to install first, e.g. [\"pandas>=2\", \"requests\"]; merged with an inline '# /// script' block in the code. Installed once and cached; one the server's Python already meets as it is is not installed again."`
	PythonVersion  string     `json:"python_version,omitempty" jsonschema:"Python to run on, e.g. \"3.12\": one the host has, or one the server downloads once (check_environment lists both; the first run on a download waits for it). Default: the server's, or the newest that meets the script's requires-python."`
	// Filename names the code in tracebacks ("<code>" when empty); tool
	// profiles set their peer's (main.py, script.py).
	Filename string `json:"-"`
}

// JSONInputs are a run's inputs as the client sent them: numbers are
// decoded as json.Number, so that each reaches the code as its literal
// (9007199254740993 and 12345678901234567890 exact, 2.0 a float, -0.0
// with its sign), not rounded through a float64. Its schema is a map
// string -> any JSON value, as map[string]any's.
type JSONInputs map[string]any

// UnmarshalJSON decodes an object, keeping its numbers' text.
func (in *JSONInputs) UnmarshalJSON(b []byte) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		return err
	}
	*in = m
	return nil
}

const runPythonDescription = `Run Python 3 code in a fresh, isolated sandbox and return its output.

Without session_id each call starts from a clean interpreter: no variables, files or processes survive between calls. With a session_id from create_session the code runs in that session, where variables, imports and files in /work persist. The sandbox has no network access, cannot see the host's files, and has limited memory, processes and time (see check_environment). /tmp and the working directory /work are writable scratch space, held in memory (their files count towards the memory limit), discarded after a one-shot run and when a session ends.

The result has status (success, error, timeout, memory_limit, output_limit, killed or cancelled; a call refused before anything ran says invalid_request, denied, busy, quota, install_error or sandbox_error, with a message saying what to do; only output_limit of a run that completed, its output cut to head and tail, is not an error), exit_code, stdout, stderr (tracebacks use your code's own line numbers), return_value (the JSON value of the last expression, or its repr if it is not JSON-serialisable, or null), and duration_ms. Use inputs to pass data in as global variables instead of pasting it into the code. matplotlib figures left open (or shown with plt.show()) come back as PNG images, at most 16 a run; those that do not fit the server's reply limit come back as resource links. Each run gets a CPU quota (see check_environment); between runs a session's processes get almost no CPU.`

func (s *server) addRunPython(srv *mcp.Server) {
	desc := runPythonDescription
	if s.networkOn() {
		desc = strings.Replace(desc, noNetworkSentence, proxyNetworkSentence, 1)
	}
	if s.upstreamsOn() {
		desc += "\n\n" + toolsFromCodeSentence
	}
	addTool(s, srv, &mcp.Tool{
		Name:        "run_python",
		Title:       "Run Python",
		Description: desc,
		Annotations: &mcp.ToolAnnotations{OpenWorldHint: ptr(s.networkOn()), DestructiveHint: ptr(false)},
	}, s.runPython)
}

// toolsFromCodeSentence tells the agent that code can call the upstream
// servers' tools, and how to find them, without listing them (that is
// list_tools_in_sandbox's job: the list can be long).
const toolsFromCodeSentence = "The code can also call the tools of other MCP servers this server is configured with: `import tools`, then `tools.SERVER.TOOL(arg=...)` returns the tool's structured result (or its text), and `await tools.SERVER.TOOL.acall(...)` with asyncio.gather makes calls in parallel. Call list_tools_in_sandbox to see which tools exist and their signatures (or tools.list() and help(tools.SERVER.TOOL) from code). Keep intermediate data in the sandbox and return only what matters. Each call is checked by the server's policy and recorded; a refused or failed call raises tools.ToolError (or a subclass) naming the reason."

// The description's words on the network, without and with the proxy.
const (
	noNetworkSentence    = "The sandbox has no network access, cannot see"
	proxyNetworkSentence = "The sandbox reaches the network only through the server's proxy (HTTP_PROXY and HTTPS_PROXY are set, so urllib, requests, httpx, pip and pandas use it), and only the hosts the server's network policy allows (check_environment lists them); any other connection is refused with a message saying why. It cannot see"
)

func (s *server) runPython(ctx context.Context, req *mcp.CallToolRequest, in RunPythonInput) (*mcp.CallToolResult, *RunPythonOutput, error) {
	res, use, refused := s.execute(ctx, req, in)
	if refused != nil {
		return nil, nil, refused
	}
	out := runPythonOutput(res, use)
	content := s.boundReply(out, in.SessionID, identity(req))
	if out.Resumed != "" {
		content = append([]mcp.Content{&mcp.TextContent{Text: out.Resumed + "."}}, content...)
	}
	// A run that completed with its output cut is a result, not a
	// failure: its status says what was cut.
	return &mcp.CallToolResult{IsError: !res.Completed(), Content: content}, out, nil
}

// execute runs code as run_python does (the caller's quota, its session,
// the network the policy gives it, tools from code), and reports what it
// measured besides; when nothing ran, refused is the result to return
// instead.
func (s *server) execute(ctx context.Context, req *mcp.CallToolRequest, in RunPythonInput) (res *engine.Result, use runUsage, refused *govern.Refusal) {
	run, msg := s.checkRunInput(in)
	if msg != "" {
		return nil, use, errorResult(msg)
	}
	nt := newNotifier(ctx, req)
	run.Progress = nt.progressFunc()
	run.Caller = identity(req)
	// The policy's rules on the code, decided in the run's sandbox from
	// what its parser says, before any of the code runs.
	run.Gate = s.gateOf(req)
	release, refused := s.takeQuota(ctx, req)
	if refused != nil {
		return nil, use, refused
	}
	defer release()
	// What the run prints reaches the client as it happens (live.go).
	var stopLive func()
	run.Stdout, run.Stderr, stopLive = nt.liveOutput()
	defer stopLive()
	var err error
	if in.SessionID != "" {
		resumed, err := s.ownAwake(ctx, req, in.SessionID)
		if err != nil {
			return nil, use, sessionError(ctx, err)
		}
		if resumed != nil {
			use.resumed = resumed.Summary()
		}
		usage := s.sessionCall(ctx, req, in.SessionID)
		tr := s.newToolRun(ctx, req, in.SessionID)
		run.Tools = tr.tools()
		res, err = s.sessions.Run(ctx, in.SessionID, run)
		if errors.As(err, new(*engine.PausedError)) {
			// Paused while this call waited for its turn (pause_session,
			// or a drain that then stopped short): resume it and run.
			if resumed, werr := s.wake(ctx, req, in.SessionID); werr == nil {
				if resumed != nil {
					use.resumed = resumed.Summary()
				}
				res, err = s.sessions.Run(ctx, in.SessionID, run)
			}
		}
		tr.finish()
		use = runUsage{network: usage(), toolCalls: tr.Usage(), resumed: use.resumed}
		if err != nil && !errors.Is(err, engine.ErrBusy) {
			return nil, use, sessionError(ctx, err)
		}
	} else {
		var usage func() *NetUsage
		run.Network, usage = s.runNetwork(ctx, req, "run_python")
		tr := s.newToolRun(ctx, req, "")
		run.Tools = tr.tools()
		res, err = s.eng.Run(ctx, run)
		tr.finish()
		if res != nil {
			use = runUsage{network: usage(), toolCalls: tr.Usage()}
		}
	}
	if r, ok := deniedError(err); ok {
		return nil, use, r
	}
	var reqErr *engine.RequestError
	switch {
	case errors.As(err, &reqErr):
		return nil, use, errorResult(reqErr.Error() + ".")
	case errors.Is(err, engine.ErrBusy):
		return nil, use, busyResult(err)
	case err != nil && ctx.Err() != nil:
		return nil, use, refusal(govern.StatusCancelled, "The call was cancelled before the code ran.")
	case err != nil:
		s.log.Error("run failed", "err", err)
		return nil, use, refusal(govern.StatusSandboxError, fmt.Sprintf("The sandbox could not run the code: %v. Nothing was run; run check_environment to see whether the sandbox works on this server.", err))
	}
	s.hintNoNetwork(res)
	return res, use, nil
}

// checkRunInput turns what the client sent into a request, and checks it
// (the engine's check, made here before anything else is: the quota, the
// session). The message, when not empty, tells the agent what to change.
func (s *server) checkRunInput(in RunPythonInput) (engine.RunRequest, string) {
	run := engine.RunRequest{Code: in.Code, Filename: in.Filename, Dependencies: in.Dependencies, PythonVersion: in.PythonVersion}
	if len(in.Inputs) > 0 {
		run.Inputs = make(map[string]json.RawMessage, len(in.Inputs))
		for k, v := range in.Inputs {
			b, err := json.Marshal(v)
			if err != nil {
				return run, fmt.Sprintf("inputs[%q] is not JSON: %v", k, err)
			}
			run.Inputs[k] = b
		}
	}
	if err := run.Validate(); err != nil {
		return run, err.Error() + "."
	}
	// timeout_seconds is the MCP argument's: the engine takes any timeout
	// up to its maximum.
	maxT := s.eng.Config().MaxTimeout
	if in.TimeoutSeconds != 0 {
		if math.IsNaN(in.TimeoutSeconds) || in.TimeoutSeconds < 0 {
			return run, "timeout_seconds must be a positive number of seconds."
		}
		if in.TimeoutSeconds > maxT.Seconds() {
			return run, fmt.Sprintf("timeout_seconds %.0f is above this server's maximum of %.0f seconds; pass a smaller value.", in.TimeoutSeconds, maxT.Seconds())
		}
		run.Timeout = time.Duration(in.TimeoutSeconds * float64(time.Second))
	}
	return run, ""
}

// checkCode is the engine's check of code, as a message for the agent.
func checkCode(code string) string {
	if err := engine.CheckCode(code); err != nil {
		return err.Error() + "."
	}
	return ""
}

func ptr[T any](v T) *T { return &v }

// runNumber numbers a session's runs for figure file names.
func (s *server) runNumber(sessionID string) int {
	if sessionID == "" {
		return 0
	}
	for _, i := range s.sessions.List() {
		if i.ID == sessionID {
			return i.Runs
		}
	}
	return 0
}

// progressFunc sends MCP progress notifications when the client asked for
// them (a progress token in the call): installs can take a while.
func progressFunc(ctx context.Context, req *mcp.CallToolRequest) func(string) {
	return newNotifier(ctx, req).progressFunc()
}
