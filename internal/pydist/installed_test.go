package pydist

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/pysandbox/pysandbox/internal/deps"
)

// A prerelease keeps its name once installed: the policy is asked about
// "3.15.0rc1", not a "3.15.0" it is not.
func TestPrereleaseKeepsItsName(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "bin"), 0o755)
	os.WriteFile(filepath.Join(dir, "bin", "python3.15"), []byte("x"), 0o755)
	it, ok := interpreterOf(&deps.Env{Kind: deps.KindPython, Python: "3.15.0rc1", Site: dir})
	if !ok || it.Version != "3.15.0rc1" || it.MajorMinor() != "3.15" || !matches(it, Request{Version: "3.15"}) {
		t.Fatalf("%+v %v", it, ok)
	}
}
