package cli

import (
	"flag"
	"io"
	"testing"

	"github.com/pysandbox/pysandbox/internal/launcher"
)

// TestLauncherFlags: the launcher, which cannot import this package (it
// builds on macOS and Windows), knows serve's flags: which are boolean
// (take no value), and which name files it must mount into the
// container.
func TestLauncherFlags(t *testing.T) {
	fs, _ := newServeFlags(io.Discard)
	fs.VisitAll(func(f *flag.Flag) {
		b, ok := f.Value.(interface{ IsBoolFlag() bool })
		isBool := ok && b.IsBoolFlag()
		if isBool != launcher.BoolFlags[f.Name] {
			t.Errorf("--%s: boolean %v, launcher.BoolFlags says %v", f.Name, isBool, launcher.BoolFlags[f.Name])
		}
		_, file := launcher.FileFlags[f.Name]
		if serveFileFlags[f.Name] != file {
			t.Errorf("--%s: a file flag %v, launcher.FileFlags says %v", f.Name, serveFileFlags[f.Name], file)
		}
	})
	for name := range launcher.FileFlags {
		if fs.Lookup(name) == nil {
			t.Errorf("launcher.FileFlags names --%s, which serve does not have", name)
		}
	}
}
