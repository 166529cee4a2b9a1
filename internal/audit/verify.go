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
	// FirstEvent is the event of the chain's first record, and
	// FirstAfter the file a rotate record there says came before it: a
	// chain whose older files were removed starts with such a record.
	FirstEvent, FirstAfter string
	// ExpectedAt is the seq of the record holding Expect.Head (Check),
	// 0 when none was expected or it is in files removed before FirstSeq.
	ExpectedAt int64
}

// VerifyError is the first place where a chain fails to verify.
type VerifyError struct {
	Path string
	Line int   // 1-based line in Path
	Seq  int64 // seq of the record, when it could be read; else 0
	Msg  string
	// Err, when set, is what kind of cut Check found (ErrFrontCut,
	// ErrEndCut, ErrRewritten), so that a caller can say what to do.
	Err error
}

// Kinds of VerifyError that Check finds beyond Verify: the chain is
// consistent in itself, but it is not the whole chain that was expected.
var (
	// ErrFrontCut: the chain does not start at seq 1, nor where it was
	// allowed to (Expect.FromSeq).
	ErrFrontCut = errors.New("records are missing at the front of the chain")
	// ErrEndCut: the chain ends before the record of the expected head.
	ErrEndCut = errors.New("records are missing at the end of the chain")
	// ErrRewritten: the record at the expected head's place is another.
	ErrRewritten = errors.New("the chain was rewritten")
)

func (e *VerifyError) Unwrap() error { return e.Err }

func (e *VerifyError) Error() string {
	if e.Seq > 0 {
		return fmt.Sprintf("%s:%d (seq %d): %s", e.Path, e.Line, e.Seq, e.Msg)
	}
	return fmt.Sprintf("%s:%d: %s", e.Path, e.Line, e.Msg)
}

// Verify checks paths as one chain, in the given order: every line's own
// hash, and that each record follows the one before it (seq and prev).
// It judges only that consistency: the first record may have a seq above
// 1 (reported in FirstSeq; its prev cannot be checked), and nothing tells
// a chain cut short from a whole one. Check judges those too.
//
// The first problem is returned as a *VerifyError; other errors are
// failures to read the files.
func Verify(paths []string) (*Report, error) {
	return verify(paths, nil)
}

// Expect is what Check requires of a chain besides its consistency.
type Expect struct {
	// FromSeq lets the chain start after seq 1, at FromSeq or before:
	// the records before it were removed on purpose (rotated files past
	// their retention). 0 means the chain must start at seq 1.
	FromSeq int64
	// Head is the hash of a record the chain must hold: a head kept
	// somewhere else (an anchor in the shared store, the one the server
	// logged when it stopped). Records after it are fine (the chain
	// grew since); a chain without it was cut short or rewritten.
	Head string
	// HeadSeq, when not 0, is the seq of Head's record.
	HeadSeq int64
}

// Check is Verify that also requires the chain to be whole: to start at
// seq 1 (or at e.FromSeq or before), and to hold e.Head. A chain whose
// first records were cut, or whose last ones were, fails with a
// *VerifyError wrapping ErrFrontCut, ErrEndCut or ErrRewritten.
func Check(paths []string, e Expect) (*Report, error) {
	return verify(paths, &e)
}

func verify(paths []string, e *Expect) (*Report, error) {
	v := &verifier{rep: &Report{}, exp: e}
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
	if e != nil {
		if err := v.end(paths); err != nil {
			return nil, err
		}
	}
	return v.rep, nil
}

