package worker

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/testutil"
)

// The server side of tool calls is a Go fake of the Tools interface: the
// boundary under test is the control channel and the Python module, with
// real workers.

// fakeTools serves a fixed catalog. Tools answer by name (see call).
type fakeTools struct {
	specs   []ToolSpec
	servers []ServerStatus

	mu        sync.Mutex
	calls     []fakeCall
	inFlight  int
	maxFlight int
	catalogs  int
	cancelled int // calls that ended because their ctx was done
	// arrived is signalled (without blocking) each time a call arrives.
	arrived chan string
	// release ends the calls of "everything.block" (when closed or sent
	// to), as does their ctx.
	release chan struct{}
}

type fakeCall struct {
	name string
	args map[string]any
}

func newFakeTools() *fakeTools {
	f := &fakeTools{arrived: make(chan string, 1024), release: make(chan struct{})}
	add := func(server, tool, desc, input, output string) {
		sp := ToolSpec{Name: server + "." + tool, Server: server, Tool: tool, Description: desc, InputSchema: json.RawMessage(input)}
		if output != "" {
			sp.OutputSchema = json.RawMessage(output)
		}
		f.specs = append(f.specs, sp)
	}
	add("everything", "echo", "Echoes back the input.", `{"type":"object","properties":{"message":{"type":"string","description":"Message to echo"}},"required":["message"],"additionalProperties":false}`, "")
	add("everything", "get-sum", "Returns the sum of two numbers.", `{"type":"object","properties":{"a":{"type":"number","description":"First number"},"b":{"type":"number","description":"Second number"}},"required":["a","b"],"additionalProperties":false}`,
		`{"type":"object","properties":{"sum":{"type":"number"}}}`)
	add("everything", "get-tiny-image", "Returns a tiny image.", `{"type":"object","properties":{}}`, "")
	add("everything", "nothing", "Returns no content.", `{"type":"object","properties":{}}`, "")
	add("everything", "structured", "The weather.", `{"type":"object","properties":{"location":{"type":"string","default":"Paris"}}}`,
		`{"type":"object","properties":{"temperature":{"type":"number"},"conditions":{"type":"string"}}}`)
	add("everything", "fail", "Fails as asked.", `{"type":"object","properties":{"kind":{"type":"string"}},"required":["kind"]}`, "")
	add("everything", "block", "Waits until released or cancelled.", `{"type":"object","properties":{"n":{"type":"integer"}}}`, "")
	add("everything", "barrier", "Waits until n calls are in flight.", `{"type":"object","properties":{"n":{"type":"integer"},"i":{"type":"integer"}},"required":["n"]}`, "")
	add("everything", "wait-block", "Waits until n calls of block are in flight.", `{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}`, "")
	add("everything", "open", "Takes any arguments.", `{"type":"object"}`, "")
	add("everything", "big", "Returns n bytes of text.", `{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}`, "")
	add("everything", "args", "Takes many kinds of arguments.\nSecond line.", `{
		"type": "object",
		"properties": {
			"count": {"type": "integer", "minimum": 1, "maximum": 10, "description": "How many"},
			"mode": {"enum": ["fast", "slow"]},
			"tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
			"max-results": {"type": "integer", "default": 5, "description": "At most this many\n  results"},
			"filter": {"type": "object", "properties": {"field": {"type": "string"}}, "required": ["field"], "additionalProperties": false},
			"when": {"type": ["string", "null"]},
			"id": {"type": "string", "pattern": "^[a-z]+$"},
			"choice": {"anyOf": [
				{"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
				{"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]}]},
			"ref": {"$ref": "#/$defs/N"},
			"ratio": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
			"class": {"type": "boolean"}
		},
		"required": ["count"],
		"additionalProperties": false,
		"$defs": {"N": {"type": "object", "properties": {"n": {"type": "integer"}}}}
	}`, "")
	add("my-server", "class", "A keyword.", `{"type":"object","properties":{"x":{"type":"integer"}}}`, "")
	add("my-server", "get-item", "Dashed.", `{"type":"object","properties":{}}`, "")
	add("my-server", "get_item", "Underscored.", `{"type":"object","properties":{}}`, "")
	add("1st", "x", "Leading digit.", `{"type":"object","properties":{}}`, "")
	f.servers = []ServerStatus{{Name: "everything", Status: "ready", Tools: 12}, {Name: "my-server", Status: "ready", Tools: 3},
		{Name: "1st", Status: "ready", Tools: 1}, {Name: "broken", Status: "failed", Error: "exited with status 1"}}
	return f
}

func (f *fakeTools) Catalog(ctx context.Context) ([]ToolSpec, []ServerStatus) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.catalogs++
	return f.specs, f.servers
}

func (f *fakeTools) Call(ctx context.Context, name string, raw json.RawMessage) ToolReply {
	var args map[string]any
	if err := json.Unmarshal(raw, &args); err != nil {
		return ToolReply{Error: &ToolFailure{Kind: ToolFailArguments, Message: err.Error()}}
	}
	f.mu.Lock()
	f.calls = append(f.calls, fakeCall{name, args})
	f.inFlight++
	f.maxFlight = max(f.maxFlight, f.inFlight)
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.inFlight--
		f.mu.Unlock()
	}()
	select {
	case f.arrived <- name:
	default:
	}
	known := name == "everything.get-env" // hidden from the catalog by the policy
	for _, sp := range f.specs {
		known = known || sp.Name == name
	}
	if !known {
		return ToolReply{Error: &ToolFailure{Kind: ToolFailUnknown, Message: name + ": no such tool"}}
	}
	return f.call(ctx, name, args)
}

// hangGuard bounds the waits of the fake: far beyond anything expected.
const hangGuard = 60 * time.Second

func (f *fakeTools) call(ctx context.Context, name string, args map[string]any) ToolReply {
	text := func(s ...string) ToolReply {
		var blocks []map[string]string
		for _, t := range s {
			blocks = append(blocks, map[string]string{"type": "text", "text": t})
		}
		b, _ := json.Marshal(blocks)
		return ToolReply{Content: b}
	}
	structured := func(v any) ToolReply {
		b, _ := json.Marshal(v)
		return ToolReply{Structured: b, Content: json.RawMessage(`[{"type":"text","text":"see structured"}]`)}
	}
	switch name {
	case "everything.echo":
		if d, ok := args["delay_us"].(float64); ok {
			time.Sleep(time.Duration(d) * time.Microsecond)
		}
		return text(fmt.Sprint("Echo: ", args["message"]))
	case "everything.get-sum":
		a, _ := args["a"].(float64)
		b, _ := args["b"].(float64)
		return structured(map[string]any{"sum": a + b})
	case "everything.get-tiny-image":
		return ToolReply{Content: json.RawMessage(`[{"type":"text","text":"A tiny image:"},{"type":"image","data":"iVBORw0KGgo=","mimeType":"image/png"},{"type":"text","text":"The image above."}]`)}
	case "everything.get-env":
		return ToolReply{Error: &ToolFailure{Kind: ToolFailDenied, Message: "the server's policy does not allow everything.get-env: it shows the upstream's environment; do not retry"}}
	case "everything.big":
		n, _ := args["n"].(float64)
		return text(strings.Repeat("é", int(n)/2))
	case "everything.nothing":
		return ToolReply{Content: json.RawMessage(`[]`)}
	case "everything.structured":
		return structured(map[string]any{"temperature": 22.5, "conditions": "sunny", "location": args["location"]})
	case "everything.fail":
		kind, _ := args["kind"].(string)
		fail := &ToolFailure{Kind: kind, Message: "because " + kind}
		if kind == ToolFailError {
			fail.Message = "everything.fail reported: boom"
			fail.Content = json.RawMessage(`[{"type":"text","text":"boom"}]`)
		}
		return ToolReply{Error: fail}
	case "everything.block":
		select {
		case <-f.release:
			return text("released")
		case <-ctx.Done():
			f.mu.Lock()
			f.cancelled++
			f.mu.Unlock()
			return ToolReply{Error: &ToolFailure{Kind: ToolFailCancelled, Message: name + ": cancelled"}}
		case <-time.After(hangGuard):
			return ToolReply{Error: &ToolFailure{Kind: ToolFailTimeout, Message: name + ": never released (hang guard)"}}
		}
	case "everything.barrier":
		n, _ := args["n"].(float64)
		deadline := time.Now().Add(hangGuard)
		for time.Now().Before(deadline) {
			f.mu.Lock()
			ready := f.maxFlight >= int(n)
			f.mu.Unlock()
			if ready {
				return structured(map[string]any{"i": args["i"]})
			}
			time.Sleep(time.Millisecond)
		}
		return ToolReply{Error: &ToolFailure{Kind: ToolFailTimeout, Message: fmt.Sprintf("%s: %v calls never were in flight at once", name, n)}}
	case "everything.wait-block":
		want, _ := args["n"].(float64)
		deadline := time.Now().Add(hangGuard)
		for time.Now().Before(deadline) {
			f.mu.Lock()
			n := 0
			for _, c := range f.calls {
				if c.name == "everything.block" {
					n++
				}
			}
			f.mu.Unlock()
			if n >= int(want) {
				return text("blocked")
			}
			time.Sleep(time.Millisecond)
		}
		return ToolReply{Error: &ToolFailure{Kind: ToolFailTimeout, Message: name + ": no block call"}}
	default:
		return structured(map[string]any{"called": name, "args": args})
	}
}

