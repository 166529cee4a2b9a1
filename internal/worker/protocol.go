// Package worker holds the Python worker program that runs inside every
// sandbox, and the Go side of the small protocol used to drive it.
//
// The worker is started as `python3 -I -B -c BOOTSTRAP worker.py` (see
// Command; worker.py is embedded in the binary and placed read-only inside
// the sandbox). File descriptor 3 is a Unix
// stream socket: the control channel. File descriptors 1 and 2 are the user
// code's stdout and stderr and are never used for protocol traffic, so user
// output cannot forge protocol messages. Stdin is /dev/null.
//
// Messages are single-line JSON objects terminated by '\n' in both
// directions. The worker speaks first with a "ready" message. The Go side
// then sends requests; each request gets exactly one reply carrying the same
// id (an OpError reply for a request it cannot handle). A one-shot worker
// (started with --oneshot) exits after its first "run" with the run's exit
// code; otherwise it keeps reading requests until the socket is closed.
//
// A worker that is not one-shot is a session: every run executes in the same
// __main__ module, so globals and imports persist from one run to the next,
// like cells of a notebook. SIGINT sent to the worker during a run raises
// KeyboardInterrupt in the user's code, which ends that run with an error
// result (type "KeyboardInterrupt") and keeps the session; a SIGINT that
// arrives while the worker is not running user code (idle, or building a
// reply) is ignored. One that lands in an import is held back until the
// import is done, for up to about a second (worker.py's IMPORT_GRACE): an
// import cut short leaves the module broken for the rest of the session. A
// MemoryError leaves the globals as they are, memory included; the worker
// keeps room to read and compile a next run that frees it ("del big").
// Tracebacks find source lines by file name, so give every run its own
// Filename (e.g. "<cell 3>"): a function defined by an earlier run under
// the same name would be shown with the later run's lines. The working
// directory comes first on sys.path, as with `python -c`, so modules
// written there can be imported.
//
// Output and the reply travel on different channels: a run's reply follows
// everything the run printed through sys.stdout/sys.stderr, but output
// written later by threads or child processes the run left behind can
// arrive any time. OpSync writes a marker line to both fd 1 and fd 2 after
// flushing Python's buffers, so the reader of a long-lived pipe can tell
// where the output up to a point ends.
//
// After each run the worker renders the open matplotlib figures (only if
// the user code imported matplotlib.pyplot) and closes them; see Figure.
//
// A session can be saved and restored in another worker (OpSnapshot,
// OpRestore; see snapshot.go): the only requests whose messages carry raw
// bytes after their line.
//
// User code runs inside the worker process, so it can reach the control
// socket too: the sandbox, not the worker, is the security boundary, and
// everything the worker sends is untrusted input to the Go side.
package worker

import (
	"context"
	"encoding/json"
	"fmt"
)

// Tool calls from code. While a run is in flight (OpRun sent, its
// OpResult not yet read), and only when its Request.Tools is set, the
// worker may send OpToolCatalog and OpToolCall messages of its own on the
// control channel, with ids it picks ("t1", "t2", ...); the Go side
// answers each with one message of the same op (OpToolCatalog) or with
// OpToolResult, carrying the same id, in any order and possibly after
// other answers. Several calls may be in flight at once (up to
// MaxToolCallsInFlight). Once the run's OpResult is read, the Go side
// sends no more tool messages for it, and the worker drops any that
// arrive late (a OpToolResult is never a request). Python code in the run
// reaches this through the sandbox's "tools" module (sandbox_tools.py).
//
// Like everything else the worker sends, these messages are hostile: the
// Go side bounds them (MaxToolArgsBytes, MaxToolIDBytes, in-flight count)
// and answers a malformed one with an OpToolResult error (ToolFailBadRequest),
// or ends the exchange with a protocol violation when it cannot use its id
// to answer: an id that is missing, not a string, empty or longer than
// MaxToolIDBytes.
//
// Tool messages that arrive while no run with Tools is in flight (during
// another request, or a run without Tools) are answered at once with
// ToolFailCancelled, so that the stream stays in step.
//
// The worker sends no tool message for a run once it has begun to send
// the run's OpResult, and it only calls while user code of the run may
// still run (including a one-shot run's non-daemon threads and atexit
// handlers). A reply the Go side had begun to write when it read the
// OpResult is completed (within a few seconds; otherwise the Conn is
// unusable), any other is dropped.
const (
	// OpCodeFacts is sent by the worker once, before a run with Gate runs
	// its code: {"op":"code_facts","id":ID,"arguments":FACTS}. It is
	// answered with an OpToolResult of the same id, an error saying why
	// the code may not run or a result saying it may.
	OpCodeFacts   = "code_facts"
	OpToolCatalog = "tool_catalog" // worker → Go: list the tools; Go → worker: the list (ToolCatalog)
	OpToolCall    = "tool_call"    // worker → Go: call one tool (ToolCall)
	OpToolResult  = "tool_result"  // Go → worker: the outcome of one call (ToolReply)
)

