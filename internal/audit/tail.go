package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf16"
	"unicode/utf8"
)

// Last returns the last n complete lines of the chain in paths (oldest
// file first), oldest line first, reading each file from its end. A
// partial last line, one still being written, is left out.
func Last(paths []string, n int) ([][]byte, error) {
	var out [][]byte
	for i := len(paths) - 1; i >= 0 && len(out) < n; i-- {
		lines, err := lastLinesOf(paths[i], n-len(out))
		if err != nil {
			return nil, err
		}
		out = append(lines, out...)
	}
	return out, nil
}

func lastLinesOf(path string, n int) ([][]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	lines, _, err := readLastLines(f, st.Size(), n)
	if err != nil {
		return nil, fmt.Errorf("audit: %s: %w", path, err)
	}
	return lines, nil
}

// Tail writes the last n records of the chain in paths to w, one Format
// line each.
func Tail(w io.Writer, paths []string, n int) error {
	lines, err := Last(paths, n)
	if err != nil {
		return err
	}
	for _, l := range lines {
		if _, err := fmt.Fprintln(w, Format(l)); err != nil {
			return err
		}
	}
	return nil
}

// pollInterval is how often Follow looks for new lines.
var pollInterval = 200 * time.Millisecond

// Follow calls fn with the last n lines of the chain ending in path, then
// with every line appended after them, until ctx is done (it then returns
// nil) or fn fails. When path is rotated away and recreated, Follow
// finishes the old file and goes on with the new one. fn must not keep
// line after it returns.
func Follow(ctx context.Context, path string, n int, fn func(line []byte) error) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	fw := &follower{f: f, fn: fn, buf: make([]byte, 64<<10)}
	defer func() { fw.f.Close() }() // the file read last, after rotations
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	// Start from one view of the end, so no line is shown twice or missed.
	lines, partial, err := readLastLines(f, st.Size(), n)
	if err != nil {
		return fmt.Errorf("audit: %s: %w", path, err)
	}
	if len(lines) < n {
		files, err := Files(path)
		if err != nil {
			return err
		}
		older, err := Last(slices.DeleteFunc(files, func(p string) bool { return p == path }), n-len(lines))
		if err != nil {
			return err
		}
		lines = append(older, lines...)
	}
	for _, l := range lines {
		if err := fn(l); err != nil {
			return err
		}
	}
	// Carry on from the end of the last complete line.
	fw.off, fw.st = st.Size()-partial, st
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	for {
		if err := fw.poll(path); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// follower reads the lines appended to f since off.
type follower struct {
	f       *os.File
	off     int64
	st      os.FileInfo // of f
	pending []byte      // a line whose end has not been written yet
	fn      func([]byte) error
	buf     []byte
}

// poll emits what was appended, following rotations: when path is no
// longer the file being read, the rest of the chain is read file by file,
// however many rotations happened since the last poll.
func (fw *follower) poll(path string) error {
	for {
		if err := fw.drain(); err != nil {
			return err
		}
		st, err := os.Stat(path)
		if err != nil || os.SameFile(st, fw.st) {
			return nil // not rotated, or not recreated yet
		}
		// Rotated: the writer finished this file before renaming it, so
		// one more read gets the rest of it.
		if err := fw.drain(); err != nil {
			return err
		}
		next, err := fw.nextFile(path)
		if err != nil || next == "" {
			return err
		}
		f, err := os.Open(next)
		if err != nil {
			return nil // gone again; try next time
		}
		if st, err = f.Stat(); err != nil {
			f.Close()
			return fmt.Errorf("audit: %w", err)
		}
		fw.f.Close()
		fw.f, fw.st, fw.off, fw.pending = f, st, 0, nil
	}
}

// nextFile returns the file of the chain after the one being read, or ""
// if there is none yet. If the current file is gone from the chain
// (removed by retention), it goes on with path itself.
func (fw *follower) nextFile(path string) (string, error) {
	files, err := Files(path)
	if err != nil {
		return "", err
	}
	for i, p := range files {
		if st, err := os.Stat(p); err == nil && os.SameFile(st, fw.st) {
			if i+1 < len(files) {
				return files[i+1], nil
			}
			return "", nil
		}
	}
	if len(files) > 0 && files[len(files)-1] == path {
		return path, nil
	}
	return "", nil
}

// drain reads f from off to its end, calling fn for each complete line.
func (fw *follower) drain() error {
	st, err := fw.f.Stat()
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	if st.Size() < fw.off {
		// Truncated in place: start over.
		fw.off, fw.pending = 0, nil
	}
	for {
		n, err := fw.f.ReadAt(fw.buf, fw.off)
		fw.off += int64(n)
		data := fw.buf[:n]
		for len(data) > 0 {
			i := bytes.IndexByte(data, '\n')
			if i < 0 {
				fw.pending = append(fw.pending, data...)
				break
			}
			line := data[:i]
			if len(fw.pending) > 0 {
				line = append(fw.pending, line...)
				fw.pending = nil
			}
			if err := fw.fn(line); err != nil {
				return err
			}
			data = data[i+1:]
		}
		if len(fw.pending) > maxLineBytes {
			return fmt.Errorf("audit: line at offset %d is longer than %d bytes", fw.off-int64(len(fw.pending)), maxLineBytes)
		}
		if err == io.EOF || n == 0 {
			return nil
		}
		if err != nil {
			return fmt.Errorf("audit: %w", err)
		}
	}
}

// Format renders one log line for a terminal. Every string from the log
// is quoted when it holds anything but plain printable ASCII, so hostile
// code or arguments cannot send escape sequences to the terminal. Format
// does not check hashes: that is Verify's job.
func Format(line []byte) string {
	r, _, err := parseLine(line)
	edited := err == errEdited && r != nil
	if err != nil && !edited {
		return "malformed line: " + excerpt(string(line), 80)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s  #%d  ", r.Time.UTC().Format("2006-01-02T15:04:05.000Z07:00"), r.Seq)
	switch r.Event {
	case EventCall:
		fmt.Fprintf(&b, "%s  %s  %s", word(r.Identity), word(r.Tool), word(r.Decision))
		if r.Reason != "" {
			fmt.Fprintf(&b, " reason=%s", quote(r.Reason))
		}
		var run []string
		if r.Status != "" {
			run = append(run, word(r.Status))
		}
		if r.ExitCode != nil {
			run = append(run, "exit="+strconv.Itoa(*r.ExitCode))
		}
		if r.Status != "" || r.DurationMS > 0 {
			run = append(run, (time.Duration(r.DurationMS) * time.Millisecond).String())
		}
		if r.PeakMemoryBytes > 0 {
			run = append(run, "mem="+bytesString(r.PeakMemoryBytes))
		}
		if r.CPUTimeMS > 0 {
			run = append(run, "cpu="+(time.Duration(r.CPUTimeMS)*time.Millisecond).String())
		}
		if len(r.LimitsHit) > 0 {
			hit := make([]string, len(r.LimitsHit))
			for i, l := range r.LimitsHit {
				hit[i] = word(l)
			}
			run = append(run, "limits="+strings.Join(hit, ","))
		}
		if len(run) > 0 {
			b.WriteString("  " + strings.Join(run, " "))
		}
		if r.Error != "" {
			b.WriteString("  error=" + excerpt(r.Error, 60))
		}
		if code, ok := codeOf(r.Arguments); ok || r.CodeSHA256 != "" {
			b.WriteString("  code=")
			if r.CodeSHA256 != "" {
				b.WriteString(word(r.CodeSHA256[:min(8, len(r.CodeSHA256))]) + " ")
			}
			first, _, more := strings.Cut(code, "\n")
			if more {
				first += "…"
			}
			b.WriteString(excerpt(first, 60))
		}
	case EventConnect:
		fmt.Fprintf(&b, "connect  %s  %s  %s", word(r.Identity), word(r.Tool), word(r.Decision))
		if n := r.Net; n != nil {
			fmt.Fprintf(&b, "  %s %s:%d", word(n.Method), word(n.Host), n.Port)
			if n.Address != "" {
				b.WriteString(" (" + word(n.Address) + ")")
			}
			fmt.Fprintf(&b, " in=%s out=%s", bytesString(n.BytesIn), bytesString(n.BytesOut))
		}
		if r.Reason != "" {
			fmt.Fprintf(&b, " reason=%s", quote(r.Reason))
		}
	case EventSession:
		fmt.Fprintf(&b, "session  %s  %s", word(r.Identity), word(r.Decision))
		if r.Error != "" {
			b.WriteString("  error=" + excerpt(r.Error, 80))
		}
	case EventPython:
		fmt.Fprintf(&b, "python  %s  %s  %s", word(r.Identity), word(r.Tool), word(r.Decision))
		if r.DurationMS > 0 {
			b.WriteString("  " + (time.Duration(r.DurationMS) * time.Millisecond).String())
		}
		if r.Error != "" {
			b.WriteString("  error=" + excerpt(r.Error, 80))
		}
	default:
		// start, rotate and events this version does not know.
		b.WriteString(word(r.Event))
		if r.Identity != "" {
			b.WriteString("  " + word(r.Identity))
		}
	}
	if len(r.Detail) > 0 {
		b.WriteString(" ")
		for _, k := range slices.Sorted(maps.Keys(r.Detail)) {
			fmt.Fprintf(&b, " %s=%s", word(k), word(r.Detail[k]))
		}
	}
	if edited {
		b.WriteString("  [hash mismatch: run pysandbox audit verify]")
	}
	return b.String()
}

// FormatJSON returns the line for a terminal with every non-printing
// rune (control characters, DEL, C1 controls, bidi and other format
// characters) written as a JSON \u escape, and invalid UTF-8 as \ufffd.
// Strings in the JSON mean the same, so jq reads it as it would the file;
// but the bytes differ where anything was escaped, so verify the file, not
// this output.
func FormatJSON(line []byte) string {
	var b strings.Builder
	for len(line) > 0 {
		r, size := utf8.DecodeRune(line)
		switch {
		case r == utf8.RuneError && size == 1:
			b.WriteString(`\ufffd`)
		case r == ' ' || strconv.IsPrint(r):
			b.Write(line[:size])
		case r > 0xffff:
			r1, r2 := utf16.EncodeRune(r)
			fmt.Fprintf(&b, `\u%04x\u%04x`, r1, r2)
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
		line = line[size:]
	}
	return b.String()
}

// codeOf returns the "code" argument of a call, if it has one.
func codeOf(args json.RawMessage) (string, bool) {
	var a struct {
		Code *string `json:"code"`
	}
	if len(args) == 0 || json.Unmarshal(args, &a) != nil || a.Code == nil {
		return "", false
	}
	return *a.Code, true
}

// word returns s as is when it is plain printable ASCII without spaces or
// quotes, "-" when empty, and quoted otherwise.
func word(s string) string {
	if s == "" {
		return "-"
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f || c == '"' || c == '\\' {
			return quote(s)
		}
	}
	return s
}

// quote quotes s with Go escapes: control characters, invalid UTF-8 and
// every non-printing rune (including bidi overrides) come out escaped.
func quote(s string) string { return strconv.Quote(s) }

// excerpt quotes at most max runes of s, marking a cut with "…".
func excerpt(s string, max int) string {
	if utf8.RuneCountInString(s) > max {
		i, n := 0, 0
		for i = range s {
			if n == max {
				break
			}
			n++
		}
		s = s[:i] + "…"
	}
	return quote(s)
}

// bytesString renders n bytes with a binary unit.
func bytesString(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1fGiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1fMiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1fKiB", float64(n)/(1<<10))
	}
	return strconv.FormatInt(n, 10) + "B"
}
