package tools

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/engine"
)

// outputSchemas resolves every tool's output schema, as a client would
// validate structured results against them.
func outputSchemas(t *testing.T, cs *mcp.ClientSession) map[string]*jsonschema.Resolved {
	t.Helper()
	list, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*jsonschema.Resolved{}
	for _, tool := range list.Tools {
		if tool.OutputSchema == nil {
			continue
		}
		raw, _ := json.Marshal(tool.OutputSchema)
		var s jsonschema.Schema
		if err := json.Unmarshal(raw, &s); err != nil {
			t.Fatal(err)
		}
		r, err := s.Resolve(nil)
		if err != nil {
			t.Fatalf("%s: %v", tool.Name, err)
		}
		out[tool.Name] = r
	}
	return out
}

// TestRefusedCallsSayWhatHappened: a call refused before anything ran has
// a structured result whose status says so (never a "run" with status ""
// and exit code 0), with the message, valid against the tool's schema.
func TestRefusedCallsSayWhatHappened(t *testing.T) {
	cs := connect(t, nil)
	schemas := outputSchemas(t, cs)
	for _, tc := range []struct {
		tool   string
		args   map[string]any
		status string
	}{
		{"run_python", map[string]any{"code": "1", "python_version": "3.6"}, "invalid_request"},
		{"run_python", map[string]any{"code": "  "}, "invalid_request"},
		{"run_python", map[string]any{"code": "1", "timeout_seconds": 1e9}, "invalid_request"},
		{"run_python", map[string]any{"code": "1", "session_id": "s-nosuch"}, "invalid_request"},
		{"create_session", map[string]any{"ttl_seconds": -1}, "invalid_request"},
		{"close_session", map[string]any{"session_id": "s-nosuch"}, "invalid_request"},
		{"download_file", map[string]any{"session_id": "s-nosuch", "path": "x"}, "invalid_request"},
		{"list_files", map[string]any{"session_id": "s-nosuch"}, "invalid_request"},
		{"validate_script", map[string]any{"code": ""}, "invalid_request"},
	} {
		res, out := call(t, cs, tc.tool, tc.args)
		if !res.IsError {
			t.Errorf("%s %v: not an error", tc.tool, tc.args)
			continue
		}
		if out["status"] != tc.status || out["message"] == "" || out["message"] == nil {
			t.Errorf("%s %v: structured %v, want status %q and a message", tc.tool, tc.args, out, tc.status)
		}
		if !strings.Contains(text(res), out["message"].(string)) {
			t.Errorf("%s: text %q does not carry the message %q", tc.tool, text(res), out["message"])
		}
		if r := schemas[tc.tool]; r != nil {
			if err := r.Validate(res.StructuredContent); err != nil {
				t.Errorf("%s: refusal does not validate against the output schema: %v\n%v", tc.tool, err, out)
			}
		}
		if res.Meta["pysandbox/refusal"] != nil {
			t.Errorf("%s: the old internal refusal key reached the wire: %v", tc.tool, res.Meta)
		}
	}
}

