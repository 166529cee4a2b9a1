package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/pysandbox/pysandbox/internal/pep"
	"github.com/pysandbox/pysandbox/internal/worker"
)

// RunRequest is one piece of code to run.
type RunRequest struct {
	Code string
	// Inputs become global variables; keys must be Python identifiers.
	Inputs   map[string]json.RawMessage
	Timeout  time.Duration // 0: the default
	Filename string        // shown in tracebacks; "<code>" when empty
	// Args follow Filename in the code's sys.argv, as a script's
	// arguments do (pysandbox run FILE ARG...).
	Args []string
	// Stdout and Stderr, when set, also receive the output live, uncapped.
	Stdout, Stderr io.Writer
	// Dependencies are PEP 508 requirements, merged with the code's PEP 723
	// block; PythonVersion selects an interpreter ("3.12").
	Dependencies  []string
	PythonVersion string
	// Progress, when set, receives installer progress lines.
	Progress func(string)
	// Caller names whom the run is for (an identity): the records of what
	// the server downloads for it (an interpreter) carry it.
	Caller string
	// Network serves the run's proxy listener; nil: the run has no
	// network. A session's is given when it is created.
	Network NetAttach
	// Tools serves the calls the code makes to upstream tools (its
	// "tools" module); nil: the run has none.
	Tools worker.Tools
	// Gate, when set, decides from the facts of the code (derived by
	// Python's parser in the run's own sandbox, before any of it runs)
	// whether it may run; see worker.Request.Gate. A refused run ends
	// with an error of type PolicyRefusal.
	Gate func(ctx context.Context, code string, facts json.RawMessage) string
}

// The bounds of a request.
const (
	// MaxCodeBytes caps the code of one run. Real scripts are far smaller;
	// the cap keeps a hostile client from making the server hold huge
	// requests.
	MaxCodeBytes = 1 << 20
	// MaxInputBytes caps the inputs of one run, as JSON, together.
	MaxInputBytes = MaxCodeBytes * 8
	// maxInputDepth bounds the nesting of an input value: Python's JSON
	// decoder recurses once per level and would fail on a few hundred.
	maxInputDepth = 200
)

// Validate refuses a request that cannot be run as it is, before any
// sandbox starts, with a *RequestError saying what to change. It is the
// server's one check of a request (the worker checks again what reaches
// it, inside the sandbox); Run and Sessions.Run make it.
func (r *RunRequest) Validate() error {
	if err := CheckDependencies(r.Dependencies); err != nil {
		return err
	}
	if err := CheckCode(r.Code); err != nil {
		return err
	}
	total := 0
	for k, v := range r.Inputs {
		if !IsIdentifier(k) {
			return &RequestError{Msg: fmt.Sprintf("inputs key %q is not a valid Python variable name; use letters, digits and underscores, not starting with a digit, and not a keyword", k)}
		}
		total += len(v)
		if jsonDepth(v) > maxInputDepth {
			return &RequestError{Msg: fmt.Sprintf("inputs[%q] is nested more than %d levels deep; flatten it", k, maxInputDepth)}
		}
	}
	if total > MaxInputBytes {
		return &RequestError{Msg: fmt.Sprintf("inputs are too large (%d bytes; the limit is %d). Pass less data", total, MaxInputBytes)}
	}
	return checkArgs(r.Args)
}

// The bounds of a run's arguments: one as long as the kernel allows
// (MAX_ARG_STRLEN), all together as much as a run's code.
const (
	maxArgs     = 1024
	maxArg      = 128 << 10
	maxArgBytes = MaxCodeBytes
)

// checkArgs refuses arguments no command line could carry, and bytes that
// are not text (the request carries them as JSON strings, which would
// replace them).
func checkArgs(args []string) error {
	total := 0
	for i, a := range args {
		switch {
		case strings.ContainsRune(a, 0):
			return &RequestError{Msg: fmt.Sprintf("argument %d contains a NUL byte, which no command-line argument can", i+1)}
		case !utf8.ValidString(a):
			return &RequestError{Msg: fmt.Sprintf("argument %d is not valid UTF-8; pass such bytes through a file or stdin", i+1)}
		case len(a) > maxArg:
			return &RequestError{Msg: fmt.Sprintf("argument %d is %d bytes, over the %d an argument may be; pass data through a file or stdin instead", i+1, len(a), maxArg)}
		}
		total += len(a)
	}
	if len(args) > maxArgs || total > maxArgBytes {
		return &RequestError{Msg: fmt.Sprintf("too many arguments (%d, %d bytes; the limit is %d arguments, %d bytes in all): pass data through a file or stdin instead", len(args), total, maxArgs, maxArgBytes)}
	}
	return nil
}

// CheckDependencies refuses more requirements than a run may ask for.
func CheckDependencies(reqs []string) error {
	if len(reqs) > pep.MaxDependencies {
		return &RequestError{Msg: fmt.Sprintf("too many dependencies (%d; the limit is %d)", len(reqs), pep.MaxDependencies)}
	}
	return nil
}

// CheckCode refuses code that cannot be valid before any sandbox starts.
func CheckCode(code string) error {
	var msg string
	switch {
	case strings.TrimSpace(code) == "":
		msg = "code is required: pass the Python source to run"
	case len(code) > MaxCodeBytes:
		msg = fmt.Sprintf("code is too large (%d bytes; the limit is %d). Send a smaller script, or pass data via inputs", len(code), MaxCodeBytes)
	case strings.ContainsRune(code, 0):
		msg = "code contains a NUL byte, which Python source cannot contain. Remove it (use \"\\x00\" in a string literal if you need the character)"
	default:
		return nil
	}
	return &RequestError{Msg: msg}
}

// jsonDepth is the deepest nesting of arrays and objects in JSON text.
func jsonDepth(b []byte) int {
	depth, deepest, inString, escaped := 0, 0, false, false
	for _, c := range b {
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '[' || c == '{':
			depth++
			deepest = max(deepest, depth)
		case c == ']' || c == '}':
			depth--
		}
	}
	return deepest
}

// IsIdentifier reports whether s can be a Python global variable name.
func IsIdentifier(s string) bool {
	if s == "" || len(s) > 255 {
		return false
	}
	for i, r := range s {
		ok := r == '_' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (i > 0 && r >= '0' && r <= '9')
		if !ok {
			return false
		}
	}
	return !pythonKeywords[s]
}

var pythonKeywords = map[string]bool{
	"False": true, "None": true, "True": true, "and": true, "as": true, "assert": true, "async": true,
	"await": true, "break": true, "class": true, "continue": true, "def": true, "del": true, "elif": true,
	"else": true, "except": true, "finally": true, "for": true, "from": true, "global": true, "if": true,
	"import": true, "in": true, "is": true, "lambda": true, "nonlocal": true, "not": true, "or": true,
	"pass": true, "raise": true, "return": true, "try": true, "while": true, "with": true, "yield": true,
}