func (f *fakeTools) snapshot() (calls []fakeCall, maxFlight, catalogs, cancelled int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]fakeCall(nil), f.calls...), f.maxFlight, f.catalogs, f.cancelled
}

// startToolsWorker starts a worker with sandbox_tools.py next to it, as
// the engine places it.
func startToolsWorker(t *testing.T, python string, oneshot bool) *testWorker {
	t.Helper()
	w := startPython(t, python, oneshot)
	if err := os.WriteFile(filepath.Join(filepath.Dir(w.dir), ToolsFile), ToolsSource, 0o444); err != nil {
		t.Fatal(err)
	}
	return w
}

// toolPythons are the interpreters the tools module is tested with: the
// system's, and the oldest and newest pyenv ones the worker runs on.
func toolPythons(t *testing.T) map[string]string {
	t.Helper()
	all := interpreters(t)
	out := map[string]string{}
	var versions []string
	for name, p := range all {
		if name == "system" {
			out[name] = p
		} else {
			versions = append(versions, name)
		}
	}
	sort.Slice(versions, func(i, j int) bool { return versionLess(versions[i], versions[j]) })
	if len(versions) > 0 {
		out[versions[0]] = all[versions[0]]
		out[versions[len(versions)-1]] = all[versions[len(versions)-1]]
	}
	return out
}

func versionLess(a, b string) bool {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := range min(len(pa), len(pb)) {
		x, _ := strconv.Atoi(pa[i])
		y, _ := strconv.Atoi(pb[i])
		if x != y {
			return x < y
		}
	}
	return len(pa) < len(pb)
}

// toolRun runs code with f serving its tool calls; the exchange must work.
func toolRun(t *testing.T, w *testWorker, f Tools, code string) (*Result, string, string) {
	t.Helper()
	return w.run(t, Request{Code: code, Tools: f})
}

// wantValue checks that res succeeded with the JSON value want.
func wantValue(t *testing.T, res *Result, stderr, want string) {
	t.Helper()
	if res.Status != "success" {
		t.Fatalf("status %s: %+v\nstderr:\n%s", res.Status, res.Error, stderr)
	}
	jsonEqual(t, res.ReturnValue, want)
}

// decode unmarshals a successful run's return value into v.
func decode(t *testing.T, res *Result, stderr string, v any) {
	t.Helper()
	if res.Status != "success" {
		t.Fatalf("status %s: %+v\nstderr:\n%s", res.Status, res.Error, stderr)
	}
	if err := json.Unmarshal(res.ReturnValue, v); err != nil {
		t.Fatalf("%v: %s", err, res.ReturnValue)
	}
}

// TestToolCalls: results, arguments checked before sending, and every
// failure kind as its exception.
func TestToolCalls(t *testing.T) {
	for name, python := range toolPythons(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			toolCallCases(t, python)
		})
	}
}

