package tools

import (
	"bytes"
	"image/png"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ipythonCode displays through the IPython shim: HTML, Markdown, SVG,
// JSON, an Image from bytes and one from a file, a raw MIME bundle, and
// clear_output; IPython.get_ipython() is None, as outside a shell.
const ipythonCode = `import base64, struct, zlib
import IPython
from IPython.display import display, HTML, Markdown, Image, SVG, JSON, clear_output
from IPython.core.display import Latex

def tiny_png(w, h):
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xffffffff)
    raw = b"".join(b"\x00" + b"\xff\x00\x00" * w for _ in range(h))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))

open("dot.png", "wb").write(tiny_png(3, 2))
assert IPython.get_ipython() is None
clear_output(wait=True)
display(HTML("<b>bold</b>"), Markdown("# Title"))
display(SVG('<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"></svg>'))
display(JSON({"a": [1, 2]}))
display(Image(data=tiny_png(5, 4)))
display(Image(filename="dot.png"))
display({"text/plain": "raw!", "text/html": "<i>raw</i>"}, raw=True)
Latex(r"$x^2$")
`

// TestIPythonDisplayShim: without IPython installed, code written for a
// notebook imports IPython.display and its objects come back as the
// rich outputs they stand for, in a one-shot run and in a session.
func TestIPythonDisplayShim(t *testing.T) {
	cs := connect(t, nil)
	for _, session := range []bool{false, true} {
		args := map[string]any{"code": ipythonCode}
		if session {
			_, out := call(t, cs, "create_session", nil)
			args["session_id"] = out["session_id"]
		}
		res, out := call(t, cs, "run_python", args)
		if res.IsError {
			t.Fatalf("session %v: %s", session, text(res))
		}
		got := map[string]int{}
		for _, c := range res.Content {
			switch c := c.(type) {
			case *mcp.ImageContent:
				if img, err := png.Decode(bytes.NewReader(c.Data)); err == nil {
					got[c.MIMEType+" "+img.Bounds().Size().String()]++
				}
			case *mcp.EmbeddedResource:
				r := c.Resource
				switch {
				case r.MIMEType == "text/html" && r.Text == "<b>bold</b>",
					r.MIMEType == "text/html" && r.Text == "<i>raw</i>",
					r.MIMEType == "text/markdown" && r.Text == "# Title",
					r.MIMEType == "image/svg+xml" && strings.HasPrefix(r.Text, "<svg"),
					r.MIMEType == "application/json" && r.Text == `{"a": [1, 2]}`,
					r.MIMEType == "text/latex" && r.Text == "$x^2$":
					got[r.MIMEType+" "+r.Text[:2]]++
				default:
					t.Errorf("session %v: unexpected %s: %q", session, r.MIMEType, r.Text)
				}
			case *mcp.TextContent:
				if strings.HasPrefix(c.Text, "display ") {
					got["text"]++
				}
			}
		}
		want := map[string]int{"image/png (5,4)": 1, "image/png (3,2)": 1, "text/html <b": 1, "text/html <i": 1,
			"text/markdown # ": 1, "image/svg+xml <s": 1, "application/json {\"": 1, "text/latex $x": 1, "text": 8}
		for k, n := range want {
			if got[k] != n {
				t.Errorf("session %v: %d of %s, want %d (all: %v)", session, got[k], k, n, got)
			}
		}
		if ds, _ := out["displays"].([]any); len(ds) != 8 {
			t.Errorf("session %v: %d structured displays", session, len(ds))
		}
	}
	// A module of the user's named IPython wins over the shim.
	_, out := call(t, cs, "create_session", nil)
	id := out["session_id"]
	res, out := call(t, cs, "run_python", map[string]any{"session_id": id, "code": "import os\nos.makedirs('IPython', exist_ok=True)\nopen('IPython/__init__.py', 'w').write('MINE = 1\\n')\nimport IPython\nIPython.MINE"})
	if res.IsError || out["return_value"] != 1.0 {
		t.Errorf("a real IPython package: %s", text(res))
	}
}
