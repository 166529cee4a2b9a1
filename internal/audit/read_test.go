package audit

import (
	"path/filepath"
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
