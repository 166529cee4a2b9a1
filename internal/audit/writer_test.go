package audit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"
)

// clock is a fixed clock that ticks 1.5ms per reading, so golden files
// are stable and times are distinct.
func clock() func() time.Time {
	var mu sync.Mutex
	t := time.Date(2026, 11, 22, 2, 10, 17, 123_000_000, time.UTC)
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		t = t.Add(1500 * time.Microsecond)
		return t
	}
}

// call is the record of a successful run_python call printing i.
func call(i int) *Record {
	exit := 0
	return &Record{
		Event: EventCall, Identity: "alice", Tool: "run_python",
		Arguments:  json.RawMessage(fmt.Sprintf(`{"code": "print(%d)", "timeout": 30}`, i)),
		CodeSHA256: strings.Repeat("3f2a9c1e", 8),
		Decision:   "allow", Status: "success", ExitCode: &exit, DurationMS: 12,
		PeakMemoryBytes: 23 << 20, CPUTimeMS: 8,
	}
}

// writeLog appends n calls to a new log at path and closes it.
func writeLog(t *testing.T, path string, n int, opts Options) {
	t.Helper()
	if opts.Now == nil {
		opts.Now = clock()
	}
	w, err := Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := w.Append(call(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// readLines returns the lines of path, newlines kept.
func readLines(t *testing.T, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.SplitAfter(b, []byte("\n"))[:bytes.Count(b, []byte("\n"))]
}

func writeLines(t *testing.T, path string, lines [][]byte) {
	t.Helper()
	if err := os.WriteFile(path, bytes.Join(lines, nil), 0o600); err != nil {
		t.Fatal(err)
	}
}

func verifyOK(t *testing.T, paths ...string) *Report {
	t.Helper()
	rep, err := Verify(paths)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	return rep
}

func TestAppendVerify(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	w, err := Open(path, Options{Now: clock()})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	start := &Record{Event: EventStart, Detail: map[string]string{"version": "0.1.0"}}
	if err := w.Append(start); err != nil {
		t.Fatal(err)
	}
	if start.Seq != 1 || start.Prev != "" || start.Time.IsZero() {
		t.Errorf("first record filled in as seq %d prev %q time %v", start.Seq, start.Prev, start.Time)
	}
	for i := range 4 {
		r := call(i)
		_, head := w.Head()
		if err := w.Append(r); err != nil {
			t.Fatal(err)
		}
		if r.Seq != int64(i+2) || r.Prev != head {
			t.Errorf("record %d filled in as seq %d prev %q, want prev %q", i, r.Seq, r.Prev, head)
		}
	}
	seq, head := w.Head()
	rep := verifyOK(t, path)
	want := Report{Files: 1, Records: 5, FirstSeq: 1, LastSeq: 5, Head: head, FirstEvent: EventStart}
	if !reflect.DeepEqual(*rep, want) || seq != 5 {
		t.Errorf("report %+v, head seq %d; want %+v", *rep, seq, want)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", st.Mode().Perm())
	}
	// The arguments are compacted, and code stays readable.
	if lines := readLines(t, path); !bytes.Contains(lines[1], []byte(`"arguments":{"code":"print(0)","timeout":30}`)) {
		t.Errorf("arguments not compacted: %s", lines[1])
	}
}

func TestAppendKeepsCodeReadable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	w, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.Append(&Record{Event: EventCall, Arguments: json.RawMessage(`{"code":"if a < b & c > d: pass"}`)}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); !bytes.Contains(b, []byte("a < b & c > d")) {
		t.Errorf("code escaped: %s", b)
	}
	verifyOK(t, path)
}

func TestOpenContinuesChain(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	writeLog(t, path, 3, Options{})
	w, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if seq, _ := w.Head(); seq != 3 {
		t.Errorf("reopened at seq %d, want 3", seq)
	}
	r := call(3)
	if err := w.Append(r); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if r.Seq != 4 {
		t.Errorf("seq %d after reopen, want 4", r.Seq)
	}
	if rep := verifyOK(t, path); rep.Records != 4 {
		t.Errorf("%d records, want 4", rep.Records)
	}
}

func TestOpenRefusesDamagedLastLine(t *testing.T) {
	for name, damage := range map[string]func([][]byte){
		"partial": func(l [][]byte) { l[2] = l[2][:len(l[2])-5] },
		"edited":  func(l [][]byte) { l[2] = bytes.Replace(l[2], []byte("print(2)"), []byte("print(9)"), 1) },
		"garbage": func(l [][]byte) { l[2] = []byte("hello\n") },
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "audit.log")
			writeLog(t, path, 3, Options{})
			lines := readLines(t, path)
			damage(lines)
			writeLines(t, path, lines)
			before, _ := os.ReadFile(path)
			w, err := Open(path, Options{})
			if err == nil {
				w.Close()
				t.Fatal("Open accepted a damaged log")
			}
			if !strings.Contains(err.Error(), "pysandbox audit verify "+path) || !strings.Contains(err.Error(), "move "+path+" aside") {
				t.Errorf("error does not say what to do: %v", err)
			}
			if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
				t.Error("Open changed the damaged file")
			}
		})
	}
}

