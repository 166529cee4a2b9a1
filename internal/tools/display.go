package tools

import (
	"encoding/base64"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// displayContent turns a run's rich outputs into MCP content within room
// bytes (as encoded): raster images as image content, SVG, HTML, Markdown,
// JSON and LaTeX as embedded resources with their MIME type, and always a
// text fallback first. What does not fit is named in a text note instead.
func displayContent(res *RunPythonOutput, room int64) []mcp.Content {
	var out []mcp.Content
	for i, d := range res.Displays {
		n := i + 1
		// The text fallback fits too (at worst six bytes a byte as JSON),
		// cut when it must be; without room, the display is named only.
		text := d.Text
		if limit := (room - 256) / 6; int64(len(text)) > limit {
			if limit < 64 {
				out = append(out, &mcp.TextContent{Text: fmt.Sprintf("display %d was left out: the reply is at the server's limit", n)})
				room -= 128
				continue
			}
			text = cutAt(text, int(limit)) + " [cut to fit the reply limit]"
		}
		out = append(out, &mcp.TextContent{Text: fmt.Sprintf("display %d: %s", n, text)})
		room -= int64(len(text))*6 + 64
		for _, mime := range d.MIMETypes {
			data := d.Data[mime]
			size := int64(len(data))*6 + 256 // worst-case JSON escaping of text
			if engineBinary(mime) {
				size = int64(len(data)) + 256 // base64 already
			}
			if size > room {
				out = append(out, &mcp.TextContent{Text: fmt.Sprintf("display %d as %s (%d bytes) was left out: it does not fit the server's reply limit", n, mime, len(data))})
				continue
			}
			room -= size
			if engineBinary(mime) {
				raw, err := base64.StdEncoding.DecodeString(data)
				if err != nil {
					continue
				}
				out = append(out, &mcp.ImageContent{Data: raw, MIMEType: mime})
				continue
			}
			out = append(out, &mcp.EmbeddedResource{Resource: &mcp.ResourceContents{
				URI: fmt.Sprintf("pysandbox://display/%d", n), MIMEType: mime, Text: data}})
		}
	}
	if res.DisplaysOmitted > 0 {
		out = append(out, &mcp.TextContent{Text: fmt.Sprintf("%d more displays were left out (at most 32 a run, 4 MiB together)", res.DisplaysOmitted)})
	}
	return out
}

// engineBinary: the types whose data is base64 (raster images).
func engineBinary(mime string) bool { return mime == "image/png" || mime == "image/jpeg" }
