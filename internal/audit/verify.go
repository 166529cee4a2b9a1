package audit

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
)

// Report summarises a chain that verified.
type Report struct {
	Files, Records    int64
	FirstSeq, LastSeq int64  // 0 when there are no records
	Head              string // hash of the last record
	// Replicas are the replicas the chain's start records name (one
	// replica of several keeps a chain of its own).
	Replicas []string
}

// VerifyError is the first place where a chain fails to verify.
type VerifyError struct {
	Path string
	Line int   // 1-based line in Path
	Seq  int64 // seq of the record, when it could be read; else 0
	Msg  string
}

func (e *VerifyError) Error() string {
	if e.Seq > 0 {
		return fmt.Sprintf("%s:%d (seq %d): %s", e.Path, e.Line, e.Seq, e.Msg)
	}
	return fmt.Sprintf("%s:%d: %s", e.Path, e.Line, e.Msg)
}

// Verify checks paths as one chain, in the given order: every line's own
// hash, and that each record follows the one before it (seq and prev).
// The first record may have a seq above 1, when older files were removed;
// it is reported in FirstSeq, and its prev cannot be checked.
//
// The first problem is returned as a *VerifyError; other errors are
// failures to read the files.
func Verify(paths []string) (*Report, error) {
	v := &verifier{rep: &Report{}}
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return nil, fmt.Errorf("audit: verify: %w", err)
		}
		err = v.file(f, p)
		f.Close()
		if err != nil {
			return nil, err
		}
		v.rep.Files++
	}
	return v.rep, nil
}

// verifier carries the chain from one file to the next.
type verifier struct {
	rep *Report
}

func (v *verifier) file(r io.Reader, path string) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLineBytes+1)
	sc.Split(scanLinesKeepNewline)
	line := 0
	for sc.Scan() {
		line++
		b := sc.Bytes()
		if b[len(b)-1] != '\n' {
			return &VerifyError{Path: path, Line: line, Msg: "partial last line (no newline at the end): a write was cut short"}
		}
		if err := v.record(b[:len(b)-1]); err != nil {
			err.Path, err.Line = path, line
			return err
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return &VerifyError{Path: path, Line: line + 1, Msg: fmt.Sprintf("line longer than %d bytes", maxLineBytes)}
		}
		return fmt.Errorf("audit: verify: %w", err)
	}
	return nil
}

// record checks one line against its own hash and the chain so far.
func (v *verifier) record(line []byte) *VerifyError {
	r, hash, err := parseLine(line)
	if err != nil {
		e := &VerifyError{Msg: err.Error()}
		if r != nil {
			e.Seq = r.Seq
		}
		return e
	}
	rep := v.rep
	switch {
	case rep.Records == 0 && r.Seq == 1 && r.Prev != "":
		return &VerifyError{Seq: r.Seq, Msg: "the first record of a chain (seq 1) has a prev: records before it were deleted and renumbered"}
	case rep.Records == 0:
		// Retention may have removed the files before this one.
	case r.Seq == rep.LastSeq:
		return &VerifyError{Seq: r.Seq, Msg: fmt.Sprintf("duplicated record: seq %d repeats the previous record's", r.Seq)}
	case r.Seq != rep.LastSeq+1:
		return &VerifyError{Seq: r.Seq, Msg: fmt.Sprintf("chain broken: seq %d follows seq %d: a record before this one was deleted or reordered", r.Seq, rep.LastSeq)}
	case r.Prev != rep.Head:
		return &VerifyError{Seq: r.Seq, Msg: "chain broken: prev is not the hash of the previous record: a record before this one was deleted or reordered"}
	}
	if rep.Records == 0 {
		rep.FirstSeq = r.Seq
	}
	if name := r.Detail["replica"]; r.Event == "start" && name != "" && !slices.Contains(rep.Replicas, name) {
		rep.Replicas = append(rep.Replicas, name)
	}
	rep.Records++
	rep.LastSeq, rep.Head = r.Seq, hash
	return nil
}

// scanLinesKeepNewline is bufio.ScanLines keeping the '\n', so that a last
// line without one can be told apart.
func scanLinesKeepNewline(data []byte, atEOF bool) (advance int, token []byte, err error) {
	if i := bytes.IndexByte(data, '\n'); i >= 0 {
		return i + 1, data[:i+1], nil
	}
	if atEOF && len(data) > 0 {
		return len(data), data, nil
	}
	return 0, nil, nil
}