func TestOpenRefusesSecondWriter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	w, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w2, err := Open(path, Options{})
	if err == nil {
		w2.Close()
		t.Fatal("a second writer opened the same log")
	}
	if !strings.Contains(err.Error(), "in use") {
		t.Errorf("error %v", err)
	}
}

func TestOpenRefusesDirectory(t *testing.T) {
	if _, err := Open(t.TempDir(), Options{}); err == nil {
		t.Fatal("opened a directory")
	}
}

// TestOpenRefusesLinksAndFIFOs: a symbolic link planted where the log
// will be is not followed (a root server would append to its target), and
// a FIFO neither blocks the server nor is accepted.
func TestOpenRefusesLinksAndFIFOs(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "passwd")
	os.WriteFile(target, []byte("root:x:0:0::/root:/bin/sh\n"), 0o644)
	link := filepath.Join(dir, "audit.log")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(link, Options{}); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("opened through a symlink: %v", err)
	}
	if b, _ := os.ReadFile(target); string(b) != "root:x:0:0::/root:/bin/sh\n" {
		t.Errorf("the link's target was written: %q", b)
	}
	fifo := filepath.Join(dir, "fifo.log")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := Open(fifo, Options{}); done <- err }()
	select {
	case err := <-done:
		if err == nil {
			t.Error("opened a FIFO")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Open blocked on a FIFO")
	}
}

func TestBrokenWriterRefusesAppends(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	w, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.Append(call(0)); err != nil {
		t.Fatal(err)
	}
	// The descriptor goes bad underneath, as when the disk goes away
	// (under the writer's locks: its background sync reads w.f).
	w.mu.Lock()
	w.fileMu.Lock()
	w.f.Close()
	w.fileMu.Unlock()
	w.mu.Unlock()
	if err := w.Append(call(1)); err == nil {
		t.Fatal("append to a closed file succeeded")
	}
	// Even with a working file again, the writer stays broken: it no
	// longer knows what is on disk.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	w.mu.Lock()
	w.fileMu.Lock()
	w.f = f
	w.fileMu.Unlock()
	w.mu.Unlock()
	err = w.Append(call(2))
	if err == nil || !strings.Contains(err.Error(), "broken") {
		t.Fatalf("broken writer appended: %v", err)
	}
	if rep := verifyOK(t, path); rep.Records != 1 {
		t.Errorf("%d records, want 1", rep.Records)
	}
}