// Bounds on tool messages from the worker.
const (
	// MaxToolCallsInFlight bounds the calls of one run waiting for their
	// answer; more are answered at once with a "limit" error.
	MaxToolCallsInFlight = 16
	// MaxToolArgsBytes bounds one call's arguments (JSON).
	MaxToolArgsBytes = 1 << 20
	// MaxFactsBytes bounds the facts of a gated run's code.
	MaxFactsBytes = 512 << 10
	// MaxToolIDBytes bounds the id a worker picks for a call.
	MaxToolIDBytes = 64
	// MaxToolNameBytes bounds a tool's full name (SERVER.TOOL).
	MaxToolNameBytes = 256
	// MaxToolMessagesPerRun and MaxToolBytesPerRun bound the tool
	// messages of one run (one exchange): past them the run ends as a
	// protocol violation. Refusing a message costs the server CPU that no
	// run is charged for; a run of a policy's largest call cap (100 000)
	// stays within them.
	MaxToolMessagesPerRun = 200_000
	MaxToolBytesPerRun    = 512 << 20
)

// ToolSpec describes one tool a run may call from code.
type ToolSpec struct {
	// Name is the full name, SERVER.TOOL, that the policy and the audit
	// log use too.
	Name   string `json:"name"`
	Server string `json:"server"`
	Tool   string `json:"tool"`
	// Description is the tool's description as its server gives it.
	Description string `json:"description,omitempty"`
	// InputSchema is the JSON Schema of its arguments (an object schema).
	InputSchema json.RawMessage `json:"input_schema,omitempty"`
	// OutputSchema, when the server gives one, describes its structured
	// result.
	OutputSchema json.RawMessage `json:"output_schema,omitempty"`
	// Approval is set when each run must get the user's consent before
	// its first call to this tool.
	Approval bool `json:"approval,omitempty"`
}

// ServerStatus is how one upstream server stands, for code that lists
// what is available.
type ServerStatus struct {
	Name   string `json:"name"`
	Status string `json:"status"` // ready, connecting, failed
	Error  string `json:"error,omitempty"`
	Tools  int    `json:"tools"`
}

// ToolCatalog answers OpToolCatalog.
type ToolCatalog struct {
	Op      string         `json:"op"`
	ID      string         `json:"id"`
	Tools   []ToolSpec     `json:"tools"`
	Servers []ServerStatus `json:"servers"`
	// Error says why there is no catalog (ToolFailCancelled outside a
	// run with Tools); Tools and Servers are then empty.
	Error *ToolFailure `json:"error,omitempty"`
}

// ToolCall is a call a run makes (OpToolCall).
type ToolCall struct {
	Op        string          `json:"op"`
	ID        string          `json:"id"`
	Name      string          `json:"name"` // SERVER.TOOL
	Arguments json.RawMessage `json:"arguments"`
}

// ToolReply answers one ToolCall (OpToolResult): either the call's result
// (Structured, Content) or Error.
type ToolReply struct {
	Op string `json:"op"`
	ID string `json:"id"`
	// Structured is the result's structuredContent, when it has one.
	Structured json.RawMessage `json:"structured,omitempty"`
	// Content is the result's content blocks, as MCP JSON (text, image,
	// audio, resource_link, resource).
	Content json.RawMessage `json:"content,omitempty"`
	// Error says why there is no result.
	Error *ToolFailure `json:"error,omitempty"`
}

// ToolFailure is why a tool call has no result. Kind is one of the
// ToolFail constants; the worker raises the matching Python exception.
type ToolFailure struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
	// Content is the upstream's own error content (ToolFailError).
	Content json.RawMessage `json:"content,omitempty"`
}

// Kinds of ToolFailure.
const (
	ToolFailError       = "tool_error"        // the tool ran and reported an error (isError)
	ToolFailDenied      = "denied"            // the policy does not allow the tool
	ToolFailDeclined    = "declined"          // the user did not approve it
	ToolFailRateLimited = "rate_limited"      // a policy rate limit
	ToolFailLimit       = "limit"             // a per-run cap (calls, bytes, in flight)
	ToolFailTimeout     = "timeout"           // the run's time ran out during the call
	ToolFailCancelled   = "cancelled"         // the run was cancelled, or ended
	ToolFailUnavailable = "unavailable"       // the upstream is not connected, or failed mid-call
	ToolFailArguments   = "invalid_arguments" // the arguments do not match the schema
	ToolFailUnknown     = "unknown_tool"      // no such tool
	ToolFailBadRequest  = "bad_request"       // a malformed message
)