func toolCallCases(t *testing.T, python string) {
	t.Run("results", func(t *testing.T) {
		f := newFakeTools()
		w := startToolsWorker(t, python, true)
		res, _, stderr := toolRun(t, w, f, `
import tools
{
    "echo": tools.everything.echo(message="h\u00e9llo"),
    "sum": tools.everything.get_sum(a=2, b=40.5),
    "image": tools.everything.get_tiny_image(),
    "none": tools.everything.nothing(),
    "weather": tools.everything.structured(),
    "big": [len(tools.everything.big(n=8 << 20).encode()) for i in range(2)],
}`)
		wantValue(t, res, stderr, `{"echo": "Echo: héllo", "sum": {"sum": 42.5},
			"image": [{"type":"text","text":"A tiny image:"},{"type":"image","data":"iVBORw0KGgo=","mimeType":"image/png"},{"type":"text","text":"The image above."}],
			"none": null, "weather": {"temperature": 22.5, "conditions": "sunny", "location": null}, "big": [8388608, 8388608]}`)
		calls, _, catalogs, _ := f.snapshot()
		if len(calls) != 7 || catalogs != 1 || fmt.Sprint(calls[0].args) != "map[message:héllo]" || len(calls[4].args) != 0 {
			t.Errorf("calls %+v, %d catalogs", calls, catalogs)
		}
	})

	t.Run("arguments are checked before sending", func(t *testing.T) {
		f := newFakeTools()
		w := startToolsWorker(t, python, false)
		res, _, stderr := toolRun(t, w, f, `
import tools
errs = []
def bad(f, *args, **kw):
    try:
        f(*args, **kw)
    except tools.ToolError as e:
        errs.append("%s %s %s" % (type(e).__name__, e.kind, e))
    else:
        errs.append("no error")
a = tools.everything.args
bad(tools.everything.get_sum, a="two", b=1)
bad(tools.everything.get_sum, a=1)
bad(tools.everything.get_sum, a=1, b=2, c=3)
bad(tools.everything.get_sum, 1, 2)
bad(a, count=0)
bad(a, count=True)
bad(a, count=1.5)
bad(a, count=1, mode="medium")
bad(a, count=1, tags=["a", 2])
bad(a, count=1, tags=["a", "b", "c", "d"])
bad(a, count=1, filter={"field": "x", "other": 1})
bad(a, count=1, filter={})
bad(a, count=1, id="ABC")
bad(a, count=1, when=3)
bad(a, count=1, choice={"b": "x"})
bad(a, count=1, ref={"n": "x"})
bad(a, count=1, ratio=1)
bad(a, count=1, max_results=1, **{"max-results": 2})
bad(tools.call, "everything.echo")
bad(tools.call, "everything.echo", ["not", "a", "dict"])
bad(tools.everything.open, x=object())
bad(tools.everything.open, x=float("nan"))
bad(tools.everything.open, x="a" * (1 << 20))
errs`)
		var errs []string
		decode(t, res, stderr, &errs)
		want := []string{
			"ToolArgumentError invalid_arguments everything.get-sum: argument 'a': expected number, got str",
			"ToolArgumentError invalid_arguments everything.get-sum: missing required argument 'b'",
			"ToolArgumentError invalid_arguments everything.get-sum: unexpected argument 'c'; it takes a, b",
			"ToolArgumentError invalid_arguments everything.get-sum: takes keyword arguments only: tools.everything.get_sum(*, a: float, b: float) -> dict",
			"ToolArgumentError invalid_arguments everything.args: argument 'count': must be at least 1, got 0",
			"ToolArgumentError invalid_arguments everything.args: argument 'count': expected integer, got bool",
			"ToolArgumentError invalid_arguments everything.args: argument 'count': expected integer, got float",
			"ToolArgumentError invalid_arguments everything.args: argument 'mode': must be one of 'fast', 'slow', got 'medium'",
			"ToolArgumentError invalid_arguments everything.args: argument 'tags'[1]: expected string, got int",
			"ToolArgumentError invalid_arguments everything.args: argument 'tags': must have at most 3 items, got 4",
			"ToolArgumentError invalid_arguments everything.args: argument 'filter': unexpected property 'other'",
			"ToolArgumentError invalid_arguments everything.args: argument 'filter': missing required property 'field'",
			"ToolArgumentError invalid_arguments everything.args: argument 'id': must match the pattern '^[a-z]+$'",
			"ToolArgumentError invalid_arguments everything.args: argument 'when': expected string or null, got int",
			"ToolArgumentError invalid_arguments everything.args: argument 'choice'['b']: expected integer, got str",
			"ToolArgumentError invalid_arguments everything.args: argument 'ref'['n']: expected integer, got str",
			"ToolArgumentError invalid_arguments everything.args: argument 'ratio': must be less than 1, got 1",
			"ToolArgumentError invalid_arguments everything.args: argument 'max-results' given twice",
			"ToolArgumentError invalid_arguments everything.echo: missing required argument 'message'",
			"ToolArgumentError invalid_arguments everything.echo: arguments must be a dict, got list",
			"ToolArgumentError invalid_arguments everything.open: arguments cannot be sent as JSON: Object of type object is not JSON serializable",
			"ToolArgumentError invalid_arguments everything.open: arguments cannot be sent as JSON: Out of range float values are not JSON compliant",
			"ToolLimitExceeded limit everything.open: arguments of 1048584 bytes as JSON; a call may send at most 1048576",
		}
		for i := range max(len(errs), len(want)) {
			var g, wt string
			if i < len(errs) {
				g = errs[i]
			}
			if i < len(want) {
				wt = want[i]
			}
			// Python's own words for JSON errors differ a little by version.
			if g != wt && !(strings.Contains(wt, "cannot be sent as JSON") && strings.HasPrefix(g, wt[:strings.Index(wt, "JSON:")])) {
				t.Errorf("error %d:\n got %q\nwant %q", i, g, wt)
			}
		}
		if calls, _, _, _ := f.snapshot(); len(calls) != 0 {
			t.Errorf("arguments that fail the schema were sent: %+v", calls)
		}

		// What passes: names as attributes, None leaving optional
		// arguments out (unless they take null).
		res, _, stderr = toolRun(t, w, f, `
import tools
tools.everything.args(count=3, max_results=7, mode=None, when=None, class_=True, tags=("a",), choice={"a": "x"}, ratio=0.5)["args"]`)
		wantValue(t, res, stderr, `{"count": 3, "max-results": 7, "when": null, "class": true, "tags": ["a"], "choice": {"a": "x"}, "ratio": 0.5}`)
	})

	t.Run("failures", func(t *testing.T) {
		f := newFakeTools()
		w := startToolsWorker(t, python, true)
		res, _, stderr := toolRun(t, w, f, `
import tools
out = []
for kind in ["tool_error", "denied", "declined", "rate_limited", "limit", "timeout", "cancelled",
             "unavailable", "invalid_arguments", "unknown_tool", "bad_request", "strange"]:
    try:
        tools.everything.fail(kind=kind)
    except tools.ToolError as e:
        bases = [c.__name__ for c in type(e).__mro__[1:] if c.__name__ in ("TimeoutError", "TypeError", "AttributeError", "ToolDenied")]
        out.append([kind, type(e).__name__, e.kind, e.tool, e.message, str(e), getattr(e, "content", None), bases])
try:
    tools.call("everything.get-env")
except tools.ToolDenied as e:
    out.append([str(e)])
out`)
		var got [][]any
		decode(t, res, stderr, &got)
		if len(got) > 0 {
			// A tool the policy hides from the catalog is still refused by
			// the server, not by the module.
			if h := got[len(got)-1]; fmt.Sprint(h) != "[the server's policy does not allow everything.get-env: it shows the upstream's environment; do not retry]" {
				t.Errorf("hidden tool: %v", h)
			}
			got = got[:len(got)-1]
		}
		want := map[string]string{
			"tool_error": "ToolCallError", "denied": "ToolDenied", "declined": "ToolApprovalDeclined", "rate_limited": "ToolRateLimited",
			"limit": "ToolLimitExceeded", "timeout": "ToolTimeout", "cancelled": "ToolCancelled", "unavailable": "ToolUnavailable",
			"invalid_arguments": "ToolArgumentError", "unknown_tool": "ToolNotFound", "bad_request": "ToolError", "strange": "ToolError",
		}
		bases := map[string]string{"declined": "[ToolDenied]", "timeout": "[TimeoutError]", "invalid_arguments": "[TypeError]", "unknown_tool": "[AttributeError]"}
		if len(got) != len(want) {
			t.Fatalf("got %v", got)
		}
		for _, g := range got {
			kind := g[0].(string)
			msg := "everything.fail: because " + kind
			if kind == ToolFailError {
				msg = "everything.fail reported: boom"
			}
			if g[1] != want[kind] || g[2] != kind || g[3] != "everything.fail" || g[5] != msg || fmt.Sprint(g[7]) != cmp(bases[kind], "[]") {
				t.Errorf("%s: %v", kind, g)
			}
			if (kind == ToolFailError) != (g[6] != nil) || (kind == ToolFailError && fmt.Sprint(g[6]) != "[map[text:boom type:text]]") {
				t.Errorf("%s: content %v", kind, g[6])
			}
		}
	})
}

func cmp(s, otherwise string) string {
	if s == "" {
		return otherwise
	}
	return s
}

