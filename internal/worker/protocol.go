// Package worker holds the Python worker program that runs inside every
// sandbox, and the Go side of the small protocol used to drive it.
//
// The worker is started as `python3 -I -B worker.py` (embedded in the binary
// and placed read-only inside the sandbox). File descriptor 3 is a Unix
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
// User code runs inside the worker process, so it can reach the control
// socket too: the sandbox, not the worker, is the security boundary, and
// everything the worker sends is untrusted input to the Go side.
package worker

import (
	"encoding/json"
	"fmt"
)

// Ops sent by the Go side.
const (
	OpRun      = "run"      // execute code, reply with OpResult
	OpValidate = "validate" // compile only, reply with OpValidated
	OpProbe    = "probe"    // report the isolation facts seen from inside, reply with OpProbed
)

// Ops sent by the worker.
const (
	OpReady     = "ready"
	OpResult    = "result"
	OpValidated = "validated"
	OpProbed    = "probed"
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
	// MaxReturnBytes caps the JSON size of the return value; larger values
	// are replaced by a truncated repr.
	MaxReturnBytes int `json:"max_return_bytes,omitempty"`
}

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
	// Error describes the exception when Status is "error". The formatted
	// traceback has also been written to stderr, as Python would.
	Error *Exception `json:"error,omitempty"`
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
