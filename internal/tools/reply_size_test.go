package tools

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/engine"
)

// replyCases are the runs issue 28 measured: what each costs on the wire,
// and in each channel a client may give its model.
var replyCases = []struct{ name, code string }{
	{"5 MB print", `print("x" * 5_000_000)`},
	{"200000-line print", "for i in range(200_000):\n    print(i)"},
	{"DataFrame last expression", "import pandas as pd\npd.DataFrame({'x': range(1000), 'y': ['<b>&'] * 1000})"},
	{"PIL image repr", "from PIL import Image\nImage.new('RGB', (20, 10), 'red')"},
}

// replyParts measures a result: on the wire, its text content, its
// structured content, and the text content the spec's SHOULD (the
// structured content serialized into a text block) would be.
func replyParts(t *testing.T, res *mcp.CallToolResult) (wire, textLen, structured, specText int) {
	t.Helper()
	wire = replySize(t, res)
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b, _ := json.Marshal(tc.Text)
			textLen += len(b)
		}
	}
	sb, _ := json.Marshal(res.StructuredContent)
	structured = len(sb)
	tb, _ := json.Marshal(string(sb))
	specText = len(tb)
	return
}

// TestReplySizes: by default every reply of replyCases fits the default
// budget on the wire; the sizes are logged (go test -v -run ReplySizes).
func TestReplySizes(t *testing.T) {
	// The engine's default capture (1 MiB a stream), as serve has it.
	cs := connect(t, func(c *engine.Config) { c.MaxOutput = 1 << 20 })
	for _, c := range replyCases {
		res, _ := call(t, cs, "run_python", map[string]any{"code": c.code, "timeout_seconds": 60})
		wire, tl, st, spec := replyParts(t, res)
		t.Logf("%-26s wire %8d  text %8d  structured %8d  (text as serialized JSON would be %8d)", c.name, wire, tl, st, spec)
		if wire > 100_000 {
			t.Errorf("%s: %d bytes on the wire, over 100000", c.name, wire)
		}
		if strings.Contains(text(res), `\u003c`) {
			t.Errorf("%s: escaped text: %.300s", c.name, text(res))
		}
	}
}

// TestReplyShowsOnce: text shows <, > and & as they are, a DataFrame's
// table once (and its HTML once, as a resource whose URI reads back).
func TestReplyShowsOnce(t *testing.T) {
	cs := connect(t, nil)
	res, _ := call(t, cs, "run_python", map[string]any{"code": replyCases[2].code})
	all := text(res)
	if n := strings.Count(all, "995  995  <b>&"); n != 1 || strings.Contains(all, `\u003c`) {
		t.Errorf("the table is in the text %d times: %.2000s", n, all)
	}
	var html []string
	for _, c := range res.Content {
		if r, ok := c.(*mcp.EmbeddedResource); ok && r.Resource.MIMEType == "text/html" {
			html = append(html, r.Resource.URI)
		}
	}
	if len(html) != 1 {
		t.Fatalf("%d HTML resources", len(html))
	}
	rr, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: html[0]})
	if err != nil || len(rr.Contents) != 1 || !strings.Contains(rr.Contents[0].Text, "<table") {
		t.Fatalf("reading %s: %v", html[0], err)
	}
	// The next run's display has a URI of its own; the first still reads.
	res2, _ := call(t, cs, "run_python", map[string]any{"code": replyCases[2].code})
	for _, c := range res2.Content {
		if r, ok := c.(*mcp.EmbeddedResource); ok && r.Resource.URI == html[0] {
			t.Errorf("two runs share the display URI %s", html[0])
		}
	}
	if _, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: html[0]}); err != nil {
		t.Errorf("the first run's display after another run: %v", err)
	}
	res, _ = call(t, cs, "run_python", map[string]any{"code": replyCases[3].code})
	if all := text(res); !strings.Contains(all, "<PIL.Image.Image image mode=RGB size=20x10") || strings.Count(all, "<PIL.Image") != 1 {
		t.Errorf("the PIL image's repr: %s", all)
	}
}

// TestWholeOutputReadable: a cut stream's whole (as captured) is a
// resource of the caller's for a one-shot run and a file of the session
// for a session run; the reply names it and says what the capture lost.
func TestWholeOutputReadable(t *testing.T) {
	cs := connectWith(t, func(c *engine.Config) { c.MaxOutput = 1 << 20 }, func(o *Options) { o.MaxStreamReplyBytes = 4000 })
	code := "print('head'); print('x' * 3_000_000); print('tail')"
	res, out := call(t, cs, "run_python", map[string]any{"code": code})
	stdout, _ := out["stdout"].(string)
	uri, _ := out["stdout_uri"].(string)
	if !strings.HasPrefix(stdout, "head\n") || !strings.HasSuffix(stdout, "tail\n") || len(stdout) > 4200 || !strings.HasPrefix(uri, outputPrefix) {
		t.Fatalf("stdout of %d bytes, uri %q", len(stdout), uri)
	}
	msg, _ := out["message"].(string)
	// How much was printed, not only what the server captured of it.
	if !strings.Contains(msg, uri) || !strings.Contains(msg, "the 3000011 bytes the run printed (--max-output)") || !strings.Contains(text(res), uri) {
		t.Errorf("the message: %q", msg)
	}
	rr, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: uri})
	if err != nil {
		t.Fatal(err)
	}
	whole := rr.Contents[0].Text
	if len(whole) < 1<<20 || len(whole) > 1<<20+200 || !strings.HasPrefix(whole, "head\n") || !strings.Contains(whole, "bytes of output truncated") {
		t.Errorf("the whole output: %d bytes, %.40q", len(whole), whole)
	}

	id := newSession(t, cs)
	_, out = call(t, cs, "run_python", map[string]any{"session_id": id, "code": "print('<&>' * 100_000)"})
	uri, _ = out["stdout_uri"].(string)
	if !strings.HasPrefix(uri, filePrefix) || !strings.Contains(uri, "run-") {
		t.Fatalf("session stdout_uri %q, message %q", uri, out["message"])
	}
	rr, err = cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: uri})
	if err != nil || len(rr.Contents) != 1 {
		t.Fatalf("reading %s: %v", uri, err)
	}
	if got := rr.Contents[0].Text + string(rr.Contents[0].Blob); got != strings.Repeat("<&>", 100_000)+"\n" {
		t.Errorf("the session's output file: %d bytes", len(got))
	}
	_, out = call(t, cs, "run_python", map[string]any{"session_id": id, "code": "import glob; sorted(glob.glob('/work/.pysandbox/output/*'))"})
	if files, _ := out["return_value"].([]any); len(files) != 1 {
		t.Errorf("the session's output files: %v", out["return_value"])
	}
}

// TestCappedReturnValue: a value larger than a run returns comes as the
// start of its repr, and the message says so, how to get the whole, and
// never calls what the server has "all of it".
func TestCappedReturnValue(t *testing.T) {
	cs := connect(t, nil)
	res, out := call(t, cs, "run_python", map[string]any{"code": "list(range(100000))"})
	msg := fmt.Sprint(out["message"])
	if res.IsError || !strings.Contains(msg, "larger than a run returns") || !strings.Contains(msg, "write it to a file") || strings.Contains(msg, "all of it") {
		t.Errorf("message %q", msg)
	}
	// A large value that was not cut keeps "all of it".
	_, out = call(t, cs, "run_python", map[string]any{"code": "'z' * 30000"})
	if msg := fmt.Sprint(out["message"]); !strings.Contains(msg, "all of it") || strings.Contains(msg, "larger than a run returns") {
		t.Errorf("an uncut value: %q", msg)
	}
}
