// Package codefacts derives facts about a program from Python's own parser,
// without running it, so that a policy can approve, refuse or ask a human
// about a code-running call by what its code says: which modules it
// imports, whether it starts processes, touches files, opens connections or
// builds code at run time, which URLs it names, which dependencies its
// PEP 723 block asks for.
//
// This is a tripwire, not a boundary. Code can hide what it does: it can
// read more code from a file, an input or the network at run time, build
// names the parser never sees, or call through objects the analysis cannot
// follow, and none of that shows here (though the usual ways of doing so,
// exec, eval, getattr with a computed name, __import__, dunder attribute
// chains and the like, are themselves facts, in dynamic_code). The facts are
// for asking a human, or refusing the obvious cases; what code can do is
// bounded by the sandbox, which is the boundary, whatever the facts said.
//
// The analysis runs inside the sandbox, as any code does: the analyzer
// (the worker's codefacts.py) is the run's code and the program is a run input,
// never part of the analyzer's code. It parses the program with ast.parse
// (never compile or exec), on the interpreter the program would run on, in
// a forked child (before 3.11 the parser can crash on a deep tree, which is
// then a fact, "unanalysable"), walks the tree in loops (never recursing
// with its depth), and prints one JSON line. Everything it prints is
// treated as hostile: only the last line of stdout is read, with a size
// bound, every list is validated and re-capped, and Bytes, Lines and
// Dependencies are computed here in Go, never taken from the sandbox. A run
// that fails, times out or prints anything else is an error, on which the
// caller fails closed. An analysis is one sandboxed run, and takes a run
// slot of the engine like any other.
package codefacts

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/pep"
	"github.com/pysandbox/pysandbox/internal/worker"
)

// analyzer is the code of the analysis run (the worker's codefacts.py,
// which the worker also loads to gate a run on its own code's facts).
var analyzer = string(worker.CodeFactsSource)

// Limits on what Derive takes and returns.
const (
	// MaxCodeBytes is the largest program Derive looks at (the tools cap a
	// call's code at the same size).
	MaxCodeBytes = 1 << 20
	// MaxEntries bounds each list but URLs; MaxNameRunes each name in it.
	MaxEntries   = 200
	MaxNameRunes = 200
	// MaxURLs bounds the URLs; MaxURLRunes each URL.
	MaxURLs     = 100
	MaxURLRunes = 2000
	// maxSyntaxError bounds the syntax error's text.
	maxSyntaxError = 1000
	// maxLine bounds the analyzer's line (it keeps within 250 KiB).
	maxLine = 256 << 10
	// Timeout bounds one analysis run (the engine's MaxTimeout caps it).
	// A 1 MiB program takes a few seconds to parse and walk.
	Timeout = 30 * time.Second
	// InputName is the run input that carries the program.
	InputName = "codefacts_source"
)

