package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/pysandbox/pysandbox/internal/testutil"
)

func TestFormatGolden(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	w, err := Open(path, Options{Now: clock()})
	if err != nil {
		t.Fatal(err)
	}
	exit1 := 1
	records := []*Record{
		{Event: EventStart, Detail: map[string]string{"version": "0.1.0", "policy_sha256": strings.Repeat("ab", 32)}},
		call(0),
		{Event: EventCall, Identity: "bob", Tool: "run_python", Decision: "deny", Reason: "tool not allowed for this token",
			Arguments: json.RawMessage(`{"code":"import os\nos.system('id')"}`), CodeSHA256: strings.Repeat("9", 64)},
		{Event: EventCall, Identity: "conn-7", Tool: "run_python", Decision: "allow", Status: "memory_limit", ExitCode: &exit1,
			DurationMS: 2345, PeakMemoryBytes: 512 << 20, CPUTimeMS: 2100, LimitsHit: []string{"memory"},
			Error:     "MemoryError: the run went over its 512MiB memory limit",
			Arguments: json.RawMessage(`{"code":"x = ' ' * 10**10  # a very long first line that goes on and on and on and on and on"}`)},
		{Event: EventCall, Identity: "alice", Tool: "list_files", Decision: "rate_limited", Reason: "60 calls per minute"},
		{Event: EventCall, Identity: "alice", Tool: "run_python", Decision: "approval_requested"},
		{Event: EventCall, Identity: "eve\x1b]0;owned\x07", Tool: "run_python", Decision: "allow", Status: "success", ExitCode: new(int),
			Arguments: json.RawMessage(`{"code":"print('\u001b[2J\u001b[31mhi\r')\u202e"}`)},
		{Event: EventConnect, Identity: "alice", Tool: "python-download", Decision: "allow",
			Net: &Connection{Method: "CONNECT", Host: "github.com", Port: 443, Address: "140.82.121.4", BytesIn: 33 << 20, BytesOut: 4096}},
		{Event: EventPython, Identity: "alice", Tool: "run", Decision: "refused", DurationMS: 1800,
			Error:  "the archive from https://github.com/x has SHA-256 00, not the ab its download metadata names; it was deleted unread",
			Detail: map[string]string{"action": "install", "version": "3.13.15", "bytes": "34603008"}},
		{Event: "shutdown"},
	}
	for _, r := range records {
		if err := w.Append(r); err != nil {
			t.Fatal(err)
		}
	}
	w.Close()
	lines := readLines(t, path)
	// A rotate record, an edited record and a broken line as Tail shows them.
	rot, _, _ := encodeLine(&Record{Seq: 9, Time: clock()(), Event: EventRotate, Detail: map[string]string{"previous_file": "audit.log.3"}, Prev: strings.Repeat("0", 64)})
	lines = append(lines, rot,
		bytes.Replace(lines[1], []byte("print(0)"), []byte("print(1)"), 1),
		[]byte("not a record \x1b[2J\n"))
	writeLines(t, path, lines)

	var out bytes.Buffer
	if err := Tail(&out, []string{path}, 100); err != nil {
		t.Fatal(err)
	}
	got := out.Bytes()
	testutil.Golden(t, filepath.Join("testdata", "tail.golden"), got, *update)
}

