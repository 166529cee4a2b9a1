package cli

import (
	"slices"
	"testing"
)

// TestFilterBenchFlags: the servers bench starts get the shared flags, in
// every spelling, and none of bench's own.
func TestFilterBenchFlags(t *testing.T) {
	for _, tc := range []struct {
		args, want []string
	}{
		{nil, nil},
		{[]string{"-n", "5", "--pool-size", "2"}, []string{"--pool-size", "2"}},
		{[]string{"--n=5", "-concurrency", "4", "--baseline=/usr/bin/python3.12", "--memory", "1GiB"}, []string{"--memory", "1GiB"}},
		{[]string{"--phases", "-network", "--tools", "-cache", "--preload", "numpy"}, []string{"--preload", "numpy"}},
		{[]string{"--replicas", "-replicas", "--pool-size", "1"}, []string{"--pool-size", "1"}},
		{[]string{"--allow-net", "a.example", "--baseline", "/x", "--allow-net=b.example"}, []string{"--allow-net", "a.example", "--allow-net=b.example"}},
		{[]string{"--network-x", "--no-index"}, []string{"--network-x", "--no-index"}},
		{[]string{"--cpuprofile", "/tmp/p", "-cpuprofile=/tmp/q", "--cpus", "2"}, []string{"--cpus", "2"}},
	} {
		if got := filterBenchFlags(tc.args); !slices.Equal(got, tc.want) {
			t.Errorf("%q: %q, want %q", tc.args, got, tc.want)
		}
	}
}