// Tools serves a run's tool calls (Request.Tools). Its methods are
// called from goroutines of their own, concurrently.
type Tools interface {
	// Catalog lists the tools the run may call and the upstream servers.
	// It is called at most once per run: the answer is kept for the
	// run's later OpToolCatalog messages.
	Catalog(ctx context.Context) ([]ToolSpec, []ServerStatus)
	// Call makes one call. ctx ends when the run does (its timeout, its
	// cancellation, or its result). It must return promptly once ctx is
	// done. Op and ID of the reply are set by the caller.
	Call(ctx context.Context, name string, args json.RawMessage) ToolReply
}

// Ops sent by the Go side.
const (
	OpRun      = "run"      // execute code, reply with OpResult
	OpValidate = "validate" // compile only, reply with OpValidated
	OpProbe    = "probe"    // report the isolation facts seen from inside, reply with OpProbed
	OpSync     = "sync"     // write Request.Marker plus "\n" to fd 1 and fd 2, reply with OpSynced
)

// Ops sent by the worker.
const (
	OpReady     = "ready"
	OpResult    = "result"
	OpValidated = "validated"
	OpProbed    = "probed"
	OpSynced    = "synced"
	OpError     = "error" // the request could not be handled; see ErrorReply
)

// Request is a message from the Go side to the worker.
type Request struct {
	Op string `json:"op"`
	ID string `json:"id"`
	// Code is the Python source for OpRun and OpValidate.
	Code string `json:"code,omitempty"`
	// Inputs become global variables before the code runs (OpRun).
	Inputs map[string]json.RawMessage `json:"inputs,omitempty"`
	// Filename names the code in tracebacks; "<code>" when empty.
	Filename string `json:"filename,omitempty"`
	// Args follow Filename in the code's sys.argv (OpRun).
	Args []string `json:"args,omitempty"`
	// MaxReturnBytes caps the JSON size of the return value; larger values
	// are replaced by a truncated repr.
	MaxReturnBytes int `json:"max_return_bytes,omitempty"`
	// MaxFigureBytes is the PNG size a figure is scaled down to fit, by
	// rendering it at a lower dpi (OpRun); DefaultMaxFigureBytes when zero.
	// Values above MaxFigurePNGBytes act as MaxFigurePNGBytes.
	MaxFigureBytes int `json:"max_figure_bytes,omitempty"`
	// Marker is written as a line of its own to stdout and stderr (OpSync):
	// 16 to 128 characters of [A-Za-z0-9_-].
	Marker string `json:"marker,omitempty"`
	// Hidden and ReadOnly are what OpProbe checks: paths that should read
	// as empty (or not exist), and paths that should be on read-only mounts.
	Hidden   []string `json:"hidden,omitempty"`
	ReadOnly []string `json:"readonly,omitempty"`
	// ToolsOn tells the worker that the run may call tools (OpRun): its
	// "tools" module is importable. Run sets it from Tools.
	ToolsOn bool `json:"tools,omitempty"`
	// Tools serves the run's tool calls (OpRun); nil: the run has none,
	// and a call from it is refused.
	Tools Tools `json:"-"`
	// GateOn tells the worker to send the facts of the code (OpCodeFacts)
	// and wait for the answer before running it (OpRun). Run sets it from
	// Gate.
	GateOn bool `json:"gate,omitempty"`
	// Gate, when set, decides whether the run's code may run, from its
	// facts as the worker's parser derived them (codefacts.py), before
	// any of it ran: "" lets it run, anything else is why not (the run
	// then ends with an error of type PolicyRefusal, nothing of its code
	// having run). It is given Code, the code those facts are of, so
	// that it can tell them from the facts of another program than the
	// one it was asked about. The facts are hostile JSON, bounded by
	// MaxFactsBytes.
	Gate func(ctx context.Context, code string, facts json.RawMessage) string `json:"-"`
	// MaxBytes bounds the stream of an OpSnapshot; Bytes is the length
	// of the raw stream that follows an OpRestore (see Snapshot and
	// Restore, which set them).
	MaxBytes int64 `json:"max_bytes,omitempty"`
	Bytes    int64 `json:"bytes,omitempty"`
	// ToolsCtx, when set, bounds the tool calls instead of Run's ctx: a
	// session's calls end at the run's timeout, when the run is
	// interrupted, while Run still waits for its answer.
	ToolsCtx context.Context `json:"-"`
}

