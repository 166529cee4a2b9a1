package deps

import (
	"fmt"
	"strings"
	"testing"
)

// TestOutputBounds: whatever an installer writes, in whatever pieces,
// output keeps at most max bytes of it, the first maxErrLines distinct
// error lines, the last maxTailLines lines, each line at most maxLineLen,
// and sends every line to progress at most progressLen long.
func TestOutputBounds(t *testing.T) {
	var emitted []string
	o := newOutput(1000, func(l string) { emitted = append(emitted, l) })
	var in strings.Builder
	for i := range 50 {
		fmt.Fprintf(&in, "ERROR: problem %d\r\nline %d\n", i%30, i)
	}
	in.WriteString("ERROR: problem 0\n")              // a repeat: kept once
	in.WriteString(strings.Repeat("y", 5*maxLineLen)) // a runaway line, no newline
	data := in.String()
	for len(data) > 0 { // in odd pieces, splitting lines
		n := min(7, len(data))
		o.Write([]byte(data[:n]))
		data = data[n:]
	}
	text, errs, tail := o.result()
	if !strings.HasPrefix(text, "ERROR: problem 0\r\nline 0\n") || !strings.HasSuffix(text, "\n[output truncated]\n") || len(text) != 1000+len("\n[output truncated]\n") {
		t.Errorf("text: %d bytes, %q...", len(text), text[:40])
	}
	if len(errs) != maxErrLines || errs[0] != "problem 0" || errs[maxErrLines-1] != fmt.Sprint("problem ", maxErrLines-1) {
		t.Errorf("error lines: %v", errs)
	}
	// The runaway line is cut once it passes 4×maxLineLen unbroken, and
	// each piece shortened to maxLineLen.
	if len(tail) != maxTailLines || tail[maxTailLines-2] != strings.Repeat("y", maxLineLen)+"..." || len(tail[maxTailLines-1]) > maxLineLen+3 {
		t.Errorf("tail: %d lines, the last two %d and %d bytes", len(tail), len(tail[len(tail)-2]), len(tail[len(tail)-1]))
	}
	for _, l := range emitted {
		if len(l) > progressLen+3 {
			t.Fatalf("a progress line of %d bytes", len(l))
		}
	}
	// Every complete line, the repeat included, and the runaway's first
	// piece (the rest is still a partial line, which result keeps).
	if len(emitted) != 50*2+2 {
		t.Errorf("%d lines sent to progress, want %d", len(emitted), 50*2+2)
	}
}

// TestOutputHidesCredentials: a URL's user information never reaches the
// lines an agent reads, nor the kept text.
func TestOutputHidesCredentials(t *testing.T) {
	var emitted []string
	o := newOutput(1<<20, func(l string) { emitted = append(emitted, l) })
	o.Write([]byte("Looking in indexes: https://user:S3CRET@index.example/simple/\nerror: Failed to fetch: `https://S3CRET@index.example/simple/x/`\nplain user@example.com stays\n"))
	text, errs, tail := o.result()
	all := text + strings.Join(errs, "\n") + strings.Join(tail, "\n") + strings.Join(emitted, "\n")
	if strings.Contains(all, "S3CRET") || !strings.Contains(all, "https://index.example/simple/x/") || !strings.Contains(all, "user@example.com") {
		t.Errorf("%s", all)
	}
}
