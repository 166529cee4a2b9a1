package tools

import (
	"encoding/base64"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// displayContent turns a run's rich outputs into MCP content: raster
// images as image content within imageRoom bytes (as encoded), SVG, HTML,
// Markdown, JSON and LaTeX as embedded resources with their MIME type
// within textRoom, and a text fallback first. Each rich form is kept
// (keepDisplay) under a URI of its own, readable by owner: the embedded
// resource carries it, and a form that does not fit becomes a link to it.
// The display that is the return value (ret) is named, not repeated: the
// return value is in the text already.
func (s *server) displayContent(res *RunPythonOutput, ret int, owner string, textRoom, imageRoom int64) []mcp.Content {
	var out []mcp.Content
	for i := range res.Displays {
		d := &res.Displays[i]
		n := i + 1
		if i == ret {
			out = append(out, &mcp.TextContent{Text: fmt.Sprintf("display %d: the return value, as %s", n, strings.Join(d.MIMETypes, ", "))})
			textRoom -= 128
		} else {
			// The text fallback fits too (at worst six bytes a byte as JSON),
			// cut when it must be; without room, the display is named only.
			text := d.Text
			if limit := min((textRoom-256)/6, s.maxStream); int64(len(text)) > limit {
				if limit < 64 {
					out = append(out, &mcp.TextContent{Text: fmt.Sprintf("display %d was left out: the reply is at its text budget", n)})
					textRoom -= 128
					continue
				}
				text = cutAt(text, int(limit)) + " [cut to fit the reply limit]"
			}
			out = append(out, &mcp.TextContent{Text: fmt.Sprintf("display %d: %s", n, text)})
			textRoom -= encodedLen(text) + 64
		}
		for _, mime := range d.MIMETypes {
			data := d.Data[mime]
			raw := []byte(data)
			if engineBinary(mime) {
				var err error
				if raw, err = base64.StdEncoding.DecodeString(data); err != nil {
					continue
				}
				if size := int64(len(data)) + 256; size <= imageRoom {
					imageRoom -= size
					out = append(out, &mcp.ImageContent{Data: raw, MIMEType: mime})
					continue
				}
			}
			uri := s.keepDisplay(raw, mime, owner)
			if d.URIs == nil {
				d.URIs = map[string]string{}
			}
			d.URIs[mime] = uri
			textRoom -= int64(len(uri)) + 32 // in the structured content
			if !engineBinary(mime) {
				if size := encodedLen(data) + 256; size <= textRoom && size <= s.maxStream+256 {
					textRoom -= size
					out = append(out, &mcp.EmbeddedResource{Resource: &mcp.ResourceContents{URI: uri, MIMEType: mime, Text: data}})
					continue
				}
			}
			size := int64(len(raw))
			out = append(out, &mcp.ResourceLink{URI: uri, Name: fmt.Sprintf("display %d as %s", n, mime), MIMEType: mime, Size: &size})
			textRoom -= int64(len(uri)) + 128
		}
	}
	if res.DisplaysOmitted > 0 {
		out = append(out, &mcp.TextContent{Text: fmt.Sprintf("%d more displays were left out (at most 32 a run, 4 MiB together)", res.DisplaysOmitted)})
	}
	return out
}

// engineBinary: the types whose data is base64 (raster images).
func engineBinary(mime string) bool { return mime == "image/png" || mime == "image/jpeg" }