// TestTailEscapesControlCharacters: code is hostile, and the log is read
// in terminals.
func TestTailEscapesControlCharacters(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	w, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	hostile := "\x1b[2J\x1b]52;c;cm0gLXJmIC8=\x07\r\b\x7f\u202e\u200b\u009b31m\xff"
	code, _ := json.Marshal(map[string]string{"code": hostile + "\nmore" + hostile})
	r := &Record{Event: EventCall, Identity: hostile, Tool: hostile, Arguments: code, CodeSHA256: hostile,
		Decision: hostile, Reason: hostile, Status: hostile, LimitsHit: []string{hostile}, Error: hostile,
		Detail: map[string]string{hostile: hostile}}
	if err := w.Append(r); err != nil {
		t.Fatal(err)
	}
	if err := w.Append(&Record{Event: hostile, Identity: hostile}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	var out bytes.Buffer
	if err := Tail(&out, []string{path}, 2); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for i, c := range s {
		if (c < ' ' && c != '\n') || (c >= 0x7f && c < 0xa0) || c == '\u202e' || c == '\u200b' {
			t.Fatalf("raw %U at byte %d of output:\n%q", c, i, s)
		}
	}
	if !utf8.ValidString(s) {
		t.Errorf("invalid UTF-8 in output:\n%q", s)
	}
	if !strings.Contains(s, `\x1b[2J`) {
		t.Errorf("escape sequence not shown escaped:\n%s", s)
	}
	if strings.Count(s, "\n") != 2 {
		t.Errorf("want 2 lines:\n%s", s)
	}
}

func TestTailAcrossFiles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	writeLog(t, path, 30, Options{MaxSize: 2000})
	files, _ := Files(path)
	inLast := len(readLines(t, path))
	lines, err := Last(files, inLast+3)
	if err != nil {
		t.Fatal(err)
	}
	if len(lines) != inLast+3 {
		t.Fatalf("%d lines, want %d", len(lines), inLast+3)
	}
	var prev int64
	for i, l := range lines {
		r, _, err := parseLine(l)
		if err != nil {
			t.Fatal(err)
		}
		if i > 0 && r.Seq != prev+1 {
			t.Errorf("line %d: seq %d after %d", i, r.Seq, prev)
		}
		prev = r.Seq
	}
	if _, lastSeq := prev, verifyOK(t, files...).LastSeq; prev != lastSeq {
		t.Errorf("last line seq %d, want %d", prev, lastSeq)
	}
	all, _ := Last(files, 1000)
	if int64(len(all)) != verifyOK(t, files...).Records {
		t.Errorf("Last(1000) gave %d lines", len(all))
	}
}

func TestFollow(t *testing.T) {
	defer func(d time.Duration) { pollInterval = d }(pollInterval)
	pollInterval = 5 * time.Millisecond
	path := filepath.Join(t.TempDir(), "audit.log")
	w, err := Open(path, Options{MaxSize: 1500})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for i := range 3 {
		if err := w.Append(call(i)); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan int64, 100)
	done := make(chan error, 1)
	go func() {
		done <- Follow(ctx, path, 2, func(line []byte) error {
			r, _, err := parseLine(line)
			if err != nil {
				return err
			}
			got <- r.Seq
			return nil
		})
	}()
	next := int64(2)
	expect := func(upTo int64) {
		t.Helper()
		for ; next <= upTo; next++ {
			select {
			case seq := <-got:
				if seq != next {
					t.Fatalf("followed seq %d, want %d", seq, next)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("waited for seq %d", next)
			}
		}
	}
	expect(3)
	// Appends, across several rotations.
	for i := 3; i < 20; i++ {
		if err := w.Append(call(i)); err != nil {
			t.Fatal(err)
		}
		if i%4 == 0 {
			time.Sleep(2 * pollInterval)
		}
	}
	files, _ := Files(path)
	if len(files) < 3 {
		t.Fatalf("no rotation: %v", files)
	}
	seq, _ := w.Head()
	expect(seq)
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Follow: %v", err)
	}
	select {
	case seq := <-got:
		t.Errorf("extra line, seq %d", seq)
	default:
	}
}

func TestFormatJSON(t *testing.T) {
	line := []byte("{\"code\":\"a\x1b[2J\x7f\u009b\u202e\U000e0001<é>\xff\"}")
	got := FormatJSON(line)
	want := `{"code":"a\u001b[2J\u007f\u009b\u202e\udb40\udc01<é>\ufffd"}`
	if got != want {
		t.Errorf("FormatJSON = %s, want %s", got, want)
	}
	var a map[string]string
	if err := json.Unmarshal([]byte(got), &a); err != nil {
		t.Fatal(err)
	}
	if want := "a\x1b[2J\x7f\u009b\u202e\U000e0001<é>\ufffd"; a["code"] != want {
		t.Errorf("meaning changed: %q, want %q", a["code"], want)
	}
	// Lines of a log are left as they are.
	for _, l := range bytes.Split(bytes.TrimSpace(mustRead(t, filepath.Join("testdata", "chain.log"))), []byte("\n")) {
		if FormatJSON(l) != string(l) {
			t.Errorf("changed %s", l)
		}
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
