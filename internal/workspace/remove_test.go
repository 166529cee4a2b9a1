package workspace

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestRemove(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "a/b"), 0o755)
	os.WriteFile(filepath.Join(root, "a/b/f.txt"), []byte("x"), 0o644)
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "keep.txt"), []byte("x"), 0o644)
	os.Symlink(outside, filepath.Join(root, "link"))
	os.Symlink(filepath.Join(outside, "keep.txt"), filepath.Join(root, "a/l.txt"))
	f, err := os.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	d, err := Open(f)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Remove("a/b/f.txt"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "a/b/f.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Error("the file is still there")
	}
	if err := d.Remove("a/b/none.txt"); err != nil {
		t.Errorf("a missing file: %v", err)
	}
	if err := d.Remove("link/keep.txt"); err == nil {
		t.Error("removed through a symlinked directory")
	}
	if err := d.Remove("a/l.txt"); err != nil {
		t.Errorf("a link itself: %v", err)
	}
	if _, err := os.Stat(filepath.Join(outside, "keep.txt")); err != nil {
		t.Error("the link's target went too")
	}
	if err := d.Remove("a/b"); !errors.Is(err, ErrNotRegular) {
		t.Errorf("a directory: %v", err)
	}
}
