package deps

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pysandbox/pysandbox/internal/sandbox"
)

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	private := t.TempDir()
	if err := os.Chmod(private, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, ix := range []IndexConfig{
		{IndexURL: "ftp://example.org/"},
		{ExtraIndexURLs: []string{"file:///etc"}},
		{FindLinks: []string{"relative/dir"}},
		{FindLinks: []string{"/nonexistent/wheels"}},
		{NoIndex: true},
	} {
		if _, err := New(Config{Dir: t.TempDir(), Backend: sandbox.None{}, Index: ix}); err == nil {
			t.Errorf("%+v accepted", ix)
		}
	}
	if os.Geteuid() == 0 {
		_, err := New(Config{Dir: t.TempDir(), Backend: sandbox.None{}, Index: IndexConfig{NoIndex: true, FindLinks: []string{private}}})
		if err == nil || !strings.Contains(err.Error(), "readable") {
			t.Errorf("private wheelhouse: %v", err)
		}
	}
	dir := filepath.Join(t.TempDir(), "c")
	if _, err := New(Config{Dir: dir, Backend: sandbox.None{}}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("cache dir mode: %v %v", fi.Mode(), err)
	}
}