// Facts are what Python's parser says about a program, without running it.
//
// Every list is sorted and unique. Names are dotted names as the code
// refers to them after import aliasing: `import subprocess as sp;
// sp.run(...)` gives "subprocess.run", `from os import system; system(...)`
// gives "os.system", `p = Path("x"); p.write_text(...)` gives
// "pathlib.Path.write_text", and `x = os.system` makes x mean os.system.
// A list that would be longer than its cap keeps the names the analyzer's
// tables know and the shortest, names itself in Truncated, and puts
// "unanalysable: too many LIST" in DynamicCode.
type Facts struct {
	// Bytes and Lines are the program's size (lines as Python counts
	// them: "\r\n", "\r" and "\n" each end one; a last line without an
	// end counts).
	Bytes int `json:"bytes"`
	Lines int `json:"lines"`
	// Imports are the modules imported: `import x.y` gives "x.y" and "x",
	// `from a.b import c` gives "a.b" and "a", relative imports are as
	// written (".mod", "..pkg.mod", "." for `from . import x`), and
	// importlib.import_module("x") / __import__("x") with a string literal
	// count as imports of x.
	Imports []string `json:"imports"`
	// ProcessCalls are references to what starts processes: subprocess.*,
	// os.system, os.popen, os.exec*, os.spawn*, os.fork, os.forkpty,
	// os.posix_spawn*, pty.spawn, pty.fork, multiprocessing.*,
	// concurrent.futures.ProcessPoolExecutor, asyncio.create_subprocess_*,
	// webbrowser.*, pexpect.*, sh.*, plumbum.*; and "*.system",
	// "*.popen", "*.Popen", "*.check_output", "*.execv", "*.fork", ...
	// for such a method on an object the analysis cannot name
	// (sys.modules["os"].system, a parameter's .popen).
	ProcessCalls []string `json:"process_calls"`
	// FileCalls are references to what reads or changes files: open,
	// io.open, os.open, os.remove/unlink/rename/replace/rmdir/mkdir/
	// makedirs/chmod/chown/link/symlink/truncate/listdir/scandir/walk/...,
	// shutil.*, tempfile.*, glob.*, tarfile.*, zipfile.*, gzip/bz2/lzma/
	// codecs.open, sqlite3.connect, mmap.*, and pathlib.X.<method> for
	// open, read_text/bytes, write_text/bytes, unlink, rmdir, mkdir,
	// touch, rename, replace, symlink_to, chmod, iterdir, glob, ...;
	// "*.write_text" (and read_text, read_bytes, write_bytes, touch,
	// symlink_to, hardlink_to, iterdir, rglob) for such a path method on
	// an object the analysis cannot name.
	FileCalls []string `json:"file_calls"`
	// NetworkCalls are references to what opens connections: socket.*,
	// ssl.*, urllib.request.*, http.client.*, http.server.*,
	// socketserver.*, requests.*, httpx.*, aiohttp.*, urllib3.*,
	// ftplib.*, smtplib.*, poplib.*, imaplib.*, telnetlib.*, xmlrpc.*,
	// asyncio.open_connection, asyncio.start_server, websocket(s).*,
	// paramiko.*, pycurl.*, grpc.*, boto3.*; "*.urlopen",
	// "*.create_connection" and the like on an object it cannot name.
	NetworkCalls []string `json:"network_calls"`
	// DynamicCode is how the code may do what the parser cannot see:
	//   - eval, exec, compile, __import__ (referenced, called or
	//     not; a name that is one of these builtins counts even when an
	//     import or assignment also binds it, since that binding may never
	//     run: `from re import compile; compile(...)` lists "compile"),
	//     with "exec(non-literal)" when the code is not a string
	//     literal and "exec(decoded)" when it comes through base64, codecs,
	//     binascii, zlib, .decode() and the like;
	//   - importlib.*, imp.*, runpy.*, code.*, marshal.load(s),
	//     pickle.load(s), dill, shelve, yaml.load, types.FunctionType,
	//     types.CodeType, ctypes.* and "import ctypes", cffi, sys.modules,
	//     sys._getframe, inspect.currentframe/stack, gc.get_objects/
	//     get_referents/get_referrers, timeit.*, operator.attrgetter, ...;
	//   - "importlib.import_module(non-literal)", "__import__(non-literal)";
	//   - "getattr(non-literal)" (and setattr, delattr, hasattr) for a
	//     computed name, or getattr itself passed as a value; a dunder
	//     name such as "getattr(__globals__)"; "setattr(module)";
	//   - "globals()[...]", "vars()[...]", "locals()[...]", "globals().get"
	//     and the like, "vars(module)";
	//   - "__builtins__", "__loader__", "__spec__" as names, and
	//     "builtins.X=" for an assignment to a builtin, "sys.meta_path="
	//     and the like for one to the import system (sys.modules,
	//     sys.path_hooks, importlib.*);
	//   - ".__globals__", ".__subclasses__", ".__bases__", ".__code__",
	//     ".__dict__" (but on self and cls), ... : any dunder attribute
	//     beyond the everyday ones (__name__, __class__, __init__, ...), and
	//     the frame and code attributes (".f_globals", ".f_back",
	//     ".tb_frame", ".co_code", ...);
	//   - "'__globals__'" and the like: a string literal naming one;
	//   - "type(name, bases, dict)", "type(...)(...)";
	//   - "unanalysable": the parser gave up (nesting too deep, or it
	//     crashed), and "unanalysable: too many LIST" when a list was cut.
	DynamicCode []string `json:"dynamic_code"`
	// URLs are the http(s), ftp(s) and ws(s) URLs in string and bytes
	// literals, and in f-strings with each replacement field as {name} or
	// {...} ("https://{host}/api"), trailing punctuation dropped; at most
	// MaxURLs, each at most MaxURLRunes.
	URLs []string `json:"urls"`
	// Dependencies are the requirements of the PEP 723 "# /// script"
	// block, as written (none when the block is invalid).
	Dependencies []string `json:"dependencies"`
	// SyntaxError, when the program does not parse, is the parser's
	// message and line; the lists are then empty but for what can be said
	// without a tree (Dependencies, and "unanalysable" in DynamicCode when
	// the parser gave up on nesting rather than on a mistake).
	SyntaxError string `json:"syntax_error,omitempty"`
	// Truncated names the lists that were cut to their caps.
	Truncated []string `json:"truncated,omitempty"`
}

