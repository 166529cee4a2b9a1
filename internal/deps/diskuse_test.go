package deps

import (
	"os"
	"path/filepath"
	"testing"
)

// TestDiskUsage: an inode is charged InodeCost and its blocks, a sparse
// file only for its data, a hard-linked file once.
func TestDiskUsage(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	sparseFile(t, filepath.Join(dir, "sparse"), 1<<30, 0, nil)
	must(t, os.WriteFile(filepath.Join(dir, "one"), []byte("x"), 0o644))
	must(t, os.Link(filepath.Join(dir, "one"), filepath.Join(dir, "two")))
	must(t, os.Symlink("one", filepath.Join(dir, "link")))
	got, err := diskUsage(dir)
	must(t, err)
	var want int64
	for _, name := range []string{"", "sparse", "one", "link"} {
		want += InodeCost + stat(t, filepath.Join(dir, name)).Blocks*512
	}
	if got != want || got > 4*InodeCost+2*blockSize+blockSize {
		t.Errorf("diskUsage = %d, want %d", got, want)
	}
	if _, err := diskUsage(filepath.Join(dir, "missing")); err == nil {
		t.Errorf("a missing tree measured")
	}
}
