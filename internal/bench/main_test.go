package bench

import (
	"flag"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// durations are milliseconds as sorted durations.
func durations(msecs ...float64) []time.Duration {
	d := make([]time.Duration, len(msecs))
	for i, m := range msecs {
		d[i] = time.Duration(m * float64(time.Millisecond))
	}
	return d
}

func mustEqual[T comparable](t *testing.T, what string, got, want T) {
	t.Helper()
	if got != want {
		t.Errorf("%s: got %v, want %v", what, got, want)
	}
}