// TestToolIntrospection: what help(), inspect and the module's listing
// functions show, and how names are made attributes.
func TestToolIntrospection(t *testing.T) {
	for name, python := range toolPythons(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFakeTools()
			w := startToolsWorker(t, python, true)
			res, _, stderr := toolRun(t, w, f, `
import inspect, pydoc, tools
def err(f):
    try:
        f()
    except AttributeError as e:
        return [type(e).__name__, str(e)]
get_sum = tools.everything.get_sum
{
    "signature": str(inspect.signature(tools.everything.args)),
    "sum_signature": str(inspect.signature(get_sum)),
    "open_signature": str(inspect.signature(tools.everything.open)),
    "names": [get_sum.__name__, get_sum.__qualname__, get_sum.__module__, get_sum.name],
    "help": pydoc.render_doc(get_sum, renderer=pydoc.plaintext),
    "doc": tools.everything.args.__doc__,
    "module_help": pydoc.render_doc(tools, renderer=pydoc.plaintext),
    "list": tools.list(),
    "glob": tools.list("*get*"),
    "substring": tools.list("SUM"),
    "describe": tools.describe("everything.get-sum"),
    "describe_pattern": tools.describe("my-server.*").count("tools.my_server."),
    "servers": tools.servers(),
    "dir_server": dir(tools.everything),
    "dir_module": dir(tools),
    "keyword": tools.my_server.class_(x=1),
    "clash_attribute": tools.my_server.get_item()["called"],
    "clash_call": tools.call("my-server.get-item")["called"],
    "call_keywords": tools.call("everything.echo", message="a"),
    "call_dict": tools.call("everything.echo", {"message": "b"}),
    "call_attribute_names": tools.call("everything.get_sum", a=1, b=2),
    "digit": tools._1st.x()["called"],
    "missing_tool": err(lambda: tools.everything.ech),
    "missing_server": err(lambda: tools.evrything),
    "missing_call": err(lambda: tools.call("everything.nope")),
    "not_a_full_name": err(lambda: tools.call("echo")),
    "hasattr": [hasattr(tools.everything, "nope"), hasattr(tools, "__path__")],
    "repr": [repr(tools.everything), repr(tools.everything.echo)],
}`)
			var got map[string]any
			decode(t, res, stderr, &got)
			for key, want := range map[string]string{
				"signature":            `(*, count: int, choice: 'Any' = None, class_: bool = None, filter: dict = None, id: str = None, max_results: int = 5, mode: 'Literal["fast", "slow"]' = None, ratio: float = None, ref: 'Any' = None, tags: 'list[str]' = None, when: 'str | None' = None) -> str`,
				"sum_signature":        "(*, a: float, b: float) -> dict",
				"open_signature":       "(**arguments) -> str",
				"names":                "[get_sum everything.get_sum tools everything.get-sum]",
				"list":                 "[1st.x everything.args everything.barrier everything.big everything.block everything.echo everything.fail everything.get-sum everything.get-tiny-image everything.nothing everything.open everything.structured everything.wait-block my-server.class my-server.get-item my-server.get_item]",
				"glob":                 "[everything.get-sum everything.get-tiny-image my-server.get-item my-server.get_item]",
				"substring":            "[everything.get-sum]",
				"describe_pattern":     "3",
				"servers":              "[map[error: name:everything status:ready tools:12] map[error: name:my-server status:ready tools:3] map[error: name:1st status:ready tools:1] map[error:exited with status 1 name:broken status:failed tools:0]]",
				"dir_server":           "[args barrier big block echo fail get_sum get_tiny_image nothing open structured wait_block]",
				"dir_module":           "[ToolApprovalDeclined ToolArgumentError ToolCallError ToolCancelled ToolDenied ToolError ToolLimitExceeded ToolNotFound ToolRateLimited ToolTimeout ToolUnavailable _1st acall broken call describe everything list my_server servers]",
				"keyword":              "map[args:map[x:1] called:my-server.class]",
				"clash_attribute":      "my-server.get_item",
				"clash_call":           "my-server.get-item",
				"call_keywords":        "Echo: a",
				"call_dict":            "Echo: b",
				"call_attribute_names": "map[sum:3]",
				"digit":                "1st.x",
				"missing_tool":         "[ToolNotFound everything.ech: no tool of that name; did you mean tools.everything.echo? (tools.list() lists them)]",
				"missing_server":       "[ToolNotFound evrything: no server of that name; did you mean everything? (tools.list() lists them)]",
				"missing_call":         "[ToolNotFound everything.nope: no tool of that name; did you mean everything.open? (tools.list() lists them)]",
				"not_a_full_name":      "[ToolNotFound echo: a tool's full name is SERVER.TOOL, as tools.list() gives them]",
				"hasattr":              "[false false]",
				"repr":                 "[<tools server everything> <tool everything.echo: tools.everything.echo(*, message: str) -> str>]",
			} {
				if g := fmt.Sprint(got[key]); g != want {
					t.Errorf("%s:\n got %s\nwant %s", key, g, want)
				}
			}
			for key, parts := range map[string][]string{
				// help() shows the signature (on one line or several, by
				// version), the description, each argument and the result.
				"help": {"Tool in module tools", "get_sum(", "a: float", "-> dict", "Returns the sum of two numbers.",
					"a (number, required): First number", "Returns: dict {sum: number}", `tools.call("everything.get-sum", {...})`},
				"doc": {"Takes many kinds of arguments.\nSecond line.\n\nArguments:\n  count (integer, required): How many\n",
					"  max_results (integer, optional, default 5, sent as 'max-results'): At most this many results\n",
					"  class_ (boolean, optional, sent as 'class')\n", "  when (string or null, optional)\n",
					"  mode (one of 'fast', 'slow', optional)\n", "  tags (array of string, optional)\n",
					"Returns: its text (str); a list of content dicts"},
				"module_help": {"tools - Call the tools of other MCP servers from Python code.", "tools.list()", "acall(name, arguments=None, **kwargs)",
					"class ToolError(builtins.Exception)", "ToolTimeout(ToolError, builtins.TimeoutError)"},
				"describe": {"tools.everything.get_sum(*, a: float, b: float) -> dict\n    Returns the sum of two numbers.\n"},
			} {
				for _, p := range parts {
					if s, _ := got[key].(string); !strings.Contains(s, p) {
						t.Errorf("%s lacks %q:\n%s", key, p, s)
					}
				}
			}
		})
	}
}

// TestToolsParallel: acall runs calls at once. The fake answers none
// until 8 are in flight, so calls made one after the other would never
// finish (the hang guard would fail them).
func TestToolsParallel(t *testing.T) {
	for name, python := range toolPythons(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFakeTools()
			w := startToolsWorker(t, python, true)
			res, _, stderr := toolRun(t, w, f, `
import asyncio, tools
got = await asyncio.gather(*[tools.everything.barrier.acall(n=8, i=i) for i in range(8)])
more = await asyncio.gather(tools.acall("everything.echo", message="x"), tools.acall("everything.echo", {"message": "y"}))
[[g["i"] for g in got], more]`)
			wantValue(t, res, stderr, `[[0, 1, 2, 3, 4, 5, 6, 7], ["Echo: x", "Echo: y"]]`)
			if _, maxFlight, _, _ := f.snapshot(); maxFlight < 8 {
				t.Errorf("at most %d calls in flight at once", maxFlight)
			}
		})
	}
}

// TestToolsThreads: threads call at once, the main thread too, and the
// answers (in any order) reach the right callers. A one-shot run's
// non-daemon threads and atexit handlers can still call.
func TestToolsThreads(t *testing.T) {
	for name, python := range toolPythons(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFakeTools()
			w := startToolsWorker(t, python, true)
			res, stdout, stderr := toolRun(t, w, f, `
import atexit, random, threading, time, tools
results = {}
def worker(k):
    # All 7 callers (the main thread too) are waiting at once here.
    tools.everything.barrier(n=7)
    for i in range(20):
        want = "Echo: %d-%d" % (k, i)
        got = tools.everything.echo(message="%d-%d" % (k, i))
        results.setdefault(k, []).append(got == want or got)
threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
for th in threads:
    th.start()
tools.everything.barrier(n=7)
mine = [tools.call("everything.echo", message=str(i)) for i in range(20)]
for th in threads:
    th.join()
def late():
    # Not joined by the run's code: the interpreter waits for it.
    time.sleep(0.1)
    print("late:", tools.everything.echo(message="from a thread"), flush=True)
threading.Thread(target=late).start()
atexit.register(lambda: print("atexit:", tools.everything.echo(message="at exit"), flush=True))
[sorted(set(map(str, sum(results.values(), [])))), len(results), mine == ["Echo: %d" % i for i in range(20)]]`)
			wantValue(t, res, stderr, `[["True"], 6, true]`)
			if !strings.Contains(stdout, "late: Echo: from a thread\n") || !strings.Contains(stdout, "atexit: Echo: at exit\n") {
				t.Errorf("stdout:\n%s\nstderr:\n%s", stdout, stderr)
			}
			if calls, maxFlight, _, _ := f.snapshot(); len(calls) != 149 || maxFlight < 7 {
				t.Errorf("%d calls, at most %d at once", len(calls), maxFlight)
			}
		})
	}
}

