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

// TestInstallErrorCut: the summary holds the installer's lines when they
// fit, so a caller adds them whole only when it cut them (a new user saw
// pip's lines twice in install_package's answer).
func TestInstallErrorCut(t *testing.T) {
	t.Parallel()
	short := &InstallError{Lines: []string{"ERROR: Could not find a version", "ERROR: No matching distribution found for x"}}
	if short.Cut() || !strings.Contains(short.Summary(), "Could not find a version") {
		t.Errorf("short lines: Cut %v, Summary %q", short.Cut(), short.Summary())
	}
	long := &InstallError{Lines: []string{"ERROR: No matching distribution found for x", strings.Repeat("a", 500)}}
	if !long.Cut() || !strings.HasSuffix(long.Summary(), "...") {
		t.Errorf("long lines: Cut %v, Summary %q", long.Cut(), long.Summary())
	}
	// Nothing the installer said is shown when no index answered.
	if (&InstallError{Lines: long.Lines, Unreachable: "127.0.0.1:1"}).Cut() {
		t.Error("an unreachable index: Cut")
	}
}
