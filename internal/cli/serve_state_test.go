package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestStateDirDefault: the state directory follows the XDG base
// directories, and root's is the system's.
func TestStateDirDefault(t *testing.T) {
	t.Setenv("XDG_STATE_HOME", "/srv/state")
	if got := defaultStateDir(); got != "/srv/state/pysandbox" {
		t.Errorf("with XDG_STATE_HOME: %s", got)
	}
	// A relative XDG_STATE_HOME is invalid by the specification: ignored.
	t.Setenv("XDG_STATE_HOME", "rel/state")
	want := "/var/lib/pysandbox"
	if os.Geteuid() != 0 {
		home, _ := os.UserHomeDir()
		want = filepath.Join(home, ".local", "state", "pysandbox")
	}
	if got := defaultStateDir(); got != want {
		t.Errorf("default: %s, want %s", got, want)
	}
	f := stateFlags{dir: "none"}
	if f.stateDir() != "" {
		t.Errorf("none: %q", f.stateDir())
	}
}

func TestStateFlagsChecked(t *testing.T) {
	for _, args := range [][]string{
		{"--checkpoint", "sometimes"},
		{"--state-dir", "relative/dir"},
		{"--paused-ttl", "0s"},
		{"--max-snapshot", "1KiB"},
		{"--max-snapshot", "2GiB", "--max-snapshots-per-caller", "1GiB"},
		{"--max-paused-per-caller", "0"},
	} {
		fs, cfg := newServeFlags(nil)
		if err := fs.Parse(args); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if err := cfg.State.check(); err == nil || !strings.Contains(err.Error(), strings.TrimPrefix(args[0], "--")) && !strings.Contains(err.Error(), "--") {
			t.Errorf("%v: %v", args, err)
		}
	}
	fs, cfg := newServeFlags(nil)
	fs.Parse([]string{"--state-dir", "none", "--checkpoint", "every-run"})
	if err := cfg.State.check(); err != nil {
		t.Errorf("valid flags refused: %v", err)
	}
}
