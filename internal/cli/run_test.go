package cli

import (
	"bytes"
	"strings"
	"testing"
)

// TestRunFlagsAfterFile: flags written after FILE are not taken for more
// files in silence: the error shows the command line that works.
func TestRunFlagsAfterFile(t *testing.T) {
	var out, errb bytes.Buffer
	code := Main([]string{"run", "-", "--timeout", "2s"}, strings.NewReader(""), &out, &errb)
	if code != 2 || !strings.Contains(errb.String(), "flags go before it: pysandbox run --timeout 2s -") {
		t.Errorf("exit %d: %s", code, errb.String())
	}
}
