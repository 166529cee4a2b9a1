package audit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/pysandbox/pysandbox/internal/testutil"
)

func TestVerifyFindsTampering(t *testing.T) {
	// other is a different chain of the same shape (its clock is one
	// tick ahead), for splicing.
	dir := t.TempDir()
	other := filepath.Join(dir, "other.log")
	later := clock()
	later()
	writeLog(t, other, 6, Options{Now: later})
	otherLines := readLines(t, other)

	tests := []struct {
		name   string
		tamper func([][]byte) [][]byte
		line   int
		seq    int64
		msg    string
	}{
		{"edited", func(l [][]byte) [][]byte {
			l[2] = bytes.Replace(l[2], []byte("print(2)"), []byte("print(7)"), 1)
			return l
		}, 3, 3, "record edited: its hash does not match its content"},
		{"deleted", func(l [][]byte) [][]byte { return slices.Delete(l, 2, 3) },
			3, 4, "seq 4 follows seq 2: a record before this one was deleted or reordered"},
		{"swapped", func(l [][]byte) [][]byte { l[2], l[3] = l[3], l[2]; return l },
			3, 4, "deleted or reordered"},
		{"duplicated", func(l [][]byte) [][]byte { return slices.Insert(l, 3, l[2]) },
			4, 3, "duplicated record"},
		{"spliced", func(l [][]byte) [][]byte { return append(l[:3], otherLines[3:]...) },
			4, 4, "prev is not the hash of the previous record"},
		{"partial last line", func(l [][]byte) [][]byte { l[5] = l[5][:len(l[5])/2]; return l },
			6, 0, "partial last line"},
		{"newline lost", func(l [][]byte) [][]byte { l[5] = bytes.TrimSuffix(l[5], []byte("\n")); return l },
			6, 0, "partial last line"},
		{"hash removed", func(l [][]byte) [][]byte {
			i := bytes.Index(l[1], []byte(hashSep))
			l[1] = append(l[1][:i:i], "}\n"...)
			return l
		}, 2, 0, "malformed line"},
		{"hash uppercased", func(l [][]byte) [][]byte { l[1] = bytes.ToUpper(l[1]); return l },
			2, 0, "malformed line"},
		{"blank line", func(l [][]byte) [][]byte { return slices.Insert(l, 1, []byte("\n")) },
			2, 0, "malformed line"},
		{"garbage", func(l [][]byte) [][]byte { return slices.Insert(l, 4, []byte("\x1b[2J rm -rf /\n")) },
			5, 0, "malformed line"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "audit.log")
			writeLog(t, path, 6, Options{})
			writeLines(t, path, tt.tamper(readLines(t, path)))
			_, err := Verify([]string{path})
			var ve *VerifyError
			if !errors.As(err, &ve) {
				t.Fatalf("Verify: %v, want a *VerifyError", err)
			}
			if ve.Path != path || ve.Line != tt.line || ve.Seq != tt.seq || !strings.Contains(ve.Msg, tt.msg) {
				t.Errorf("got %v\nwant line %d, seq %d, message with %q", err, tt.line, tt.seq, tt.msg)
			}
		})
	}
}

func TestVerifyErrorText(t *testing.T) {
	e := &VerifyError{Path: "audit.log", Line: 17, Seq: 17, Msg: errEdited.Error()}
	if got, want := e.Error(), "audit.log:17 (seq 17): record edited: its hash does not match its content"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	e.Seq = 0
	if got, want := e.Error(), "audit.log:17: record edited: its hash does not match its content"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestVerifyAfterRetention(t *testing.T) {
	// Old files removed: the chain starts at a later seq.
	path := filepath.Join(t.TempDir(), "audit.log")
	writeLog(t, path, 5, Options{})
	writeLines(t, path, readLines(t, path)[2:])
	rep := verifyOK(t, path)
	if rep.FirstSeq != 3 || rep.LastSeq != 5 || rep.Records != 3 {
		t.Errorf("report %+v, want seq 3..5", rep)
	}
}

func TestVerifyEmpty(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	os.WriteFile(path, nil, 0o600)
	if rep := verifyOK(t, path); rep.Records != 0 || rep.Files != 1 || rep.Head != "" {
		t.Errorf("report %+v", rep)
	}
}

func TestVerifyAcrossFiles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	writeLog(t, path, 30, Options{MaxSize: 2000})
	files, _ := Files(path)
	if len(files) < 3 {
		t.Fatalf("files %v: want rotation", files)
	}
	verifyOK(t, files...)

	// Files out of order, or one missing, break the chain at the first
	// line after the gap.
	swapped := slices.Clone(files)
	swapped[0], swapped[1] = swapped[1], swapped[0]
	for name, paths := range map[string][]string{
		"missing": slices.Delete(slices.Clone(files), 1, 2),
		"swapped": swapped,
	} {
		_, err := Verify(paths)
		var ve *VerifyError
		if !errors.As(err, &ve) || ve.Path != paths[1] || ve.Line != 1 || !strings.Contains(ve.Msg, "deleted or reordered") {
			t.Errorf("%s: %v, want an error at %s:1", name, err, paths[1])
		}
	}

	// An edit in a rotated file is named there.
	lines := readLines(t, files[1])
	lines[2] = bytes.Replace(lines[2], []byte(`"alice"`), []byte(`"mallory"`), 1)
	writeLines(t, files[1], lines)
	_, err := Verify(files)
	var ve *VerifyError
	if !errors.As(err, &ve) || ve.Path != files[1] || ve.Line != 3 || !strings.Contains(ve.Msg, "edited") {
		t.Errorf("%v, want an edit at %s:3", err, files[1])
	}
}

