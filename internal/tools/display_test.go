package tools

import (
	"bytes"
	"context"
	"image/png"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

const richCode = `from PIL import Image
import io
import pandas as pd
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

display(Image.new("RGB", (20, 10), "red"))

class SVG:
    def __init__(self, data): self.data = data
    def _repr_svg_(self): return self.data

fig, ax = plt.subplots()
ax.plot([1, 2, 3])
buf = io.StringIO()
fig.savefig(buf, format="svg")
plt.close(fig)
display(SVG(buf.getvalue()))

class Note:
    def _repr_markdown_(self): return "# Title\n*it*"
    def _repr_json_(self): return {"a": [1, 2]}
    def __repr__(self): return "Note()"
display(Note())
pd.DataFrame({"x": [1, 2], "y": ["<b>", "c"]})
`

// TestRichOutputs: display() and the last expression's rich repr, with
// real objects (a PIL image, matplotlib's SVG, pandas' HTML), become MCP
// content: an image, embedded resources with their MIME types, and a text
// fallback for each; a DataFrame keeps its text table.
func TestRichOutputs(t *testing.T) {
	cs := connect(t, nil)
	for _, session := range []bool{false, true} {
		args := map[string]any{"code": richCode}
		if session {
			_, out := call(t, cs, "create_session", nil)
			args["session_id"] = out["session_id"]
		}
		res, out := call(t, cs, "run_python", args)
		if res.IsError {
			t.Fatalf("%s", text(res))
		}
		var images, svg, html, md, js, fallbacks int
		for _, c := range res.Content {
			switch c := c.(type) {
			case *mcp.ImageContent:
				if c.MIMEType == "image/png" {
					img, err := png.Decode(bytes.NewReader(c.Data))
					if err == nil && img.Bounds().Dx() == 20 && img.Bounds().Dy() == 10 {
						images++
					}
				}
			case *mcp.EmbeddedResource:
				r := c.Resource
				switch {
				case r.MIMEType == "image/svg+xml" && strings.Contains(r.Text, "<svg"):
					svg++
				case r.MIMEType == "text/html" && strings.Contains(r.Text, "<table") && strings.Contains(r.Text, "&lt;b&gt;"):
					html++
				case r.MIMEType == "text/markdown" && strings.HasPrefix(r.Text, "# Title"):
					md++
				case r.MIMEType == "application/json" && strings.Contains(r.Text, `"a": [1, 2]`):
					js++
				}
			case *mcp.TextContent:
				if strings.HasPrefix(c.Text, "display ") {
					fallbacks++
				}
			}
		}
		if images != 1 || svg != 1 || html != 1 || md != 1 || js != 1 || fallbacks != 4 {
			t.Errorf("session %v: %d images, %d svg, %d html, %d markdown, %d json, %d text fallbacks", session, images, svg, html, md, js, fallbacks)
		}
		if rt, _ := out["return_text"].(string); !strings.Contains(rt, "<b>") {
			t.Errorf("the DataFrame's text table: %q", rt)
		}
		if ds, _ := out["displays"].([]any); len(ds) != 4 {
			t.Errorf("structured displays: %v", out["displays"])
		}
	}
}

// TestRichOutputsBounded: many displays are bounded, with a note; one
// with a broken repr still shows its text.
func TestRichOutputsBounded(t *testing.T) {
	cs := connect(t, nil)
	code := "class Bad:\n    def _repr_html_(self): raise ValueError('no')\n    def __repr__(self): return 'Bad()'\n" +
		"display(Bad())\nfor i in range(100): display({'i': i})\n"
	res, _ := call(t, cs, "run_python", map[string]any{"code": code})
	all := text(res)
	if res.IsError || !strings.Contains(all, "display 1: Bad()") || !strings.Contains(all, "69 more displays were left out") {
		t.Errorf("%s", all)
	}
	res, _ = call(t, cs, "run_python", map[string]any{"code": "display(1)"})
	if !strings.Contains(text(res), "display 1: 1") {
		t.Errorf("a display in the next run: %s", text(res))
	}
	_ = context.Background
}

// TestRichOutputsWithinReplyLimit: displays whose text is all '<' (six
// bytes each as JSON), legitimate or forged by code that rewrites the
// worker's own list, never make a reply larger than the server's limit.
func TestRichOutputsWithinReplyLimit(t *testing.T) {
	cs := connect(t, nil)
	for name, code := range map[string]string{
		"many":   "class X:\n    def __repr__(self): return '<' * 65000\n    def _repr_html_(self): return '<b>x</b>'\nfor i in range(40): display(X())\n",
		"forged": "g = display.__globals__\nfor i in range(8):\n    g['_displays'].append({'data': {'text/plain': '<' * (1 << 20)}})\n",
	} {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": code}})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		size := encodedLen(res)
		if size > DefaultMaxReply {
			t.Errorf("%s: a reply of %d bytes, over the %d-byte limit", name, size, DefaultMaxReply)
		}
		t.Logf("%s: %d bytes, isError %v, %.200s", name, size, res.IsError, text(res))
	}
}
