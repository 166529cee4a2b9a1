package audit

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
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
	a := Anchor{Seq: seq, Head: head}
	rep, err := Check([]string{path}, a.Expect())
	if err != nil || rep.ExpectedAt != seq {
		t.Errorf("the whole chain: %v %+v", err, rep)
	}
	data, _ := os.ReadFile(path)
	lines := strings.SplitAfter(string(data), "\n")
	// Cut the last two records: the chain still verifies on its own.
	cut := filepath.Join(t.TempDir(), "cut.log")
	os.WriteFile(cut, []byte(strings.Join(lines[:3], "")), 0o600)
	if _, err := Verify([]string{cut}); err != nil {
		t.Fatalf("a cut chain verifies on its own: %v", err)
	}
	_, err = Check([]string{cut}, a.Expect())
	if !errors.Is(err, ErrEndCut) || !strings.Contains(err.Error(), "cut.log:3 (seq 3): the chain ends at seq 3, but the expected head is seq 5: records were cut from its end") {
		t.Errorf("a cut chain: %v", err)
	}
	// A chain rewritten from seq 3 on, consistent in itself.
	other := filepath.Join(t.TempDir(), "other.log")
	w2, _ := Open(other, Options{})
	for i := 0; i < 5; i++ {
		w2.Append(&Record{Event: EventCall, Tool: "validate_script"})
	}
	w2.Close()
	if _, err := Check([]string{other}, a.Expect()); !errors.Is(err, ErrRewritten) || !strings.Contains(err.Error(), "other.log:5 (seq 5): seq 5 has hash") {
		t.Errorf("a rewritten chain: %v", err)
	}
}

// TestAnchorSignature: an anchor holds only for the replica it was signed
// for, with the token it was signed with, unchanged.
func TestAnchorSignature(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	head := strings.Repeat("ab", 32)
	a := Anchor{Seq: 7, Head: head, Replicas: []string{"r-b", "r-a", "r-b"}}.Sign("r-c", key)
	if !slices.Equal(a.Replicas, []string{"r-a", "r-b", "r-c"}) {
		t.Errorf("replicas %v: want them sorted, once each, with its own", a.Replicas)
	}
	if err := a.Check("r-c", key); err != nil {
		t.Fatalf("a signed anchor: %v", err)
	}
	shorter := a
	shorter.Seq = 5
	dropped := a
	dropped.Replicas = []string{"r-c"}
	for name, tt := range map[string]struct {
		a       Anchor
		replica string
		key     []byte
		want    error
	}{
		"unsigned":           {Anchor{Seq: 7, Head: head}, "r-c", key, ErrUnsigned},
		"a shorter head":     {shorter, "r-c", key, ErrForged},
		"a replica dropped":  {dropped, "r-c", key, ErrForged},
		"another replica's":  {a, "r-a", key, ErrForged},
		"another token":      {a, "r-c", []byte("another token, another deployment"), ErrForged},
		"a made-up sig":      {Anchor{Seq: 7, Head: head, Sig: strings.Repeat("0", 64)}, "r-c", key, ErrForged},
		"signed but no head": {Anchor{Seq: 7}.Sign("r-c", key), "r-c", key, nil},
	} {
		err := tt.a.Check(tt.replica, tt.key)
		if tt.want == nil {
			if err == nil || !strings.Contains(err.Error(), "malformed") {
				t.Errorf("%s: %v, want it malformed", name, err)
			}
			continue
		}
		if !errors.Is(err, tt.want) {
			t.Errorf("%s: %v, want %v", name, err, tt.want)
		}
	}
}
