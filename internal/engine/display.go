package engine

import (
	"sort"

	"github.com/pysandbox/pysandbox/internal/worker"
)

// Display is one rich output of a run (display(obj), or the last
// expression's rich representation): its text fallback and the MIME types
// it also has. The data goes to the client as content, not as JSON.
type Display struct {
	// Text is the text fallback (text/plain), whole in the content; the
	// structured result carries its first bytes (Preview).
	Text      string   `json:"-"`
	Preview   string   `json:"text"`
	MIMETypes []string `json:"mime_types"`
	// Data maps each MIME type but text/plain to its data (base64 for
	// images, text otherwise), as the worker sent it.
	Data map[string]string `json:"-"`
}

// maxPreview bounds a display's text in the structured result.
const maxPreview = 256

// displaysOf turns a worker's displays into the result's.
func displaysOf(ds []worker.Display) []Display {
	var out []Display
	for _, d := range ds {
		x := Display{Text: d.Data["text/plain"], Data: map[string]string{}}
		x.Preview = x.Text
		if len(x.Preview) > maxPreview {
			x.Preview = Head(x.Preview, maxPreview) + "…"
		}
		for mime, v := range d.Data {
			if mime != "text/plain" {
				x.Data[mime] = v
				x.MIMETypes = append(x.MIMETypes, mime)
			}
		}
		sort.Strings(x.MIMETypes)
		out = append(out, x)
	}
	return out
}
