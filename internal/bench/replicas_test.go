package bench

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/pysandbox/pysandbox/internal/testutil"
)

func TestReplicasReport(t *testing.T) {
	var b bytes.Buffer
	writeReplicas(&b, 5, durations(1.80, 1.90, 2.00, 2.10, 4.00), durations(2.40, 2.60, 2.75, 3.00, 6.50))
	testutil.Golden(t, filepath.Join("testdata", "replicas.golden"), b.Bytes(), *update)
}

// TestReplicaDurations runs the measurement for real: the pysandbox
// binary built from this tree as two replicas on a redis-server of their
// own, a session made at one and called at it and through the other. What
// the calls take is not checked, only that each was made and answered.
func TestReplicaDurations(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and starts two servers")
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redis-server is not installed (apt-get install redis-server): %v", err)
	}
	bin := filepath.Join(t.TempDir(), "pysandbox")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/pysandbox").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	os.Chmod(filepath.Dir(bin), 0o755)
	at, through, err := replicaDurations(context.Background(), Config{N: 3, Version: "test", ServeArgs: []string{"--pool-size", "1"}}, bin)
	if err != nil {
		t.Fatal(err)
	}
	if len(at) != 3 || len(through) != 3 {
		t.Fatalf("%d calls at the owner and %d through the other, want 3 each", len(at), len(through))
	}
	for _, d := range append(at, through...) {
		if d <= 0 {
			t.Errorf("a call took %v", d)
		}
	}
}