// waitFor waits until cond holds, with a hang guard.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(hangGuard)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (w *testWorker) stdoutHas(s string) func() bool {
	return func() bool {
		b, _ := os.ReadFile(w.stdout)
		return bytes.Contains(b[w.outOff:], []byte(s))
	}
}

// TestToolsSession: a session keeps results and the module across runs,
// code that goes on between runs cannot call, and SIGINT during a call
// interrupts the run without putting the stream out of step.
func TestToolsSession(t *testing.T) {
	for name, python := range toolPythons(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			toolSessionCases(t, python)
		})
	}
}

func toolSessionCases(t *testing.T, python string) {
	t.Run("results and the catalog across runs", func(t *testing.T) {
		f := newFakeTools()
		w := startToolsWorker(t, python, false)
		res, _, stderr := toolRun(t, w, f, "import tools\nweather = tools.everything.structured(location='Oslo')\nsorted(weather)")
		wantValue(t, res, stderr, `["conditions", "location", "temperature"]`)
		// The second run uses the module and the result the first left,
		// and fetches the catalog again (it may have changed).
		f.specs = append(f.specs, ToolSpec{Name: "late.comer", Server: "late", Tool: "comer", InputSchema: json.RawMessage(`{"type":"object"}`)})
		res, _, stderr = toolRun(t, w, f, "[weather['location'], tools.everything.echo(message='again'), tools.late.comer()['called']]")
		wantValue(t, res, stderr, `["Oslo", "Echo: again", "late.comer"]`)
		if _, _, catalogs, _ := f.snapshot(); catalogs != 2 {
			t.Errorf("%d catalogs fetched, want one per run", catalogs)
		}
		// A run without tools cannot call them, though the module stays.
		res, _, stderr = w.run(t, Request{Code: `
try:
    tools.everything.echo(message="no")
except tools.ToolError as e:
    err = [type(e).__name__, str(e)]
err`})
		wantValue(t, res, stderr, `["ToolUnavailable", "this run cannot call tools"]`)
	})

	t.Run("a background thread between runs", func(t *testing.T) {
		f := newFakeTools()
		w := startToolsWorker(t, python, false)
		res, _, stderr := toolRun(t, w, f, `
import os, threading, time, tools
box = {}
def background():
    while not os.path.exists("go"):
        time.sleep(0.005)
    try:
        box["result"] = tools.everything.echo(message="between runs")
    except tools.ToolError as e:
        box["error"] = [type(e).__name__, str(e)]
    open("done", "w").close()
threading.Thread(target=background, daemon=True).start()
tools.everything.echo(message="in the run")`)
		wantValue(t, res, stderr, `"Echo: in the run"`)
		if err := os.WriteFile(filepath.Join(w.dir, "go"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the background call", func() bool {
			_, err := os.Stat(filepath.Join(w.dir, "done"))
			return err == nil
		})
		if err := w.conn.Sync(testContext(t), "marker-0123456789abcdef"); err != nil {
			t.Fatal(err)
		}
		res, _, stderr = toolRun(t, w, f, "[box, tools.everything.echo(message='next')]")
		wantValue(t, res, stderr, `[{"error": ["ToolCancelled", "no run is in progress: tools can be called only during a run, not by code that goes on after it (such as a background thread)"]}, "Echo: next"]`)
		if calls, _, _, _ := f.snapshot(); len(calls) != 2 {
			t.Errorf("calls %+v", calls)
		}
	})

	t.Run("SIGINT during a call", func(t *testing.T) {
		f := newFakeTools()
		w := startToolsWorker(t, python, false)
		done := make(chan *Result, 1)
		go func() {
			res, err := w.conn.Run(context.Background(), Request{Tools: f, Code: `
import select, tools
print("started", flush=True)
try:
    tools.everything.block()
except KeyboardInterrupt:
    print("interrupted", flush=True)
    # Wait for the blocked call's answer, which nobody waits for now.
    select.select([3], [], [], 60)
    print("after:", tools.everything.echo(message="after"), flush=True)
    raise`})
			if err != nil {
				t.Error(err)
			}
			done <- res
		}()
		waitFor(t, "the call", func() bool { calls, _, _, _ := f.snapshot(); return len(calls) == 1 })
		waitFor(t, "the run to start", w.stdoutHas("started\n"))
		// The main thread waits in the worker's channel code: the SIGINT
		// must reach it there.
		if err := w.cmd.Process.Signal(os.Interrupt); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the interrupt", w.stdoutHas("interrupted\n"))
		f.release <- struct{}{}
		var res *Result
		select {
		case res = <-done:
		case <-time.After(hangGuard):
			t.Fatal("the run did not end")
		}
		stdout, stderr := w.output(t)
		wantError(t, res, "KeyboardInterrupt", 1)
		if !strings.Contains(stdout, "after: Echo: after\n") || strings.Contains(stderr, "worker.py") || strings.Contains(stderr, ToolsFile) ||
			!strings.Contains(stderr, "tools.everything.block()") {
			t.Errorf("stdout:\n%s\nstderr:\n%s", stdout, stderr)
		}
		// The late answer was dropped; the stream is in step.
		res, _, stderr = toolRun(t, w, f, "[tools.everything.echo(message='next'), tools._channel.dropped]")
		wantValue(t, res, stderr, `["Echo: next", 1]`)
	})

	t.Run("ToolsCtx ends the calls", func(t *testing.T) {
		// As the engine does at a session's timeout: the calls end at
		// once, while Run still waits for the run's answer.
		f := newFakeTools()
		w := startToolsWorker(t, python, false)
		toolsCtx, stop := context.WithCancel(context.Background())
		go func() {
			waitFor(t, "the call", func() bool { calls, _, _, _ := f.snapshot(); return len(calls) == 1 })
			stop()
		}()
		res, _, stderr := w.run(t, Request{Tools: f, ToolsCtx: toolsCtx, Code: `
import tools
out = []
for i in range(2):
    try:
        tools.everything.block()
    except tools.ToolCancelled as e:
        out.append(str(e))
out`})
		wantValue(t, res, stderr, `["everything.block: cancelled", "everything.block: cancelled"]`)
		if _, _, _, cancelled := f.snapshot(); cancelled != 2 {
			t.Errorf("%d calls cancelled", cancelled)
		}
	})
}

// recConn records whether the Conn wrote a tool answer after it read a
// run's result.
type recConn struct {
	net.Conn
	mu         sync.Mutex
	tail       []byte // the end of what was read last, for a split marker
	resultRead bool
	late       int // tool answers written after a result was read
}

var resultMarker = []byte(`{"op":"result"`)

func (r *recConn) Read(p []byte) (int, error) {
	n, err := r.Conn.Read(p)
	r.mu.Lock()
	buf := append(r.tail, p[:n]...)
	if bytes.Contains(buf, resultMarker) {
		r.resultRead = true
	}
	r.tail = append([]byte(nil), buf[max(0, len(buf)-len(resultMarker)):]...)
	r.mu.Unlock()
	return n, err
}

func (r *recConn) Write(p []byte) (int, error) {
	r.mu.Lock()
	if r.resultRead && bytes.Contains(p, []byte(`"op":"tool_`)) {
		r.late++
	}
	r.mu.Unlock()
	return r.Conn.Write(p)
}