// Runner runs code in a sandbox; *engine.Engine is one.
type Runner interface {
	Run(ctx context.Context, req engine.RunRequest) (*engine.Result, error)
}

// Derive derives the facts of code by running the analyzer in a sandbox
// on r, with the interpreter pythonVersion selects ("" for the default, or
// the one the code's requires-python picks, as a run of it would get). An
// error means no facts: the caller must fail closed.
func Derive(ctx context.Context, r Runner, code, pythonVersion string) (*Facts, error) {
	if len(code) > MaxCodeBytes {
		return nil, fmt.Errorf("codefacts: the code is %d bytes, more than the %d this analysis takes", len(code), MaxCodeBytes)
	}
	src, err := json.Marshal(code)
	if err != nil {
		return nil, fmt.Errorf("codefacts: %w", err)
	}
	meta, metaErr := pep.ParseScriptMetadata(code)
	prog := analyzer
	if pythonVersion == "" && metaErr == nil && meta != nil && meta.RequiresPython != "" {
		// The interpreter a run of the code gets, chosen the same way:
		// by a block of the analyzer's own, whose only value is the
		// code's specifier set as this package writes it.
		if spec, err := pep.ParseSpecifierSet(meta.RequiresPython); err == nil {
			if s := spec.String(); specifierText.MatchString(s) {
				prog = "# /// script\n# requires-python = \"" + s + "\"\n# ///\n" + analyzer
			}
		}
	}
	res, err := r.Run(ctx, engine.RunRequest{
		Code:          prog,
		Inputs:        map[string]json.RawMessage{InputName: src},
		PythonVersion: pythonVersion,
		Timeout:       Timeout,
		Filename:      "<codefacts>",
	})
	if err != nil {
		return nil, fmt.Errorf("codefacts: the analysis could not run: %w", err)
	}
	if res == nil {
		return nil, errors.New("codefacts: the analysis returned nothing")
	}
	if res.Status != engine.StatusSuccess {
		msg := res.Message
		if res.Error != nil {
			msg = strings.TrimSpace(msg + " " + res.Error.Type + ": " + res.Error.Message)
		}
		return nil, fmt.Errorf("codefacts: the analysis ended with %s: %s", res.Status, clean(msg, 300))
	}
	if res.StdoutTruncated {
		return nil, errors.New("codefacts: the analysis printed too much")
	}
	return FromLine(res.Stdout, code)
}

// FromLine is the facts of code from the analyzer's output, as a run of
// it printed it or as the worker sent it before running code of its own
// (worker.Request.Gate): hostile, validated and re-capped; what Go can
// tell itself (size, lines, PEP 723 dependencies) is recomputed here.
func FromLine(out, code string) (*Facts, error) {
	f, err := parseLine(out)
	if err != nil {
		return nil, err
	}
	f.Bytes = len(code)
	f.Lines = countLines(code)
	f.Dependencies = []string{}
	if meta, err := pep.ParseScriptMetadata(code); err == nil && meta != nil {
		f.Dependencies = sortUnique(slices.Clone(meta.Dependencies))
		f.capList("dependencies", &f.Dependencies, MaxEntries)
	}
	return f, nil
}

// specifierText is what a specifier set written by pep may hold.
var specifierText = regexp.MustCompile(`^[0-9A-Za-z.*+!<>=~, ]{1,512}$`)

// wire is the analyzer's line.
type wire struct {
	V            int      `json:"v"`
	Imports      []string `json:"imports"`
	ProcessCalls []string `json:"process_calls"`
	FileCalls    []string `json:"file_calls"`
	NetworkCalls []string `json:"network_calls"`
	DynamicCode  []string `json:"dynamic_code"`
	URLs         []string `json:"urls"`
	Truncated    []string `json:"truncated"`
	SyntaxError  string   `json:"syntax_error"`
}

// lists are the lists a Facts has, by their JSON names.
var lists = []string{"imports", "process_calls", "file_calls", "network_calls", "dynamic_code", "urls", "dependencies"}

