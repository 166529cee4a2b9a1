package tools

import (
	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/worker"
)

// RunPythonOutput is run_python's structured result: an engine.Result as
// it goes on the wire (see runPythonOutput), with what this layer measured
// of the run besides (its network, its tool calls) and what it made of it
// for the reply (figure links, output cut to the reply limit).
type RunPythonOutput struct {
	Status   engine.Status `json:"status"`
	ExitCode int           `json:"exit_code" jsonschema:"the exit status of the code; -1 when it never reached an exit of its own: refused before it ran, cancelled or timed out"`
	Stdout   string        `json:"stdout"`
	Stderr   string        `json:"stderr"`
	// ReturnValue is the last expression's value (null when none): decoded
	// JSON, or its repr() string when it was not JSON-able.
	ReturnValue     any  `json:"return_value" jsonschema:"the value of the last expression as JSON, its repr() when not JSON-serialisable, or null"`
	StdoutTruncated bool `json:"stdout_truncated"`
	StderrTruncated bool `json:"stderr_truncated"`
	// printed are the streams' sizes as the run printed them, for the
	// reply's note on what was cut.
	printed    [2]int64
	DurationMS int64 `json:"duration_ms"`
	// StdoutURI and StderrURI are where the whole stream (as captured)
	// can be read when the reply shows only its head and tail: a session
	// file, or a resource of the caller's for a one-shot run.
	StdoutURI string `json:"stdout_uri,omitempty" jsonschema:"where the whole stdout, as the server captured it, can be read (resources/read) when this reply shows only its head and tail"`
	StderrURI string `json:"stderr_uri,omitempty" jsonschema:"where the whole stderr, as the server captured it, can be read (resources/read) when this reply shows only its head and tail"`
	// ReturnTruncated: return_value was too large for the reply and is
	// the head and tail of its JSON (or repr) text; ReturnURI has it all.
	ReturnTruncated bool   `json:"return_value_truncated,omitempty"`
	ReturnURI       string `json:"return_value_uri,omitempty" jsonschema:"where the whole return value can be read when return_value_truncated"`
	// Error names the exception that ended the run, when there was one.
	Error *worker.Exception `json:"error,omitempty"`
	// Message explains a non-success status in words an agent can act on.
	Message string `json:"message,omitempty"`
	// Resumed, when the call found its session paused and resumed it
	// first, says what came back and what did not.
	Resumed string `json:"resumed,omitempty" jsonschema:"set when the session was paused (by pause_session or a server restart) and this call resumed it: what was restored and what was not"`
	// Sandbox is the backend that ran the code; "none" means unsandboxed.
	Sandbox string `json:"sandbox"`
	// Figures are the matplotlib figures the run left open, as PNG.
	Figures []Figure `json:"figures,omitempty"`
	// FiguresOmitted counts the open figures beyond the most a run returns.
	FiguresOmitted int `json:"figures_omitted,omitempty"`
	// ReturnText is a text rendering of a pandas return value.
	ReturnText string `json:"return_text,omitempty"`
	// Displays are the run's rich outputs (display(), rich reprs); their
	// data is content (images, embedded resources), not JSON.
	Displays        []Display `json:"displays,omitempty"`
	DisplaysOmitted int       `json:"displays_omitted,omitempty"`
	// Resource use, for the audit trail.
	PeakMemoryBytes int64 `json:"peak_memory_bytes,omitempty"`
	CPUTimeMS       int64 `json:"cpu_time_ms,omitempty"`
	// Network is what the run did through the network proxy; nil when it
	// had no network.
	Network *NetUsage `json:"network,omitempty"`
	// ToolCalls is what the run did through upstream tools; nil when it
	// had none to call.
	ToolCalls *ToolUsage `json:"tool_calls,omitempty"`
}

// Figure is one matplotlib figure of a run, as run_python returns it.
type Figure struct {
	Width    int  `json:"width"`
	Height   int  `json:"height"`
	Bytes    int  `json:"bytes"`
	TooLarge bool `json:"too_large,omitempty"`
	// URI is where a figure too large to inline can be read (resources/read).
	URI string `json:"uri,omitempty"`
	// PNG is the image; it goes as image content, not as JSON.
	PNG []byte `json:"-"`
}