// record wraps w's connection in a recConn; before any exchange.
func (w *testWorker) record() *recConn {
	rc := &recConn{Conn: w.conn.conn}
	w.conn.conn = rc
	w.conn.r = bufio.NewReaderSize(rc, 64<<10)
	return rc
}

func (r *recConn) reset() {
	r.mu.Lock()
	r.resultRead, r.tail = false, nil
	r.mu.Unlock()
}

// TestToolsRunEndsWithCallsInFlight: when the result is read, the calls
// still in flight are cancelled and their answers never written; the
// worker fails its waiters and the next request works.
func TestToolsRunEndsWithCallsInFlight(t *testing.T) {
	for _, oneshot := range []bool{false, true} {
		t.Run(fmt.Sprint("oneshot=", oneshot), func(t *testing.T) {
			t.Parallel()
			f := newFakeTools()
			w := startToolsWorker(t, systemPython, oneshot)
			rc := w.record()
			res, _, stderr := toolRun(t, w, f, `
import threading, tools
def background():
    try:
        tools.everything.block()
    except tools.ToolError as e:
        print("background:", type(e).__name__, e, flush=True)
for i in range(3):
    threading.Thread(target=background, daemon=True).start()
tools.everything.wait_block(n=3)`)
			wantValue(t, res, stderr, `"blocked"`)
			// The calls in flight when the result was read were cancelled
			// before Run returned.
			if _, _, _, cancelled := f.snapshot(); cancelled != 3 {
				t.Errorf("%d calls cancelled, want 3", cancelled)
			}
			rc.mu.Lock()
			late := rc.late
			rc.mu.Unlock()
			if late != 0 {
				t.Errorf("%d tool answers written after the result", late)
			}
			if oneshot {
				return
			}
			waitFor(t, "the background threads", func() bool {
				b, _ := os.ReadFile(w.stdout)
				return bytes.Count(b, []byte("background: ToolCancelled everything.block: the run ended before the tool answered\n")) == 3
			})
			rc.reset()
			res, _, stderr = toolRun(t, w, f, "[tools.everything.echo(message='next'), tools._channel.dropped]")
			wantValue(t, res, stderr, `["Echo: next", 0]`)
		})
	}
}

// forge is Python that writes raw lines to the control channel and reads
// the answers itself, as hostile code in a run can.
const forge = `
import json, os, socket
_s = socket.socket(fileno=os.dup(3))
def send(data):
    while data:
        data = data[os.write(3, data):]
def answers(n):
    buf = b""
    while buf.count(b"\n") < n:
        chunk = _s.recv(1 << 20)
        if not chunk:
            break
        buf += chunk
    return [json.loads(l) for l in buf.split(b"\n")[:n]]
`