// parseLine reads the facts from the analyzer's output: its last line
// only, which must be one JSON object of exactly the expected shape.
func parseLine(stdout string) (*Facts, error) {
	out := strings.TrimSuffix(stdout, "\n")
	line := out[strings.LastIndexByte(out, '\n')+1:]
	if line == "" {
		return nil, errors.New("codefacts: the analysis printed nothing")
	}
	if len(line) > maxLine {
		return nil, fmt.Errorf("codefacts: the analysis printed a line of %d bytes, more than %d", len(line), maxLine)
	}
	dec := json.NewDecoder(strings.NewReader(line))
	dec.DisallowUnknownFields()
	var w wire
	if err := dec.Decode(&w); err != nil {
		return nil, fmt.Errorf("codefacts: the analysis printed junk: %v", clean(err.Error(), 200))
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("codefacts: the analysis printed junk after its facts")
	}
	if w.V != 1 {
		return nil, fmt.Errorf("codefacts: the analysis speaks version %d, not 1", w.V)
	}
	f := &Facts{}
	for _, l := range []struct {
		name  string
		in    []string
		out   *[]string
		max   int
		runes int
	}{
		{"imports", w.Imports, &f.Imports, MaxEntries, MaxNameRunes},
		{"process_calls", w.ProcessCalls, &f.ProcessCalls, MaxEntries, MaxNameRunes},
		{"file_calls", w.FileCalls, &f.FileCalls, MaxEntries, MaxNameRunes},
		{"network_calls", w.NetworkCalls, &f.NetworkCalls, MaxEntries, MaxNameRunes},
		{"dynamic_code", w.DynamicCode, &f.DynamicCode, MaxEntries, MaxNameRunes},
		{"urls", w.URLs, &f.URLs, MaxURLs, MaxURLRunes},
	} {
		if len(l.in) > 4*MaxEntries {
			return nil, fmt.Errorf("codefacts: the analysis sent %d %s", len(l.in), l.name)
		}
		for _, s := range l.in {
			if err := checkString(s, l.runes); err != nil {
				return nil, fmt.Errorf("codefacts: the analysis sent a bad entry in %s: %v", l.name, err)
			}
		}
		*l.out = sortUnique(slices.Clone(l.in))
	}
	for _, t := range w.Truncated {
		if !slices.Contains(lists, t) {
			return nil, fmt.Errorf("codefacts: the analysis sent an unknown list %q as truncated", clean(t, 40))
		}
		f.markTruncated(t)
	}
	for _, l := range []struct {
		name string
		p    *[]string
		max  int
	}{
		{"imports", &f.Imports, MaxEntries},
		{"process_calls", &f.ProcessCalls, MaxEntries},
		{"file_calls", &f.FileCalls, MaxEntries},
		{"network_calls", &f.NetworkCalls, MaxEntries},
		{"urls", &f.URLs, MaxURLs},
		{"dynamic_code", &f.DynamicCode, MaxEntries},
	} {
		f.capList(l.name, l.p, l.max)
	}
	if !utf8.ValidString(w.SyntaxError) {
		return nil, errors.New("codefacts: the analysis sent a syntax error that is not UTF-8")
	}
	f.SyntaxError = clean(w.SyntaxError, maxSyntaxError)
	return f, nil
}

// checkString refuses what no analyzer output holds: text that is not
// UTF-8, empty, too long, or with control characters.
func checkString(s string, maxRunes int) error {
	if s == "" {
		return errors.New("an empty string")
	}
	if !utf8.ValidString(s) {
		return errors.New("not UTF-8")
	}
	if n := utf8.RuneCountInString(s); n > maxRunes {
		return fmt.Errorf("%d characters, more than %d", n, maxRunes)
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return fmt.Errorf("the control character %U", r)
		}
	}
	return nil
}

// capList cuts *p to max entries, noting it (in Truncated, and in
// DynamicCode, so that a rule on dynamic_code sees it).
func (f *Facts) capList(name string, p *[]string, max int) {
	if len(*p) <= max {
		return
	}
	*p = (*p)[:max]
	f.markTruncated(name)
	marker := "unanalysable: too many " + name
	if name == "dynamic_code" {
		if !slices.Contains(f.DynamicCode, marker) {
			f.DynamicCode[max-1] = marker
			f.DynamicCode = sortUnique(f.DynamicCode)
		}
		return
	}
	if !slices.Contains(f.DynamicCode, marker) {
		f.DynamicCode = sortUnique(append(f.DynamicCode, marker))
		if len(f.DynamicCode) > MaxEntries {
			f.capList("dynamic_code", &f.DynamicCode, MaxEntries)
		}
	}
}

