package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSetupFlagsAroundTheClient: flags before and after the client both
// count (Go's flag package stops at the first non-flag); a stray
// argument or an unknown client is refused.
func TestSetupFlagsAroundTheClient(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "mcp.json")
	var out, errOut bytes.Buffer
	if code := Main([]string{"setup", "--write", "cursor", "--file", file, "--name", "mine"}, strings.NewReader(""), &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	data, err := os.ReadFile(file)
	if err != nil || !strings.Contains(string(data), `"mine"`) {
		t.Fatalf("the file: %s (%v)", data, err)
	}
	for _, args := range [][]string{{"setup", "cursor", "extra"}, {"setup", "cursr"}} {
		if code := Main(args, strings.NewReader(""), &out, &errOut); code == 0 {
			t.Errorf("%v was accepted", args)
		}
	}
}