// TestToolsHostile: tool messages forged by code in the run are answered
// or end the exchange as the protocol says, within bounds.
func TestToolsHostile(t *testing.T) {
	requirePython(t, systemPython)
	refused := func(name, line, kind, message string) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFakeTools()
			w := startToolsWorker(t, systemPython, false)
			code := forge + fmt.Sprintf("send(%s)\na = answers(1)[0]\n[a['op'], a['id'], a['error']['kind'], a['error']['message']]", line)
			res, _, stderr := toolRun(t, w, f, code)
			var got []string
			decode(t, res, stderr, &got)
			if len(got) != 4 || got[0] != OpToolResult || got[1] != "x" || got[2] != kind || !strings.Contains(got[3], message) {
				t.Errorf("answer %q, want %s %q", got, kind, message)
			}
			if calls, _, _, _ := f.snapshot(); len(calls) != 0 {
				t.Errorf("calls %+v", calls)
			}
			res, _, stderr = toolRun(t, w, f, "import tools\ntools.everything.echo(message='still in step')")
			wantValue(t, res, stderr, `"Echo: still in step"`)
		})
	}
	refused("2 MiB of arguments", `b'{"op":"tool_call","id":"x","name":"everything.echo","arguments":{"message":"' + b"y" * (2 << 20) + b'"}}\n'`,
		ToolFailBadRequest, "everything.echo: arguments of 2097166 bytes (the bound is 1048576)")
	refused("arguments not an object", `b'{"op":"tool_call","id":"x","name":"everything.echo","arguments":[1, 2]}\n'`, ToolFailBadRequest, "arguments must be a JSON object")
	refused("arguments a string", `b'{"op":"tool_call","id":"x","name":"everything.echo","arguments":"{}"}\n'`, ToolFailBadRequest, "arguments must be a JSON object")
	refused("no arguments", `b'{"op":"tool_call","id":"x","name":"everything.echo"}\n'`, ToolFailBadRequest, "arguments must be a JSON object")
	refused("no name", `b'{"op":"tool_call","id":"x","arguments":{}}\n'`, ToolFailBadRequest, "tool call without a name")
	refused("long name", `b'{"op":"tool_call","id":"x","name":"' + b"n" * 300 + b'","arguments":{}}\n'`, ToolFailBadRequest, "tool name of 300 bytes")
	refused("name not a string", `b'{"op":"tool_call","id":"x","name":5,"arguments":{}}\n'`, ToolFailBadRequest, "malformed tool call")

	violation := func(name, line, message string) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			w := startToolsWorker(t, systemPython, false)
			code := forge + fmt.Sprintf("send(%s)\nimport time\ntime.sleep(60)", line)
			_, err := w.conn.Run(testContext(t), Request{Code: code, Tools: newFakeTools()})
			if !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), message) {
				t.Fatalf("error %v, want a protocol violation with %q", err, message)
			}
			if _, err := w.conn.Probe(testContext(t), nil, nil); err == nil {
				t.Error("Conn usable after a violation")
			}
		})
	}
	violation("huge id", `b'{"op":"tool_call","id":"' + b"i" * 100000 + b'","name":"a.b","arguments":{}}\n'`, "tool_call message with an id of 100000 bytes")
	violation("empty id", `b'{"op":"tool_catalog","id":""}\n'`, "tool_catalog message with an id of 0 bytes")
	violation("id not a string", `b'{"op":"tool_call","id":7,"name":"a.b","arguments":{}}\n'`, "bad reply")
	violation("bad JSON", `b'{"op":"tool_call", nope\n'`, "bad reply")
	violation("a tool_result sent to Go", `b'{"op":"tool_result","id":"t1"}\n'`, "does not match")

	// Refused messages cost the server CPU: a run may send only so many.
	// The bounds are proved with small ones configured on the Conn (2 MiB
	// sent against 1 MiB, 3000 messages against 2000): the production
	// ones (TestToolBoundsDefaults) would take 512 MiB through the race
	// detector, minutes on a loaded machine.
	t.Run("a flood of refused bytes", func(t *testing.T) {
		t.Parallel()
		w := startToolsWorker(t, systemPython, false)
		w.conn.toolMsgs, w.conn.toolBytes = 2000, 1<<20
		code := forge + `
import threading
threading.Thread(target=lambda: [answers(1 << 30)], daemon=True).start()  # drain the refusals
line = b'{"op":"tool_call","id":"x","name":"a.b","arguments":["' + b"y" * (128 << 10) + b'"]}\n'
for i in range(16):
    send(line)
import time
time.sleep(60)`
		_, err := w.conn.Run(testContext(t), Request{Code: code, Tools: newFakeTools()})
		if !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "more than 2000 tool messages or 1048576 bytes of them") {
			t.Fatalf("error %v, want a protocol violation", err)
		}
	})
	t.Run("a flood of refused messages", func(t *testing.T) {
		t.Parallel()
		f := newFakeTools()
		w := startToolsWorker(t, systemPython, false)
		w.conn.toolMsgs, w.conn.toolBytes = 2000, 8<<20
		// Up to the bound, each run afresh: the count is per run.
		batch := forge + `
send(b"".join(b'{"op":"tool_call","id":"r%d","name":"a.b","arguments":[]}\n' % i for i in range(n)))
got = answers(n)
[len(got), set(a["error"]["kind"] for a in got) == {"bad_request"}]`
		for range 2 {
			res, _, stderr := w.run(t, Request{Code: batch, Tools: f, Inputs: map[string]json.RawMessage{"n": json.RawMessage("2000")}})
			wantValue(t, res, stderr, `[2000, true]`)
		}
		code := forge + `
import threading
threading.Thread(target=lambda: [answers(1 << 30)], daemon=True).start()  # drain the refusals
send(b"".join(b'{"op":"tool_call","id":"r%d","name":"a.b","arguments":[]}\n' % i for i in range(3000)))
import time
time.sleep(60)`
		_, err := w.conn.Run(testContext(t), Request{Code: code, Tools: f})
		if !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "more than 2000 tool messages") {
			t.Fatalf("error %v, want a protocol violation", err)
		}
	})

	t.Run("100 calls at once", func(t *testing.T) {
		t.Parallel()
		f := newFakeTools()
		w := startToolsWorker(t, systemPython, false)
		res, _, stderr := toolRun(t, w, f, forge+`
send(b"".join(b'{"op":"tool_call","id":"c%d","name":"everything.block","arguments":{}}\n' % i for i in range(100)))
got = answers(100 - 16)
[sorted(set(a["error"]["kind"] for a in got)), sorted(int(a["id"][1:]) for a in got) == list(range(16, 100)), got[0]["error"]["message"]]`)
		wantValue(t, res, stderr, `[["limit"], true, "everything.block: this run already has 16 tool calls in flight, the most at once; wait for some to finish"]`)
		// The 16 served were cancelled when the run ended, unanswered, and
		// never more than 16 were in flight (how many were at once when
		// the run ended depends on scheduling: a busy machine may not have
		// started the last before the end cancelled it).
		if _, maxFlight, _, cancelled := f.snapshot(); maxFlight > MaxToolCallsInFlight || cancelled != MaxToolCallsInFlight {
			t.Errorf("%d in flight at most, %d cancelled", maxFlight, cancelled)
		}
		res, _, stderr = toolRun(t, w, f, "import tools\ntools.everything.echo(message='still in step')")
		wantValue(t, res, stderr, `"Echo: still in step"`)
	})

	t.Run("catalog flood", func(t *testing.T) {
		// 500 answers are many times maxPendingAnswers and, at a few KiB
		// each, far beyond what the socket buffers hold: the Conn has to
		// stop reading and resume. More would only cost time.
		t.Parallel()
		f := newFakeTools()
		w := startToolsWorker(t, systemPython, false)
		res, _, stderr := toolRun(t, w, f, forge+`
import threading
n = 500
got = []
reader = threading.Thread(target=lambda: got.extend(answers(n)))
reader.start()
send(b"".join(b'{"op":"tool_catalog","id":"k%d"}\n' % i for i in range(n)))
reader.join()
[len(got), sorted(int(a["id"][1:]) for a in got) == list(range(n)), set(len(a["tools"]) for a in got) == {len(got[0]["tools"])}, len(got[0]["tools"])]`)
		wantValue(t, res, stderr, fmt.Sprintf(`[500, true, true, %d]`, len(f.specs)))
		if _, _, catalogs, _ := f.snapshot(); catalogs != 1 {
			t.Errorf("Catalog called %d times in one run", catalogs)
		}
		res, _, stderr = toolRun(t, w, f, "import tools\ntools.everything.echo(message='still in step')")
		wantValue(t, res, stderr, `"Echo: still in step"`)
	})

	t.Run("a flood nobody reads", func(t *testing.T) {
		// The Conn stops reading once its answers back up, and holds no
		// more than its bounds; ctx ends the run. Not in parallel: it
		// counts the process's goroutines.
		f := newFakeTools()
		w := startToolsWorker(t, systemPython, false)
		if _, err := w.conn.Ready(testContext(t)); err != nil {
			t.Fatal(err)
		}
		var peak int
		stop := make(chan struct{})
		sampled := make(chan struct{})
		go func() {
			defer close(sampled)
			for {
				select {
				case <-stop:
					return
				case <-time.After(5 * time.Millisecond):
				}
				peak = max(peak, runtime.NumGoroutine())
			}
		}()
		base := runtime.NumGoroutine()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err := w.conn.Run(ctx, Request{Tools: f, Code: forge + `
import threading, time
flood = b"".join(b'{"op":"tool_catalog","id":"k%d"}\n' % i for i in range(100000))
threading.Thread(target=send, args=(flood,), daemon=True).start()
time.sleep(60)`})
		close(stop)
		<-sampled
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("error %v", err)
		}
		if peak > base+maxPendingAnswers+MaxToolCallsInFlight+20 {
			t.Errorf("%d goroutines at the peak, %d before", peak, base)
		}
		// Run returned only once all its goroutines had.
		if n := runtime.NumGoroutine(); n > base+5 {
			t.Errorf("%d goroutines after the run, %d before", n, base)
		}
	})

	t.Run("tool messages outside a run with tools", func(t *testing.T) {
		t.Parallel()
		w := startToolsWorker(t, systemPython, false)
		// A run without Tools.
		res, _, stderr := w.run(t, Request{Code: forge + `
send(b'{"op":"tool_call","id":"a","name":"x.y","arguments":{}}\n{"op":"tool_catalog","id":"b"}\n')
[[a["op"], a["id"], a["error"]] + ([a["tools"], a["servers"]] if a["op"] == "tool_catalog" else []) for a in answers(2)]`})
		wantValue(t, res, stderr, `[["tool_result", "a", {"kind": "cancelled", "message": "this run cannot call tools"}],
			["tool_catalog", "b", {"kind": "cancelled", "message": "this run cannot call tools"}, [], []]]`)
		// Between runs, from a background thread: answered during the
		// next exchange, and the worker drops the answer.
		res, _, _ = w.run(t, Request{Code: forge + `
import threading, time
def later():
    while not os.path.exists("go"):
        time.sleep(0.005)
    send(b'{"op":"tool_call","id":"late","name":"x.y","arguments":{}}\n')
    open("sent", "w").close()
threading.Thread(target=later, daemon=True).start()`})
		wantSuccess(t, res)
		if err := os.WriteFile(filepath.Join(w.dir, "go"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the forged call", func() bool { _, err := os.Stat(filepath.Join(w.dir, "sent")); return err == nil })
		if err := w.conn.Sync(testContext(t), "marker-0123456789abcdef"); err != nil {
			t.Fatal(err)
		}
		res, _, stderr = w.run(t, Request{Code: "'in step'"})
		wantValue(t, res, stderr, `"in step"`)
		if _, err := w.conn.Validate(testContext(t), "x = 1", ""); err != nil {
			t.Fatal(err)
		}
	})
}

// TestToolsImport: the module is there only in runs given tools, as
// "tools" (unless the user has one) and "pysandbox_tools", which nothing
// in the working directory shadows. (Dependencies: TestToolsNameReserved.)
func TestToolsImport(t *testing.T) {
	requirePython(t, systemPython)
	f := newFakeTools()
	w := startToolsWorker(t, systemPython, false)
	res, _, stderr := w.run(t, Request{Code: `
out = []
for name in ("tools", "pysandbox_tools"):
    try:
        __import__(name)
        out.append("imported")
    except ModuleNotFoundError as e:
        out.append(str(e))
out`})
	wantValue(t, res, stderr, `["No module named 'tools'", "No module named 'pysandbox_tools'"]`)

	// The channel reads through its demultiplexer only from the first
	// call on, and needs no threading module even then.
	res, _, stderr = toolRun(t, w, f, `
import sys, tools, pysandbox_tools
before = [tools._channel.demux, "threading" in sys.modules]
[tools is pysandbox_tools, tools.__name__, [type(sys.meta_path[i]).__name__ for i in (0, -1)], tools.everything.echo(message="x"),
 before, [tools._channel.demux, "threading" in sys.modules]]`)
	wantValue(t, res, stderr, `[true, "tools", ["_ToolsFinder", "_ToolsFinder"], "Echo: x", [false, false], [true, false]]`)

	// A tools.py of the user's wins; a pysandbox_tools.py does not, and
	// in a run without tools it is not found either.
	w = startToolsWorker(t, systemPython, false)
	for name, text := range map[string]string{"tools.py": "NAME = 'mine'\n", "pysandbox_tools.py": "NAME = 'mine'\n"} {
		if err := os.WriteFile(filepath.Join(w.dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	res, _, stderr = w.run(t, Request{Code: `
try:
    import pysandbox_tools
except ModuleNotFoundError as e:
    err = str(e)
err`})
	wantValue(t, res, stderr, `"No module named 'pysandbox_tools'"`)
	res, _, stderr = toolRun(t, w, f, `
import tools, pysandbox_tools
[tools.NAME, getattr(pysandbox_tools, "NAME", None), pysandbox_tools.everything.echo(message="ours")]`)
	wantValue(t, res, stderr, `["mine", null, "Echo: ours"]`)
}

// moduleHarness loads sandbox_tools.py with a channel of its own and runs
// the code in argv[3]: the module alone, on interpreters the worker does
// not run on (it needs 3.8; the module keeps to 3.6).
const moduleHarness = `
import importlib.util, json, sys
PATH, CATALOG = sys.argv[1], json.loads(sys.argv[2])

class Channel(object):
    epoch = 1
    def __init__(self):
        self.sent = []
    def call(self, msg, arguments=None):
        self.sent.append([msg, arguments and json.loads(arguments)])
        if msg["op"] == "tool_catalog":
            return dict(CATALOG, op="tool_catalog")
        if msg["name"] == "everything.echo":
            return {"op": "tool_result", "content": [{"type": "text", "text": "Echo: " + json.loads(arguments)["message"]}]}
        return {"op": "tool_result", "error": {"kind": "denied", "message": "the policy says no"}}

spec = importlib.util.spec_from_file_location("tools", PATH)
tools = importlib.util.module_from_spec(spec)
tools._channel = Channel()
sys.modules["tools"] = tools
spec.loader.exec_module(tools)
exec(sys.argv[3])
`

func TestToolsModuleOnEveryPython(t *testing.T) {
	pythons := map[string]string{}
	if _, err := os.Stat(systemPython); err == nil {
		pythons["system"] = systemPython
	}
	paths, _ := filepath.Glob("/root/.pyenv/versions/3.*/bin/python3")
	for _, p := range paths {
		pythons[filepath.Base(filepath.Dir(filepath.Dir(p)))] = p
	}
	for _, v := range []string{"3.6", "3.13"} {
		found := false
		for name := range pythons {
			found = found || strings.HasPrefix(name, v+".")
		}
		if !found {
			t.Logf("no Python %s to test the module with", v)
		}
	}
	f := newFakeTools()
	catalog, err := json.Marshal(ToolCatalog{Tools: f.specs, Servers: f.servers})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, ToolsFile)
	if err := os.WriteFile(path, ToolsSource, 0o444); err != nil {
		t.Fatal(err)
	}
	code := `
import asyncio, inspect, pydoc
out = [str(inspect.signature(tools.everything.get_sum)).replace(" ", ""), tools.everything.echo(message="hi")]
for f, kw in ((tools.everything.get_sum, {"a": "x", "b": 1}), (tools.everything.fail, {"kind": "x"}), (tools.everything.args, {"count": 1, "nope": 2})):
    try:
        f(**kw)
    except tools.ToolError as e:
        out.append("%s: %s" % (type(e).__name__, e))
out.append("Returns the sum" in pydoc.render_doc(tools.everything.get_sum, renderer=pydoc.plaintext))
async def both():
    return await asyncio.gather(tools.everything.echo.acall(message="a"), tools.acall("everything.echo", message="b"))
out.append(asyncio.new_event_loop().run_until_complete(both()))
out.append(tools.list("my-*"))
out.append(tools._channel.sent[1])
print(json.dumps(out))
`
	// (3.6 writes signatures without spaces.)
	want := `["(*,a:float,b:float)->dict", "Echo: hi",
		"ToolArgumentError: everything.get-sum: argument 'a': expected number, got str",
		"ToolDenied: everything.fail: the policy says no",
		"ToolArgumentError: everything.args: unexpected argument 'nope'; it takes choice, class_, count, filter, id, max_results, mode, ratio, ref, tags, when",
		true, ["Echo: a", "Echo: b"], ["my-server.class", "my-server.get-item", "my-server.get_item"],
		[{"op": "tool_call", "name": "everything.echo"}, {"message": "hi"}]]`
	for name, python := range pythons {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			out, err := exec.Command(python, "-I", "-c", moduleHarness, path, string(catalog), code).CombinedOutput()
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			jsonEqual(t, bytes.TrimSpace(out), want)
		})
	}
}

// BenchmarkToolCallRoundTrip is one tool call from Python code to a Tools
// that answers at once, and back, in a session's run; x_python3 is its
// ratio to spawning python3 -c pass.
func BenchmarkToolCallRoundTrip(b *testing.B) {
	if _, err := os.Stat(systemPython); err != nil {
		b.Skip(err)
	}
	base := testutil.SpawnBaseline(b)
	conn := startBenchWorker(b, systemPython)
	f := newFakeTools()
	ctx := context.Background()
	// The module's import and the catalog are not part of a call.
	if res, err := conn.Run(ctx, Request{Tools: f, Code: "import tools\ntools.everything.echo(message='warm')"}); err != nil || res.Status != "success" {
		b.Fatalf("%+v %v", res, err)
	}
	code := "for i in range(n):\n    tools.everything.echo(message='x')"
	b.ResetTimer()
	start := time.Now()
	res, err := conn.Run(ctx, Request{Tools: f, Code: code, Inputs: map[string]json.RawMessage{"n": json.RawMessage(strconv.Itoa(b.N))}})
	el := time.Since(start)
	b.StopTimer()
	if err != nil || res.Status != "success" {
		b.Fatalf("%+v %v", res, err)
	}
	b.ReportMetric(float64(el)/float64(b.N)/float64(base), "x_python3")
	b.Logf("python3 -c pass: %v", base)
}

// startBenchWorker starts a session worker with the tools module, its
// output discarded.
func startBenchWorker(b *testing.B, python string) *Conn {
	dir := b.TempDir()
	for name, data := range map[string][]byte{"worker.py": Source, ToolsFile: ToolsSource} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o444); err != nil {
			b.Fatal(err)
		}
	}
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	parent, child := os.NewFile(uintptr(fds[0]), "parent"), os.NewFile(uintptr(fds[1]), "child")
	nc, err := net.FileConn(parent)
	parent.Close()
	if err != nil {
		b.Fatal(err)
	}
	argv := Command(python, filepath.Join(dir, "worker.py"), false)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.ExtraFiles = []*os.File{child}
	err = cmd.Start()
	child.Close()
	if err != nil {
		b.Fatal(err)
	}
	conn := NewConn(nc)
	b.Cleanup(func() {
		conn.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	return conn
}
