package cli

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// version, commit and buildDate are set by scripts/release.sh with
// -ldflags -X; a plain `go build` or `go install` fills in the commit
// from the build's VCS stamp.
var (
	version   = "0.1.0"
	commit    = ""
	buildDate = ""
)

// versionText is `pysandbox version`: the version, the commit it was
// built from (with "+dirty" for uncommitted changes), when it was built,
// and the Go that built it.
func versionText() string {
	bi, _ := debug.ReadBuildInfo()
	return versionFrom(bi)
}

// unstamped says why a build has no commit, since "unknown" alone left a
// user who built from a git checkout guessing: Go records the commit only
// when VCS stamping is on, and GOFLAGS=-buildvcs=false (which some
// machines set in `go env`) turns it off without a word.
const unstamped = "unknown (this binary has no VCS stamp: it was built outside a git checkout, or with -buildvcs=false, which GOFLAGS may set; build with `go build -buildvcs=true ./cmd/pysandbox` or scripts/release.sh to record it)"

func versionFrom(bi *debug.BuildInfo) string {
	c, date, dirty := commit, buildDate, false
	if bi != nil {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if c == "" {
					c = s.Value
				}
			case "vcs.time":
				if date == "" {
					date = s.Value + " (commit time)"
				}
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if c == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			c = bi.Main.Version // go install …@version
		}
	}
	if c == "" {
		c = unstamped
	} else if dirty && !strings.HasSuffix(c, "+dirty") {
		c += "+dirty"
	}
	if date == "" {
		date = "unknown"
	}
	return fmt.Sprintf("pysandbox %s\ncommit: %s\nbuilt: %s\ngo: %s %s/%s\n", version, c, date, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