// verifier carries the chain from one file to the next.
type verifier struct {
	rep *Report
	exp *Expect // nil: consistency only (Verify)
	// Where the last record is, to name it when the end is wrong.
	lastPath string
	lastLine int
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
		v.lastPath, v.lastLine = path, line
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
		rep.FirstSeq, rep.FirstEvent = r.Seq, r.Event
		if r.Event == EventRotate {
			rep.FirstAfter = r.Detail["previous_file"]
		}
		if err := v.start(); err != nil {
			return err
		}
	}
	if e := v.exp; e != nil && e.Head != "" && rep.ExpectedAt == 0 {
		switch {
		case hash == e.Head:
			rep.ExpectedAt = r.Seq
		case r.Seq == e.HeadSeq:
			return &VerifyError{Seq: r.Seq, Err: ErrRewritten,
				Msg: fmt.Sprintf("seq %d has hash %s, but the expected head is %s: the chain was rewritten", r.Seq, hash, e.Head)}
		}
	}
	if name := r.Detail["replica"]; r.Event == "start" && name != "" && !slices.Contains(rep.Replicas, name) {
		rep.Replicas = append(rep.Replicas, name)
	}
	rep.Records++
	rep.LastSeq, rep.Head = r.Seq, hash
	return nil
}

// start judges where the chain starts (Check): at seq 1, or where it was
// allowed to. A writer starts every file after the first with a rotate
// record, so a chain that starts with another record past seq 1 lost
// lines from the front of a file, not whole files.
func (v *verifier) start() *VerifyError {
	rep := v.rep
	if v.exp == nil || rep.FirstSeq == 1 || rep.FirstSeq <= v.exp.FromSeq {
		return nil
	}
	var msg string
	switch {
	case v.exp.FromSeq > 0:
		missing := fmt.Sprintf("records %d..%d are", v.exp.FromSeq, rep.FirstSeq-1)
		if v.exp.FromSeq == rep.FirstSeq-1 {
			missing = fmt.Sprintf("record %d is", v.exp.FromSeq)
		}
		msg = fmt.Sprintf("the chain starts at seq %d, but it may start at seq %d at the latest: %s missing", rep.FirstSeq, v.exp.FromSeq, missing)
	case rep.FirstEvent == EventRotate && rep.FirstAfter != "":
		msg = fmt.Sprintf("the chain starts at seq %d, with the rotate record that follows %s, which was not checked: %s missing (rotated files removed, or not given)", rep.FirstSeq, rep.FirstAfter, before(rep.FirstSeq-1, "is", "are"))
	default:
		msg = fmt.Sprintf("the chain starts at seq %d with a %q record, not at seq 1 nor with the rotate record a rotated file starts with: %s cut from the front of the file", rep.FirstSeq, rep.FirstEvent, before(rep.FirstSeq-1, "was", "were"))
	}
	return &VerifyError{Seq: rep.FirstSeq, Msg: msg, Err: ErrFrontCut}
}

// before names the n records before the first, with the verb's form.
func before(n int64, one, many string) string {
	if n == 1 {
		return "the record before it " + one
	}
	return fmt.Sprintf("the %d records before it %s", n, many)
}

// end judges where the chain ends (Check): at or after the expected head.
func (v *verifier) end(paths []string) error {
	e, rep := v.exp, v.rep
	if e.Head == "" || rep.ExpectedAt > 0 {
		return nil
	}
	if e.HeadSeq > 0 && e.HeadSeq < rep.FirstSeq {
		// In files removed on purpose (FromSeq): nothing to compare.
		return nil
	}
	ve := &VerifyError{Path: v.lastPath, Line: v.lastLine, Seq: rep.LastSeq, Err: ErrEndCut}
	if ve.Path == "" && len(paths) > 0 {
		ve.Path, ve.Line = paths[len(paths)-1], 1
	}
	switch {
	case rep.Records == 0:
		ve.Msg = fmt.Sprintf("the chain holds no record, but the expected head is %s: records were cut from its end", e.Head)
	case e.HeadSeq > 0:
		ve.Msg = fmt.Sprintf("the chain ends at seq %d, but the expected head is seq %d: records were cut from its end", rep.LastSeq, e.HeadSeq)
	default:
		ve.Msg = fmt.Sprintf("the chain ends at seq %d, and no record of it has the expected head %s: records were cut from its end, or the chain was rewritten", rep.LastSeq, e.Head)
	}
	return ve
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
