package deps

import (
	"regexp"
	"slices"
	"strings"
	"sync"
)

// output collects the installer's stdout and stderr: the first maxOutput
// bytes verbatim, the error lines, the last lines, and every line to
// progress.
type output struct {
	mu        sync.Mutex
	buf       []byte
	max       int
	truncated bool
	partial   []byte
	errLines  []string
	tail      []string
	emit      func(string)
}

func newOutput(max int, emit func(string)) *output {
	return &output{max: max, emit: emit}
}

const (
	maxErrLines  = 20
	maxTailLines = 8
	maxLineLen   = 500
	progressLen  = 200
)

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	if room := o.max - len(o.buf); room > 0 {
		o.buf = append(o.buf, p[:min(room, len(p))]...)
	}
	if len(o.buf)+len(p) > o.max {
		o.truncated = true
	}
	var lines []string
	o.partial = append(o.partial, p...)
	for {
		i := strings.IndexAny(string(o.partial), "\r\n")
		if i < 0 {
			if len(o.partial) > 4*maxLineLen {
				// A runaway line: take it as it is.
				lines = append(lines, string(o.partial))
				o.partial = o.partial[:0]
			}
			break
		}
		lines = append(lines, string(o.partial[:i]))
		o.partial = o.partial[i+1:]
	}
	var shown []string
	for _, l := range lines {
		if l = o.line(l); l != "" {
			shown = append(shown, l)
		}
	}
	o.mu.Unlock()
	if o.emit != nil {
		for _, l := range shown {
			if len(l) > progressLen {
				l = l[:progressLen] + "..."
			}
			o.emit(l)
		}
	}
	return len(p), nil
}

// credentialsRE is the user information of a URL (scheme://user:pass@):
// installers mostly mask it, but a message that quotes an index URL as
// configured would hand the operator's token to the agent.
var credentialsRE = regexp.MustCompile(`(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@'"` + "`" + `]+@`)

// line records one line and returns it trimmed ("" to skip it), without
// credentials.
func (o *output) line(l string) string {
	l = credentialsRE.ReplaceAllString(strings.TrimSpace(l), "$1")
	if l == "" {
		return ""
	}
	if len(l) > maxLineLen {
		l = l[:maxLineLen] + "..."
	}
	if msg, ok := errorLine(l); ok && len(o.errLines) < maxErrLines && !slices.Contains(o.errLines, msg) {
		o.errLines = append(o.errLines, msg)
	}
	o.tail = append(o.tail, l)
	if len(o.tail) > maxTailLines {
		o.tail = o.tail[1:]
	}
	return l
}

// errorLine recognises the installers' error lines: pip's "ERROR: ...",
// uv's "error: ..." and its "×"/"╰─▶" diagnostics.
func errorLine(l string) (string, bool) {
	for _, p := range []string{"ERROR: ", "error: "} {
		if m, ok := strings.CutPrefix(l, p); ok {
			return m, true
		}
	}
	for _, p := range []string{"× ", "╰─▶ "} {
		if m, ok := strings.CutPrefix(l, p); ok {
			return m, true
		}
	}
	return "", false
}

func (o *output) text() string {
	t, _, _ := o.result()
	return t
}

// result returns the kept output, error lines and last lines.
func (o *output) result() (string, []string, []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.partial) > 0 {
		o.line(string(o.partial))
		o.partial = nil
	}
	text := credentialsRE.ReplaceAllString(string(o.buf), "$1")
	if o.truncated {
		text += "\n[output truncated]\n"
	}
	return text, append([]string(nil), o.errLines...), append([]string(nil), o.tail...)
}
