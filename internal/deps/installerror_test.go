package deps

import (
	"strings"
	"testing"

	"github.com/pysandbox/pysandbox/internal/sandbox"
)

func TestInstallErrorMessage(t *testing.T) {
	t.Parallel()
	c := &Cache{cfg: Config{}}
	out := newOutput(maxOutput, nil)
	out.Write([]byte("Looking in indexes: http://127.0.0.1/simple/\nERROR: Could not find a version that satisfies the requirement Nosuch_Pkg>=1 (from versions: none)\nERROR: No matching distribution found for Nosuch_Pkg>=1\n"))
	e := c.installError(out, sandbox.Exit{Code: 1}, []string{"nosuch-pkg>=1", "other"}, "3.11.2")
	if e.Requirement != "nosuch-pkg>=1" {
		t.Errorf("Requirement = %q", e.Requirement)
	}
	msg := e.Error()
	t.Log(msg)
	if !strings.HasPrefix(msg, "deps: cannot install nosuch-pkg>=1: No matching distribution found for Nosuch_Pkg>=1\n") {
		t.Errorf("Error() = %q", msg)
	}
	// No error lines: the last lines stand in.
	out = newOutput(16, nil)
	out.Write([]byte("Traceback (most recent call last):\n  boom\nRuntimeError: broken"))
	e = c.installError(out, sandbox.Exit{Code: 1}, []string{"x"}, "3.11.2")
	if e.Requirement != "" || !strings.Contains(e.Error(), "RuntimeError: broken") || !strings.HasSuffix(e.Output, "[output truncated]\n") {
		t.Errorf("%q %q", e.Error(), e.Output)
	}
}