func TestVerifyMissingFile(t *testing.T) {
	_, err := Verify([]string{filepath.Join(t.TempDir(), "nope.log")})
	var ve *VerifyError
	if err == nil || errors.As(err, &ve) {
		t.Errorf("missing file: %v, want an I/O error", err)
	}
}

func TestVerifyLongLine(t *testing.T) {
	// A record holding a large program verifies.
	path := filepath.Join(t.TempDir(), "audit.log")
	w, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	code := strings.Repeat("x = '\\x00\"<>'\n", 1<<16) // ~1 MiB, inflated by escaping
	args, _ := json.Marshal(map[string]string{"code": code})
	if err := w.Append(&Record{Event: EventCall, Arguments: args}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	verifyOK(t, path)
	if w, err = Open(path, Options{}); err != nil {
		t.Fatalf("reopen after a long line: %v", err)
	}
	w.Close()
}

// fuzzSeeds are the seed corpus of FuzzVerify: a valid log and broken
// variants, derived from the golden log.
func fuzzSeeds(t *testing.T) map[string][]byte {
	valid, err := os.ReadFile(filepath.Join("testdata", "chain.log"))
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.SplitAfter(valid, []byte("\n"))[:3]
	return map[string][]byte{
		"valid":     valid,
		"edited":    bytes.Replace(valid, []byte("print"), []byte("prant"), 1),
		"deleted":   bytes.Join([][]byte{lines[0], lines[2]}, nil),
		"swapped":   bytes.Join([][]byte{lines[0], lines[2], lines[1]}, nil),
		"partial":   valid[:len(valid)-7],
		"no-hash":   []byte(`{"seq":1,"time":"2026-11-22T02:10:17Z","event":"start","duration_ms":0,"prev":""}` + "\n"),
		"bad-types": []byte(`{"seq":"1","time":7,"event":[],"duration_ms":0,"prev":""},"hash":"` + strings.Repeat("0", 64) + "\"}\n"),
	}
}

// TestFuzzSeeds keeps testdata/fuzz/FuzzVerify in step with the golden
// log; run with -update to rewrite it.
func TestFuzzSeeds(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzVerify")
	for name, data := range fuzzSeeds(t) {
		want := []byte("go test fuzz v1\n[]byte(" + strconv.Quote(string(data)) + ")\n")
		testutil.Golden(t, filepath.Join(dir, name), want, *update)
	}
}

func FuzzVerify(f *testing.F) {
	path := filepath.Join(f.TempDir(), "audit.log")
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		rep, err := Verify([]string{path})
		if err != nil {
			var ve *VerifyError
			if !errors.As(err, &ve) {
				t.Fatalf("error %v (%T) is not a *VerifyError", err, err)
			}
			if ve.Line < 1 || ve.Path != path {
				t.Fatalf("error names %s:%d", ve.Path, ve.Line)
			}
			return
		}
		if rep.Records > 0 && (rep.LastSeq-rep.FirstSeq+1 != rep.Records || len(rep.Head) != 64) {
			t.Fatalf("inconsistent report %+v", rep)
		}
		// What verifies formats without panicking, and reads back.
		for _, l := range bytes.Split(bytes.TrimSuffix(data, []byte("\n")), []byte("\n")) {
			Format(l)
		}
	})
}