func TestClosedWriterRefusesAppends(t *testing.T) {
	w, err := Open(filepath.Join(t.TempDir(), "audit.log"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	if err := w.Append(call(0)); err == nil {
		t.Fatal("append after Close succeeded")
	}
	if err := w.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestBadArgumentsLeaveWriterSound(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	w, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.Append(&Record{Event: EventCall, Arguments: json.RawMessage(`{"code":`)}); err == nil {
		t.Fatal("invalid arguments accepted")
	}
	r := call(0)
	if err := w.Append(r); err != nil {
		t.Fatal(err)
	}
	if r.Seq != 1 {
		t.Errorf("seq %d, want 1", r.Seq)
	}
	verifyOK(t, path)
}

func TestErrorCapped(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	w, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	r := &Record{Event: EventCall, Error: strings.Repeat("é", 5000)}
	if err := w.Append(r); err != nil {
		t.Fatal(err)
	}
	if len(r.Error) > MaxErrorBytes || !utf8.ValidString(r.Error) || !strings.HasSuffix(r.Error, "[truncated]") {
		t.Errorf("error kept as %d bytes, valid UTF-8 %v: ...%s", len(r.Error), utf8.ValidString(r.Error), r.Error[len(r.Error)-20:])
	}
	verifyOK(t, path)
}

func TestConcurrentAppends(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	// Small files, so rotation races with the appends too.
	w, err := Open(path, Options{MaxSize: 8 << 10})
	if err != nil {
		t.Fatal(err)
	}
	const goroutines, each = 32, 25
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				if err := w.Append(call(g*each + i)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	w.Close()
	files, err := Files(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 3 {
		t.Errorf("only %d files: no rotation", len(files))
	}
	rep := verifyOK(t, files...)
	if rep.Records != goroutines*each+int64(len(files)-1) {
		t.Errorf("%d records in %d files, want %d calls and a rotate record per rotation", rep.Records, len(files), goroutines*each)
	}
}

func TestRotation(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	const max = 2000
	writeLog(t, path, 30, Options{MaxSize: max})
	files, err := Files(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 3 {
		t.Fatalf("files %v: want rotation", files)
	}
	for i, f := range files {
		if want := fmt.Sprintf("%s.%d", path, i+1); i < len(files)-1 && f != want {
			t.Errorf("files[%d] = %s, want %s", i, f, want)
		}
		if st, _ := os.Stat(f); st.Size() > max {
			t.Errorf("%s is %d bytes, above MaxSize %d", f, st.Size(), max)
		}
		if i == 0 {
			continue
		}
		r, _, err := parseLine(bytes.TrimSuffix(readLines(t, f)[0], []byte("\n")))
		if err != nil {
			t.Fatal(err)
		}
		if r.Event != EventRotate || r.Detail["previous_file"] != filepath.Base(files[i-1]) {
			t.Errorf("%s starts with %s %v, want a rotate record naming %s", f, r.Event, r.Detail, filepath.Base(files[i-1]))
		}
	}
	if files[len(files)-1] != path {
		t.Errorf("last file %s, want %s", files[len(files)-1], path)
	}
	all, err := Last(files, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var last time.Time
	for _, l := range all {
		r, _, _ := parseLine(l)
		if r.Time.Before(last) {
			t.Errorf("seq %d (%s) has time %v before %v", r.Seq, r.Event, r.Time, last)
		}
		last = r.Time
	}
	rep := verifyOK(t, files...)
	if rep.Records != 30+int64(len(files)-1) || rep.Files != int64(len(files)) {
		t.Errorf("report %+v for %d files", rep, len(files))
	}

	// A reopened writer keeps rotating to the next free name.
	w, err := Open(path, Options{MaxSize: max})
	if err != nil {
		t.Fatal(err)
	}
	// A record larger than MaxSize rotates once, then goes in alone.
	big := call(99)
	big.Error = strings.Repeat("x", 3000)
	if err := w.Append(big); err != nil {
		t.Fatal(err)
	}
	if err := w.Append(call(100)); err != nil {
		t.Fatal(err)
	}
	w.Close()
	files2, _ := Files(path)
	if len(files2) != len(files)+2 {
		t.Errorf("after a large record: %d files, want %d", len(files2), len(files)+2)
	}
	verifyOK(t, files2...)
}

func TestOpenContinuesFromRotatedSibling(t *testing.T) {
	// A crash between the rename of a rotation and the rotate record
	// leaves the chain's end in path.1 and no path.
	path := filepath.Join(t.TempDir(), "audit.log")
	writeLog(t, path, 3, Options{})
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	w, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Append(call(3)); err != nil {
		t.Fatal(err)
	}
	w.Close()
	rep := verifyOK(t, path+".1", path)
	if rep.Records != 5 {
		t.Errorf("%d records, want 3 + rotate + 1", rep.Records)
	}
	r, _, _ := parseLine(bytes.TrimSuffix(readLines(t, path)[0], []byte("\n")))
	if r == nil || r.Event != EventRotate || r.Detail["previous_file"] != "audit.log.1" {
		t.Errorf("first record of the new file: %+v", r)
	}
}

func TestOpenRefusesDamagedSibling(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	writeLog(t, path, 3, Options{})
	b, _ := os.ReadFile(path)
	os.WriteFile(path+".1", b[:len(b)-1], 0o600)
	os.Remove(path)
	if w, err := Open(path, Options{}); err == nil {
		w.Close()
		t.Fatal("continued from a partial sibling")
	} else if !strings.Contains(err.Error(), path+".1") {
		t.Errorf("error does not name the sibling: %v", err)
	}
}

// TestBackgroundSync appends without SyncEach: each record is in the file
// when Append returns (a server crash loses nothing), and the chain is
// whole after Close, which syncs.
func TestBackgroundSync(t *testing.T) {
	for _, each := range []bool{false, true} {
		path := filepath.Join(t.TempDir(), "audit.log")
		w, err := Open(path, Options{SyncEach: each})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 50 {
			if err := w.Append(&Record{Event: "call", Tool: "run_python"}); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if got := bytes.Count(b, []byte("\n")); got != i+1 {
				t.Fatalf("SyncEach=%v: %d lines in the file after %d appends", each, got, i+1)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if err := w.Append(&Record{Event: "call"}); err == nil {
			t.Errorf("SyncEach=%v: Append after Close succeeded", each)
		}
		if err := w.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
		rep, err := Verify([]string{path})
		if err != nil || rep.Records != 50 {
			t.Errorf("SyncEach=%v: verify: %v %+v", each, err, rep)
		}
	}
}

// TestAppendDuringSync: a record is appended while the background sync
// of earlier ones is under way, rather than after it (a sync takes
// 0.5-1.5 ms, which every governed call waited for).
func TestAppendDuringSync(t *testing.T) {
	entered, release := make(chan struct{}, 1), make(chan struct{})
	backgroundSync = func(f *os.File) error {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-release
		return datasync(f)
	}
	t.Cleanup(func() { backgroundSync = datasync })
	w, err := Open(filepath.Join(t.TempDir(), "audit.log"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Append(&Record{Event: "call", Tool: "run_python"}); err != nil {
		t.Fatal(err)
	}
	<-entered
	done := make(chan error, 1)
	go func() { done <- w.Append(&Record{Event: "call", Tool: "run_python"}) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute): // a hang guard only
		t.Fatal("an append waited for the background sync")
	}
	close(release)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}