// Figure limits applied by the worker.
const (
	// DefaultMaxFigureBytes is the default for Request.MaxFigureBytes.
	DefaultMaxFigureBytes = 1 << 20
	// MaxFigurePNGBytes is the most PNG data sent for one figure; a larger
	// one is reported with Omitted set and no data.
	MaxFigurePNGBytes = 8 << 20
	// MaxFiguresTotalBytes bounds the PNG data of all figures of one result
	// (before base64); figures beyond it are reported with Omitted set.
	MaxFiguresTotalBytes = 16 << 20
	// MaxFigures is the most figures in one result; the rest are counted in
	// Result.FiguresOmitted.
	MaxFigures = 16
	// MinFigureDPI is the lowest resolution a figure is scaled down to.
	MinFigureDPI = 20
)

// Bounds on the other fields of a result, as the worker enforces them on
// itself (worker.py): the Go side checks them again, since user code can
// write a result of its own on the control channel.
const (
	// MaxReturnTextBytes bounds Result.ReturnText (MAX_RETURN_TEXT_BYTES).
	MaxReturnTextBytes = 64 << 10
	// MaxErrorChars bounds Exception.Message and Traceback, in characters
	// (MAX_ERROR_CHARS), plus the truncation mark.
	MaxErrorChars = 32 << 10
	// MaxErrorTypeBytes bounds Exception.Type, a qualified class name.
	MaxErrorTypeBytes = 1 << 10
	// DefaultMaxReturnBytes is Request.MaxReturnBytes when it is zero.
	DefaultMaxReturnBytes = 64 << 10
)

// Ready is the worker's first message.
type Ready struct {
	Op      string `json:"op"`
	Python  string `json:"python"`  // e.g. "3.12.1", as platform.python_version()
	Version [2]int `json:"version"` // major, minor
	PID     int    `json:"pid"`
}

// Result is the reply to OpRun.
type Result struct {
	Op string `json:"op"`
	ID string `json:"id"`
	// Status is "success" or "error" (an exception escaped the user code,
	// including SystemExit with a non-zero code).
	Status string `json:"status"`
	// ExitCode is what the one-shot worker will exit with: 0, 1 for an
	// exception, or the SystemExit code (as the OS reports it, 0-255).
	ExitCode int `json:"exit_code"`
	// ReturnValue is the JSON value of the last expression statement, or
	// null. When the value is not JSON-able it is its repr() as a JSON
	// string, and ReturnRepr is true.
	ReturnValue json.RawMessage `json:"return_value"`
	ReturnRepr  bool            `json:"return_repr,omitempty"`
	// ReturnText is a plain-text table when the return value is a pandas
	// object (DataFrame, Series): its to_string(max_rows=60, max_cols=20),
	// at most 64 KiB. ReturnValue then holds its repr.
	ReturnText string `json:"return_text,omitempty"`
	// Error describes the exception when Status is "error". The formatted
	// traceback has also been written to stderr, as Python would.
	Error *Exception `json:"error,omitempty"`
	// Figures are the matplotlib figures open when the run ended (also when
	// it failed, except with MemoryError), in figure-number order. The
	// worker closes them, so the next run starts with none. A figure that
	// could not be rendered is missing, with a note on stderr.
	Figures []Figure `json:"figures,omitempty"`
	// Displays are rich outputs, as a notebook shows them: what display()
	// was given during the run, then the last expression's value when it
	// has a rich representation (_repr_png_, _repr_html_, ...).
	Displays []Display `json:"displays,omitempty"`
	// DisplaysOmitted counts those beyond MaxDisplays or the size bound.
	DisplaysOmitted int `json:"displays_omitted,omitempty"`
	// FiguresOmitted counts the figures beyond MaxFigures, not rendered.
	FiguresOmitted int `json:"figures_omitted,omitempty"`
}

// Display is one rich output: MIME type -> data, images base64-encoded,
// always with a text/plain fallback.
type Display struct {
	Data map[string]string `json:"data"`
}

// DisplayMIMETypes are the types a display may carry, and whether their
// data is base64.
var DisplayMIMETypes = map[string]bool{
	"text/plain": false, "image/png": true, "image/jpeg": true, "image/svg+xml": false,
	"text/html": false, "text/markdown": false, "application/json": false, "text/latex": false,
}

