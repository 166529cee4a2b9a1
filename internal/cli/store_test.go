package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadApprovalKey(t *testing.T) {
	dir := t.TempDir()
	want := bytes.Repeat([]byte{0xab}, 32)
	for name, content := range map[string]string{
		"raw":    string(want),
		"hex":    strings.Repeat("ab", 32) + "\n",
		"base64": "q6urq6urq6urq6urq6urq6urq6urq6urq6urq6urq6s=\n",
	} {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(content), 0o600)
		if k, err := readApprovalKey(p); err != nil || !bytes.Equal(k, want) {
			t.Errorf("%s: %x %v", name, k, err)
		}
	}
	short := filepath.Join(dir, "short")
	os.WriteFile(short, []byte("abcd"), 0o600)
	if _, err := readApprovalKey(short); err == nil || !strings.Contains(err.Error(), "want 32 bytes") {
		t.Errorf("short: %v", err)
	}
	open := filepath.Join(dir, "open")
	os.WriteFile(open, []byte(strings.Repeat("ab", 32)), 0o644)
	if _, err := readApprovalKey(open); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("readable by others: %v", err)
	}
}
