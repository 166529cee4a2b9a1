package cli

import (
	"bytes"
	"strings"
	"testing"
)

// TestRunNeedsFile: run without a FILE says what it takes.
func TestRunNeedsFile(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Main([]string{"run", "--timeout", "2s"}, strings.NewReader(""), &out, &errb); code != 2 || !strings.Contains(errb.String(), "run takes a FILE (or - for stdin)") {
		t.Errorf("exit %d: %s", code, errb.String())
	}
}
