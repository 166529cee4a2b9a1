package bench

import (
	"bytes"
	"path/filepath"
	"testing"

	"github.com/pysandbox/pysandbox/internal/testutil"
)

// fullReport is a full bench's figures, as a quiet run on a 2-CPU
// machine gives them.
func fullReport() latencyReport {
	return latencyReport{
		sandbox: "native", preload: "pandas", python: "/usr/bin/python3", poolSize: 4, n: 5, cpus: 2,
		baseline:        "/usr/bin/python3",
		base:            durations(40.1, 42.0, 43.4, 45.0, 61.2),
		eng1:            durations(4.1, 4.5, 4.8, 5.0, 9.9),
		engB2B:          durations(20.5, 22.0, 23.1, 25.0, 31.0),
		mcpStdio:        durations(6.1, 6.5, 6.9, 7.2, 11.9),
		mcpB2B:          durations(21.0, 22.2, 23.0, 24.0, 30.0),
		mcpUngoverned:   durations(6.0, 6.4, 6.8, 7.1, 11.5),
		mcpGoverned:     durations(6.3, 6.8, 7.1, 7.5, 12.5),
		mcpRules:        durations(15.1, 16.0, 16.4, 17.2, 21.9),
		mcpProgress:     durations(6.4, 6.9, 7.3, 7.7, 13.0),
		flooded:         durations(8.0, 9.1, 10.2, 12.0, 20.0),
		hasPandas:       true,
		coldPandas:      durations(540, 548, 560),
		pandasRuns:      durations(4.2, 4.7, 4.9, 5.3, 8.8),
		learned:         durations(4.4, 4.9, 5.1, 5.5, 9.0),
		session:         durations(0.4, 0.45, 0.5, 0.6, 1.1),
		throughputCalls: 200, concurrency: 16, pooledPerSecond: 31.2, spawnedPerSecond: 30.9,
	}
}

// write is the report as the suite writes it, part by part.
func (r *latencyReport) write() []byte {
	var b bytes.Buffer
	r.writeHeader(&b)
	r.writeBaseline(&b)
	r.writeCalls(&b)
	r.writeFlood(&b)
	r.writePandas(&b)
	if r.hasPandas && r.learned != nil {
		r.writeLearned(&b)
	}
	r.writeSession(&b)
	r.writeThroughput(&b)
	return b.Bytes()
}

// TestLatencyReport: the full bench's report, which docs/performance.md quotes.
func TestLatencyReport(t *testing.T) {
	noPandas := fullReport()
	noPandas.hasPandas, noPandas.preload = false, ""
	notLearned := fullReport()
	notLearned.learned = nil
	for _, tc := range []struct {
		name string
		r    latencyReport
	}{
		{"latency", fullReport()},
		{"latency_no_pandas", noPandas},
		{"latency_not_learned", notLearned},
	} {
		testutil.Golden(t, filepath.Join("testdata", tc.name+".golden"), tc.r.write(), *update)
	}
}