func (f *Facts) markTruncated(name string) {
	if !slices.Contains(f.Truncated, name) {
		f.Truncated = append(f.Truncated, name)
		slices.Sort(f.Truncated)
	}
}

// sortUnique sorts s and drops repeats; nil becomes empty.
func sortUnique(s []string) []string {
	if s == nil {
		return []string{}
	}
	slices.Sort(s)
	return slices.Compact(s)
}

// countLines counts lines as Python reads source.
func countLines(code string) int {
	n := 0
	for i := 0; i < len(code); i++ {
		switch code[i] {
		case '\n':
			n++
		case '\r':
			n++
			if i+1 < len(code) && code[i+1] == '\n' {
				i++
			}
		}
	}
	if code != "" && code[len(code)-1] != '\n' && code[len(code)-1] != '\r' {
		n++
	}
	return n
}

// Value gives the facts as JSON values, for a condition evaluator to
// address as code.imports, code.bytes, ...: each list as []any of strings,
// or nil when it is empty (so that the "exists" of a condition means "not
// empty"); bytes and lines as json.Number (as the evaluator decodes call
// arguments); syntax_error as a string, or nil when the code parses;
// truncated as a list like the others.
func (f *Facts) Value() map[string]any {
	list := func(s []string) any {
		if len(s) == 0 {
			return nil
		}
		out := make([]any, len(s))
		for i, x := range s {
			out[i] = x
		}
		return out
	}
	var syntax any
	if f.SyntaxError != "" {
		syntax = f.SyntaxError
	}
	return map[string]any{
		"bytes":         json.Number(strconv.Itoa(f.Bytes)),
		"lines":         json.Number(strconv.Itoa(f.Lines)),
		"imports":       list(f.Imports),
		"process_calls": list(f.ProcessCalls),
		"file_calls":    list(f.FileCalls),
		"network_calls": list(f.NetworkCalls),
		"dynamic_code":  list(f.DynamicCode),
		"urls":          list(f.URLs),
		"dependencies":  list(f.Dependencies),
		"syntax_error":  syntax,
		"truncated":     list(f.Truncated),
	}
}

// summaryItems is how many entries of a list Summary names.
const (
	summaryItems = 6
	summaryMax   = 600 // characters
)

// Summary is the facts in one short line for approval prompts and audit
// records, e.g. "imports: os, subprocess; process calls: subprocess.run;
// dynamic code: exec; 12 lines". Each list names its first few entries
// and how many more there are; characters that could disguise text
// (controls, bidirectional and other format characters) are escaped.
func (f *Facts) Summary() string {
	var parts []string
	if f.SyntaxError != "" {
		parts = append(parts, "syntax error: "+f.SyntaxError)
	}
	for _, l := range []struct {
		label string
		s     []string
	}{
		{"imports", f.Imports},
		{"process calls", f.ProcessCalls},
		{"file calls", f.FileCalls},
		{"network calls", f.NetworkCalls},
		{"dynamic code", f.DynamicCode},
		{"urls", f.URLs},
		{"dependencies", f.Dependencies},
	} {
		if len(l.s) == 0 {
			continue
		}
		names := l.s[:min(len(l.s), summaryItems)]
		p := l.label + ": " + strings.Join(names, ", ")
		if n := len(l.s) - len(names); n > 0 {
			p += fmt.Sprintf(" (+%d more)", n)
		}
		parts = append(parts, p)
	}
	if len(parts) == 0 || (len(parts) == 1 && f.SyntaxError != "") {
		parts = append(parts, "no imports, calls or URLs of note")
	}
	lines := "lines"
	if f.Lines == 1 {
		lines = "line"
	}
	parts = append(parts, fmt.Sprintf("%d %s", f.Lines, lines))
	return clean(strings.Join(parts, "; "), summaryMax)
}

// clean escapes what could disguise text (controls, format characters
// such as bidirectional overrides, invalid UTF-8) and cuts s to max
// characters.
func clean(s string, max int) string {
	var b strings.Builder
	n := 0
	for _, r := range strings.ToValidUTF8(s, "\uFFFD") {
		if n >= max {
			b.WriteString("…")
			break
		}
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || !unicode.IsPrint(r) && r != ' ' {
			fmt.Fprintf(&b, "\\u%04x", r)
		} else {
			b.WriteRune(r)
		}
		n++
	}
	return b.String()
}
