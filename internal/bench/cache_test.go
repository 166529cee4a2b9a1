package bench

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/pysandbox/pysandbox/internal/testutil"
)

// TestWriteTree: the files a spec names, of random but repeatable bytes.
func TestWriteTree(t *testing.T) {
	spec := []treeFiles{
		{3, 100, func(i int) string { return fmt.Sprintf("pkg%d/mod.py", i) }},
		{1, 5000, func(i int) string { return "pkg0/data/blob.bin" }},
	}
	a, b := t.TempDir(), t.TempDir()
	for _, dir := range []string{a, b} {
		total, err := writeTree(dir, spec)
		if err != nil || total != 5300 {
			t.Fatalf("%d %v", total, err)
		}
	}
	for _, name := range []string{"pkg0/mod.py", "pkg1/mod.py", "pkg2/mod.py", "pkg0/data/blob.bin"} {
		x, err1 := os.ReadFile(filepath.Join(a, name))
		y, err2 := os.ReadFile(filepath.Join(b, name))
		if err1 != nil || err2 != nil || !bytes.Equal(x, y) || bytes.Count(x, []byte{0}) == len(x) {
			t.Errorf("%s: %v %v", name, err1, err2)
		}
	}
}

// TestCacheReport: what `bench --cache` prints, for the 200 MB tree.
func TestCacheReport(t *testing.T) {
	var total int64
	for _, f := range envTree {
		total += int64(f.count) * int64(f.size)
	}
	var b bytes.Buffer
	writeCache(&b, total, durations(610, 655, 700), durations(820, 870, 990))
	testutil.Golden(t, filepath.Join("testdata", "cache.golden"), b.Bytes(), *update)
}
