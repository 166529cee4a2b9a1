package audit

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckAnchor: a chain holds its anchored record; one cut short, or
// rewritten from an earlier point, does not.
func TestCheckAnchor(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	w, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		if err := w.Append(&Record{Event: EventCall, Tool: "run_python"}); err != nil {
			t.Fatal(err)
		}
	}
	seq, head := w.Head()
	w.Close()
	rep, err := Verify([]string{path})
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckAnchor([]string{path}, rep, Anchor{Seq: seq, Head: head}); err != nil {
		t.Errorf("the whole chain: %v", err)
	}
	data, _ := os.ReadFile(path)
	lines := strings.SplitAfter(string(data), "\n")
	// Cut the last two records: the chain still verifies on its own.
	cut := filepath.Join(t.TempDir(), "cut.log")
	os.WriteFile(cut, []byte(strings.Join(lines[:3], "")), 0o600)
	rep, err = Verify([]string{cut})
	if err != nil {
		t.Fatalf("a cut chain verifies on its own: %v", err)
	}
	if err := CheckAnchor([]string{cut}, rep, Anchor{Seq: seq, Head: head}); err == nil || !strings.Contains(err.Error(), "cut from its end") {
		t.Errorf("a cut chain: %v", err)
	}
	// A chain rewritten from seq 3 on, consistent in itself.
	other := filepath.Join(t.TempDir(), "other.log")
	w2, _ := Open(other, Options{})
	for i := 0; i < 5; i++ {
		w2.Append(&Record{Event: EventCall, Tool: "validate_script"})
	}
	w2.Close()
	rep, _ = Verify([]string{other})
	if err := CheckAnchor([]string{other}, rep, Anchor{Seq: seq, Head: head}); err == nil || !strings.Contains(err.Error(), "rewritten") {
		t.Errorf("a rewritten chain: %v", err)
	}
}
