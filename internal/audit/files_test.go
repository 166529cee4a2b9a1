package audit

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	for _, name := range []string{"audit.log", "audit.log.2", "audit.log.10", "audit.log.1",
		"audit.log.01", "audit.log.0", "audit.log.-1", "audit.log.bak", "audit.log.1.gz", "audit.log.", "other.log.3", "audit.logx.4"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	os.Mkdir(filepath.Join(dir, "audit.log.5"), 0o755)
	got, err := Files(path)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{path + ".1", path + ".2", path + ".10", path}
	if !slices.Equal(got, want) {
		t.Errorf("Files = %v, want %v", got, want)
	}

	// Without the current file, the siblings are still the chain.
	os.Remove(path)
	if got, _ := Files(path); !slices.Equal(got, want[:3]) {
		t.Errorf("without %s: %v", path, got)
	}
	// A bare name lists the working directory's files.
	t.Chdir(dir)
	if got, _ := Files("audit.log"); !slices.Equal(got, []string{"audit.log.1", "audit.log.2", "audit.log.10"}) {
		t.Errorf("relative: %v", got)
	}
}

func TestReadLastLines(t *testing.T) {
	long := strings.Repeat("y", 200<<10) // spans several reads
	for _, tt := range []struct {
		content string
		n       int
		want    []string
		partial int64
	}{
		{"", 3, nil, 0},
		{"a\n", 3, []string{"a"}, 0},
		{"a\nb\nc\n", 2, []string{"b", "c"}, 0},
		{"a\nb\nc\n", 9, []string{"a", "b", "c"}, 0},
		{"a\nb\nc\n", 0, nil, 0},
		{"a\nb\npart", 1, []string{"b"}, 4},
		{"part", 1, nil, 4},
		{"\n\n", 5, []string{"", ""}, 0},
		{"a\n" + long + "\nb\n", 2, []string{long, "b"}, 0},
		{"a\n" + long + "\n" + long, 2, []string{"a", long}, int64(len(long))},
	} {
		path := filepath.Join(t.TempDir(), "f")
		os.WriteFile(path, []byte(tt.content), 0o600)
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		lines, partial, err := readLastLines(f, int64(len(tt.content)), tt.n)
		f.Close()
		got := make([]string, len(lines))
		for i, l := range lines {
			got[i] = string(l)
		}
		name := fmt.Sprintf("%.20q n=%d", tt.content, tt.n)
		if err != nil || !slices.Equal(got, tt.want) || partial != tt.partial {
			t.Errorf("%s: %d lines %v, partial %d, %v; want %d lines, partial %d", name, len(got), short(got), partial, err, len(tt.want), tt.partial)
		}
	}
}

func short(s []string) []string {
	out := make([]string, len(s))
	for i, l := range s {
		out[i] = fmt.Sprintf("%.10q", l)
	}
	return out
}

func TestLinesTooLong(t *testing.T) {
	defer func(n int) { maxLineBytes = n }(maxLineBytes)
	maxLineBytes = 100 << 10
	long := strings.Repeat("z", maxLineBytes+1)
	for name, content := range map[string]string{
		"first":  long + "\na\n",
		"middle": "a\n" + long + "\nb\n",
		"last":   "a\n" + long + "\n",
	} {
		path := filepath.Join(t.TempDir(), "f")
		os.WriteFile(path, []byte(content), 0o600)
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = readLastLines(f, int64(len(content)), 3)
		f.Close()
		if err == nil || !strings.Contains(err.Error(), "longer than") {
			t.Errorf("readLastLines, %s line too long: %v", name, err)
		}
		if name != "first" {
			continue // Verify stops at the malformed "a" first
		}
		_, err = Verify([]string{path})
		var ve *VerifyError
		if !errors.As(err, &ve) || !strings.Contains(ve.Msg, "longer than") {
			t.Errorf("Verify, %s line too long: %v", name, err)
		}
	}
}
