package bench

import (
	"bytes"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/testutil"
)

func TestToolsReport(t *testing.T) {
	var b bytes.Buffer
	writeTools(&b, 5, durations(0.30, 0.34, 0.36, 0.40, 0.81), durations(0.61, 0.66, 0.70, 0.75, 1.90), durations(0.90, 0.95, 0.98, 1.10, 2.40))
	testutil.Golden(t, filepath.Join("testdata", "tools.golden"), b.Bytes(), *update)
}

// TestRunDurations reads run_python's structured result: the durations
// of a successful run that returned n of them, sorted; nothing otherwise.
func TestRunDurations(t *testing.T) {
	for _, tc := range []struct {
		name       string
		structured any
		n          int
		want       []time.Duration
		status     string
	}{
		{"success", map[string]any{"status": "success", "return_value": []any{0.002, 0.001, 0.0015}}, 3, durations(1, 1.5, 2), "success"},
		{"too few", map[string]any{"status": "success", "return_value": []any{0.001}}, 3, nil, "success"},
		{"no tools yet", map[string]any{"status": "error", "stderr": "AttributeError: bench"}, 3, nil, "error"},
		{"not a list", map[string]any{"status": "success", "return_value": "x"}, 1, nil, "success"},
		{"nothing", nil, 1, nil, ""},
	} {
		d, status, _ := runDurations(tc.structured, tc.n)
		if !slices.Equal(d, tc.want) || status != tc.status {
			t.Errorf("%s: %v %q, want %v %q", tc.name, d, status, tc.want, tc.status)
		}
	}
}
