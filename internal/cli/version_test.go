package cli

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestVersionFrom(t *testing.T) {
	stamped := &debug.BuildInfo{Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "abc123"},
		{Key: "vcs.time", Value: "2026-11-26T10:00:00Z"},
		{Key: "vcs.modified", Value: "true"},
	}}
	for _, tc := range []struct {
		name string
		bi   *debug.BuildInfo
		want []string
	}{
		{"stamped", stamped, []string{"commit: abc123+dirty\n", "built: 2026-11-26T10:00:00Z (commit time)\n"}},
		{"go install at a version", &debug.BuildInfo{Main: debug.Module{Version: "v0.1.0"}}, []string{"commit: v0.1.0\n", "built: unknown\n"}},
		// -buildvcs=false records nothing: the line says so and how to fix it.
		{"unstamped", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, []string{"commit: unknown (", "-buildvcs=true"}},
		{"no build info", nil, []string{"commit: unknown (", "pysandbox " + version + "\n"}},
	} {
		got := versionFrom(tc.bi)
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %q lacks %q", tc.name, got, w)
			}
		}
	}
}