// TestReplyBounded: a run that leaves 16 large figures open, and one that
// prints a megabyte of '<' (six bytes each once JSON-escaped, twice over:
// structured and text), both come back under the reply limit; figures
// that do not fit become resource links that can be read, and the message
// says what was cut.
func TestReplyBounded(t *testing.T) {
	// Small figures against a small limit: the bound is what is tested,
	// and drawing large ones under the race detector on a busy machine
	// could outlast the run's timeout.
	const limit = 256 << 10
	cs := connectWith(t, func(c *engine.Config) { c.MaxOutput = 1 << 20 }, func(o *Options) { o.MaxReplyBytes = limit })
	figs := `
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt, numpy as np
rng = np.random.default_rng(1)
for i in range(16):
    fig = plt.figure(figsize=(4, 3), dpi=50)
    plt.imshow(rng.random((150, 200)), interpolation="nearest")
`
	res, out := call(t, cs, "run_python", map[string]any{"code": figs, "timeout_seconds": 60})
	size := replySize(t, res)
	if size > limit {
		t.Errorf("16 figures: reply of %d bytes, limit %d", size, limit)
	}
	images, links := 0, []string{}
	for _, c := range res.Content {
		switch c := c.(type) {
		case *mcp.ImageContent:
			images++
		case *mcp.ResourceLink:
			links = append(links, c.URI)
		}
	}
	if images+len(links) != 16 || len(links) == 0 || !strings.Contains(out["message"].(string), "resource links") {
		t.Errorf("16 figures: %d inline, %d links, message %q", images, len(links), out["message"])
	}
	if len(links) > 0 {
		rr, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: links[0]})
		if err != nil || len(rr.Contents) != 1 || len(rr.Contents[0].Blob) == 0 {
			t.Errorf("reading %s: %v", links[0], err)
		}
	}

	const outLimit = 1 << 20
	cs = connectWith(t, func(c *engine.Config) { c.MaxOutput = 1 << 20 }, func(o *Options) { o.MaxReplyBytes = outLimit })
	res, out = call(t, cs, "run_python", map[string]any{"code": "import sys\nsys.stdout.write('<' * (1 << 20))\n'<' * 60000"})
	if size := replySize(t, res); size > outLimit {
		t.Errorf("escaped output: reply of %d bytes, limit %d", size, outLimit)
	}
	if out["stdout_truncated"] != true || !strings.Contains(out["message"].(string), "--max-reply") {
		t.Errorf("escaped output: truncated %v, message %q", out["stdout_truncated"], out["message"])
	}
	if !strings.HasPrefix(out["stdout"].(string), "<<<<") || !strings.HasSuffix(out["stdout"].(string), "<<<<") {
		t.Errorf("the head and tail of the output are not kept")
	}
}

// replySize is the size of a result as the SDK puts it on the wire.
func replySize(t *testing.T, res *mcp.CallToolResult) int {
	t.Helper()
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	return len(b)
}

// TestListAndReadBounded: hostile file names (JSON-escaped six times over)
// and control-character text cannot make list_files or a file read exceed
// the reply limit.
func TestListAndReadBounded(t *testing.T) {
	const limit = 256 << 10
	cs := connectWith(t, nil, func(o *Options) { o.MaxReplyBytes = limit })
	id := newSession(t, cs)
	call(t, cs, "run_python", map[string]any{"session_id": id, "code": "for i in range(400):\n    open('<' * 200 + str(i), 'w').close()\nopen('ctl.txt', 'w').write('\\x01' * 150000)"})
	res, out := call(t, cs, "list_files", map[string]any{"session_id": id})
	if size := replySize(t, res); size > limit || out["truncated"] != true {
		t.Errorf("list_files: %d bytes (limit %d), truncated %v", size, limit, out["truncated"])
	}
	res, _ = call(t, cs, "download_file", map[string]any{"session_id": id, "path": "ctl.txt"})
	if size := replySize(t, res); size > limit || res.IsError {
		t.Errorf("download_file of control characters: %d bytes (limit %d): %s", size, limit, text(res))
	}
}

// TestDeepInputsRefused: inputs nested deeper than Python's JSON decoder
// can follow are refused before any sandbox starts.
func TestDeepInputsRefused(t *testing.T) {
	cs := connect(t, nil)
	var v any = 1
	for range 990 {
		v = []any{v}
	}
	res, out := call(t, cs, "run_python", map[string]any{"code": "len(str(a))", "inputs": map[string]any{"a": v}})
	if !res.IsError || out["status"] != "invalid_request" || !strings.Contains(text(res), "nested") {
		t.Errorf("990-deep input: %v %s", out["status"], text(res))
	}
	shallow := []any{[]any{[]any{"x"}}}
	if res, out := call(t, cs, "run_python", map[string]any{"code": "a[0][0][0]", "inputs": map[string]any{"a": shallow}}); res.IsError || out["return_value"] != "x" {
		t.Errorf("shallow input: %s", text(res))
	}
}
