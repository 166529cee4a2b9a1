package engine

import (
	"sort"

	"github.com/pysandbox/pysandbox/internal/worker"
)

// Display is one rich output of a run (display(obj), or the last
// expression's rich representation): its text fallback and the MIME types
// it also has.
type Display struct {
	// Text is the text fallback (text/plain).
	Text      string
	MIMETypes []string
	// Data maps each MIME type but text/plain to its data (base64 for
	// images, text otherwise), as the worker sent it.
	Data map[string]string
}

// displaysOf turns a worker's displays into the result's.
func displaysOf(ds []worker.Display) []Display {
	var out []Display
	for _, d := range ds {
		x := Display{Text: d.Data["text/plain"], Data: map[string]string{}}
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