// TestCheckCuts: a chain consistent in itself but missing records at its
// front, in its middle or at its end fails Check, in one file and across
// rotated files; a start after rotated files removed on purpose passes
// when allowed (FromSeq), and only then.
func TestCheckCuts(t *testing.T) {
	single := func(t *testing.T) []string {
		path := filepath.Join(t.TempDir(), "audit.log")
		writeLog(t, path, 8, Options{})
		return []string{path}
	}
	rotated := func(t *testing.T) []string {
		path := filepath.Join(t.TempDir(), "audit.log")
		writeLog(t, path, 30, Options{MaxSize: 2000})
		files, _ := Files(path)
		if len(files) < 3 {
			t.Fatalf("files %v: want rotation", files)
		}
		return files
	}
	// head is the chain's last record before any cut.
	head := func(t *testing.T, files []string) Expect {
		rep := verifyOK(t, files...)
		return Expect{Head: rep.Head}
	}
	tests := []struct {
		name  string
		make  func(*testing.T) []string
		cut   func(t *testing.T, files []string) []string // returns the files to check
		allow func(files []string) int64                  // FromSeq to pass, if any
		want  error
		msg   string
	}{
		{"front, one file", single, func(t *testing.T, f []string) []string {
			writeLines(t, f[0], readLines(t, f[0])[2:])
			return f
		}, nil, ErrFrontCut, `audit.log:1 (seq 3): the chain starts at seq 3 with a "call" record, not at seq 1 nor with the rotate record a rotated file starts with: the 2 records before it were cut from the front of the file`},
		{"middle, one file", single, func(t *testing.T, f []string) []string {
			writeLines(t, f[0], slices.Delete(readLines(t, f[0]), 3, 5))
			return f
		}, nil, nil, "audit.log:4 (seq 6): chain broken: seq 6 follows seq 3"},
		{"end, one file", single, func(t *testing.T, f []string) []string {
			l := readLines(t, f[0])
			writeLines(t, f[0], l[:len(l)-1])
			return f
		}, nil, ErrEndCut, "audit.log:7 (seq 7): the chain ends at seq 7, and no record of it has the expected head"},
		{"oldest file removed", rotated, func(t *testing.T, f []string) []string {
			os.Remove(f[0])
			return f[1:]
		}, func(f []string) int64 { return verifyOK(t, f...).FirstSeq }, ErrFrontCut,
			"the rotate record that follows audit.log.1, which was not checked"},
		{"front of the oldest file", rotated, func(t *testing.T, f []string) []string {
			writeLines(t, f[0], readLines(t, f[0])[1:])
			return f
		}, nil, ErrFrontCut, `audit.log.1:1 (seq 2): the chain starts at seq 2 with a "call" record`},
		{"middle file removed", rotated, func(t *testing.T, f []string) []string {
			os.Remove(f[1])
			return slices.Delete(slices.Clone(f), 1, 2)
		}, nil, nil, "chain broken"},
		{"newest file removed", rotated, func(t *testing.T, f []string) []string {
			os.Remove(f[len(f)-1])
			return f[:len(f)-1]
		}, nil, ErrEndCut, "records were cut from its end, or the chain was rewritten"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			files := tt.make(t)
			exp := head(t, files)
			files = tt.cut(t, files)
			_, err := Check(files, exp)
			var ve *VerifyError
			if !errors.As(err, &ve) || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("Check: %v\nwant a *VerifyError with %q", err, tt.msg)
			}
			if tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("%v: want %v", err, tt.want)
			}
			if tt.allow != nil {
				from := tt.allow(files)
				exp.FromSeq = from
				if rep, err := Check(files, exp); err != nil || rep.FirstSeq != from {
					t.Errorf("allowed to start at seq %d: %v %+v", from, err, rep)
				}
				// One seq too strict still fails, naming what is missing.
				exp.FromSeq = from - 1
				if _, err := Check(files, exp); !errors.Is(err, ErrFrontCut) || !strings.Contains(err.Error(), fmt.Sprintf("it may start at seq %d at the latest: record %d is missing", from-1, from-1)) {
					t.Errorf("allowed to start at seq %d: %v", from-1, err)
				}
				exp.FromSeq = from - 2
				if _, err := Check(files, exp); !errors.Is(err, ErrFrontCut) || !strings.Contains(err.Error(), fmt.Sprintf("records %d..%d are missing", from-2, from-1)) {
					t.Errorf("allowed to start at seq %d: %v", from-2, err)
				}
			}
		})
	}
}

// TestCheckWhole: a whole chain passes Check, with or without the head
// expected, and a head the chain grew past is found where it is.
func TestCheckWhole(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	writeLog(t, path, 30, Options{MaxSize: 2000})
	files, _ := Files(path)
	rep, err := Check(files, Expect{})
	if err != nil || rep.FirstSeq != 1 || rep.FirstEvent != EventCall {
		t.Fatalf("%v %+v", err, rep)
	}
	// The head of seq 10, given with or without its seq.
	var at string
	Read(files, func(r *Record, hash string) bool {
		if r.Seq == 10 {
			at = hash
		}
		return r.Seq < 10
	})
	for _, e := range []Expect{{Head: at}, {Head: at, HeadSeq: 10}} {
		if rep, err := Check(files, e); err != nil || rep.ExpectedAt != 10 {
			t.Errorf("%+v: %v %+v", e, err, rep)
		}
	}
	// An empty log expected to hold a head was emptied.
	empty := filepath.Join(t.TempDir(), "empty.log")
	os.WriteFile(empty, nil, 0o600)
	if _, err := Check([]string{empty}, Expect{Head: at}); !errors.Is(err, ErrEndCut) || !strings.Contains(err.Error(), "empty.log:1: the chain holds no record") {
		t.Errorf("emptied: %v", err)
	}
	if _, err := Check([]string{empty}, Expect{}); err != nil {
		t.Errorf("a new, empty log: %v", err)
	}
}