// Display is one rich output of a run: its text fallback and the MIME
// types it also has. The data goes to the client as content, not as JSON.
type Display struct {
	// Text is the text fallback (text/plain), whole in the content; the
	// structured result carries its first bytes (Preview).
	Text      string   `json:"-"`
	Preview   string   `json:"text"`
	MIMETypes []string `json:"mime_types"`
	// URIs name where each MIME type's data can be read (resources/read),
	// but for images that go inline.
	URIs map[string]string `json:"uris,omitempty" jsonschema:"where each rich form of the display can be read (resources/read), by MIME type"`
	// Data maps each MIME type but text/plain to its data (base64 for
	// images, text otherwise).
	Data map[string]string `json:"-"`
	// Source is the display's Markdown, HTML, JSON, LaTeX or SVG source
	// (the first of them it has), its head when long: clients that give
	// the model only the structured result show it this, not a repr.
	Source     string `json:"source,omitempty" jsonschema:"the display's Markdown, HTML, JSON, LaTeX or SVG source (its head when long; the whole is at uris)"`
	SourceType string `json:"source_type,omitempty" jsonschema:"the MIME type of source"`
}

// sourceTypes are the display forms a model can read as text, best first.
var sourceTypes = []string{"text/markdown", "text/html", "application/json", "text/latex", "image/svg+xml"}

// maxSource bounds a display's source in the structured result.
const maxSource = 4000

// maxPreview bounds a display's text in the structured result.
const maxPreview = 256

// ToolUsage is a run's use of upstream tools.
type ToolUsage struct {
	Calls     int      `json:"calls"`
	Refused   int      `json:"refused,omitempty"`
	BytesOut  int64    `json:"bytes_out"` // arguments sent
	BytesIn   int64    `json:"bytes_in"`  // results received
	LimitsHit []string `json:"limits_hit,omitempty"`
}

// NetUsage is a run's use of the network proxy.
type NetUsage struct {
	Connections int      `json:"connections"`
	Refused     int      `json:"refused,omitempty"`
	BytesIn     int64    `json:"bytes_in"`
	BytesOut    int64    `json:"bytes_out"`
	LimitsHit   []string `json:"limits_hit,omitempty"`
}

// runUsage is what this layer measured of a run besides the engine.
type runUsage struct {
	network   *NetUsage
	toolCalls *ToolUsage
	// resumed says what came back when the call resumed a paused session.
	resumed string
}

// runPythonOutput is the one conversion of an engine.Result to what
// run_python returns. The result's slices are copied, so the reply may
// change the output (cut it, link its figures) without touching r.
func runPythonOutput(r *engine.Result, use runUsage) *RunPythonOutput {
	out := &RunPythonOutput{
		Status:          r.Status,
		ExitCode:        r.ExitCode,
		Stdout:          r.Stdout,
		Stderr:          r.Stderr,
		ReturnValue:     r.ReturnValue,
		StdoutTruncated: r.StdoutTruncated,
		printed:         [2]int64{r.StdoutBytes, r.StderrBytes},
		StderrTruncated: r.StderrTruncated,
		DurationMS:      r.DurationMS,
		Error:           r.Error,
		Message:         r.Message,
		Sandbox:         r.Sandbox,
		ReturnText:      r.ReturnText,
		DisplaysOmitted: r.DisplaysOmitted,
		FiguresOmitted:  r.FiguresOmitted,
		PeakMemoryBytes: r.PeakMemoryBytes,
		CPUTimeMS:       r.CPUTimeMS,
		Network:         use.network,
		ToolCalls:       use.toolCalls,
		Resumed:         use.resumed,
	}
	for _, f := range r.Figures {
		out.Figures = append(out.Figures, Figure{Width: f.Width, Height: f.Height, Bytes: f.Bytes, TooLarge: f.TooLarge, PNG: f.PNG})
	}
	for _, d := range r.Displays {
		x := Display{Text: d.Text, Preview: d.Text, MIMETypes: d.MIMETypes, Data: d.Data}
		for _, t := range sourceTypes {
			if src, ok := d.Data[t]; ok {
				x.Source, x.SourceType = src, t
				if len(src) > maxSource {
					x.Source = engine.Head(src, maxSource) + "…"
				}
				break
			}
		}
		if len(x.Preview) > maxPreview {
			x.Preview = engine.Head(x.Preview, maxPreview) + "…"
		}
		out.Displays = append(out.Displays, x)
	}
	return out
}