// Bounds on displays (MAX_DISPLAYS, MAX_DISPLAYS_TOTAL_BYTES).
const (
	MaxDisplays           = 32
	MaxDisplaysTotalBytes = 4 << 20 // decoded, all types of all displays
	MaxDisplayItemBytes   = 2 << 20 // one representation, before base64
	MaxDisplayTextBytes   = 64 << 10
)

// Figure is a matplotlib figure rendered as PNG.
type Figure struct {
	// PNG is the image; empty when Omitted.
	PNG []byte `json:"png"`
	// Width and Height are the image size in pixels.
	Width  int `json:"width"`
	Height int `json:"height"`
	// DPI is the resolution the figure was rendered at: its own, or lower
	// to fit Request.MaxFigureBytes.
	DPI float64 `json:"dpi"`
	// TooLarge is set when the PNG is larger than Request.MaxFigureBytes
	// even at the lowest resolution tried: better offered as a file or link
	// than shown inline.
	TooLarge bool `json:"too_large,omitempty"`
	// Omitted is set when the PNG exceeded MaxFigurePNGBytes or the
	// result's MaxFiguresTotalBytes and was left out (TooLarge is set too).
	Omitted bool `json:"omitted,omitempty"`
}

// Exception describes an exception raised by user code.
type Exception struct {
	// Type is the exception class name, bare for builtins
	// ("ZeroDivisionError") and module-qualified otherwise, including classes
	// defined by the user code ("__main__.MyError",
	// "json.decoder.JSONDecodeError").
	Type      string `json:"type"`
	Message   string `json:"message"`
	Traceback string `json:"traceback"` // user frames only
}

// Validation is the reply to OpValidate.
type Validation struct {
	Op          string       `json:"op"`
	ID          string       `json:"id"`
	Valid       bool         `json:"valid"`
	SyntaxError *SyntaxError `json:"syntax_error,omitempty"`
}

// SyntaxError locates a compile error in the user's code.
type SyntaxError struct {
	Line    int    `json:"line"`
	Column  int    `json:"column"`
	Message string `json:"message"`
	Text    string `json:"text,omitempty"`
}

// Probe is the reply to OpProbe: facts the worker measures about its own
// process from inside the sandbox.
type Probe struct {
	Op            string              `json:"op"`
	ID            string              `json:"id"`
	UID           int                 `json:"uid"`
	GID           int                 `json:"gid"`
	Status        map[string]string   `json:"status"`     // selected /proc/self/status fields: CapEff, CapPrm, CapBnd, CapInh, CapAmb, NoNewPrivs, Seccomp
	Namespaces    map[string]string   `json:"namespaces"` // readlink /proc/self/ns/* (e.g. "net:[4026531840]")
	Interfaces    []string            `json:"interfaces"` // names from /proc/net/dev
	Rlimits       map[string][2]int64 `json:"rlimits"`    // "NOFILE", "NPROC", "FSIZE", "CORE", "AS", "CPU", "STACK": soft, hard (-1 = unlimited)
	Hostname      string              `json:"hostname"`
	Cwd           string              `json:"cwd"`
	ProcessesSeen int                 `json:"processes_seen"` // numeric entries in /proc
	RootWritable  bool                `json:"root_writable"`
	TmpWritable   bool                `json:"tmp_writable"`
	// UIDMap is /proc/self/uid_map: inside id, id in the parent
	// namespace, count.
	UIDMap string `json:"uid_map"`
	// Exposed are the Hidden paths that show something, and the ReadOnly
	// ones that are writable.
	Exposed []string `json:"exposed"`
	// Inotify is "denied" when inotify_init1 fails with EPERM, "allowed"
	// when it works, or the error it failed with.
	Inotify string `json:"inotify"`
	// UsrLocal lists what /usr/local holds ("lib" when only the Python
	// directories are shown).
	UsrLocal []string `json:"usr_local"`
	// Landlock is the Landlock ABI version the kernel offers (0: none) and
	// whether this process is restricted by a Landlock domain.
	LandlockABI int `json:"landlock_abi"`
}

// Synced is the reply to OpSync, sent once the marker has been written to
// both fd 1 and fd 2.
type Synced struct {
	Op string `json:"op"`
	ID string `json:"id"`
}

// ErrorReply is the worker's answer to a request it could not handle (an
// unknown op, a malformed request). It is returned as an error by Conn.
type ErrorReply struct {
	Op      string `json:"op"`
	ID      string `json:"id"`
	Message string `json:"message"`
}

func (e *ErrorReply) Error() string {
	// The message comes from inside the sandbox: keep it short and quoted.
	m := e.Message
	if len(m) > 200 {
		m = m[:200] + "..."
	}
	return fmt.Sprintf("worker: request failed: %q", m)
}
