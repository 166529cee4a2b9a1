package audit

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	w, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range []string{"run_python", "validate_script", "run_python"} {
		w.Append(&Record{Event: EventCall, Tool: tool})
	}
	_, head := w.Head()
	w.Close()
	var tools []string
	var last string
	if err := Read([]string{path}, func(r *Record, hash string) bool {
		tools = append(tools, r.Tool)
		last = hash
		return len(tools) < 2
	}); err != nil {
		t.Fatal(err)
	}
	if len(tools) != 2 || tools[1] != "validate_script" {
		t.Errorf("%v", tools)
	}
	Read([]string{path}, func(r *Record, hash string) bool { last = hash; return true })
	if last != head {
		t.Errorf("last hash %s, head %s", last, head)
	}
}

// TestReadChecked: an edited record and a broken line are skipped and
// reported, with their line numbers.
func TestReadChecked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	w, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range []string{"a", "b", "c", "d"} {
		w.Append(&Record{Event: EventCall, Tool: tool})
	}
	w.Close()
	data, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	lines[0] = strings.Replace(lines[0], `"tool":"a"`, `"tool":"x"`, 1) // edited
	lines[2] = lines[2][:20]                                            // broken
	os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600)
	var tools []string
	var bad []string
	if err := ReadChecked([]string{path}, func(r *Record, _ string) bool { tools = append(tools, r.Tool); return true },
		func(p string, line int, err error) { bad = append(bad, fmt.Sprint(line, ": ", err)) }); err != nil {
		t.Fatal(err)
	}
	if strings.Join(tools, ",") != "b,d" || len(bad) != 2 || !strings.HasPrefix(bad[0], "1: ") || !strings.HasPrefix(bad[1], "3: ") {
		t.Errorf("tools %q, bad %q", tools, bad)
	}
}

// TestReadCheckedLongLine: a line too long to be a record is reported and
// skipped, and the records after it are read.
func TestReadCheckedLongLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	w, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	w.Append(&Record{Event: EventCall, Tool: "before"})
	w.Close()
	f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	f.Write([]byte("{" + strings.Repeat("x", maxLineBytes+10) + "\n"))
	f.Close()
	w, err = Open(path+".2", Options{})
	if err != nil {
		t.Fatal(err)
	}
	w.Append(&Record{Event: EventCall, Tool: "after"})
	w.Close()
	var tools, bad []string
	err = ReadChecked([]string{path, path + ".2"}, func(r *Record, _ string) bool { tools = append(tools, r.Tool); return true },
		func(p string, line int, err error) {
			bad = append(bad, fmt.Sprint(filepath.Base(p), ":", line, ": ", err))
		})
	if err != nil || strings.Join(tools, ",") != "before,after" || len(bad) != 1 || !strings.Contains(bad[0], "audit.log:2: line longer") {
		t.Errorf("err %v, tools %q, bad %q", err, tools, bad)
	}
}
