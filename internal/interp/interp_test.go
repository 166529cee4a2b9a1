package interp

import (
	"context"
	"os"
	"runtime"
	"strings"
	"testing"
)

func TestFindDefault(t *testing.T) {
	it, err := Find(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	if it.Prefix == "" || !strings.HasPrefix(it.Version, "3.") || !it.Supported {
		t.Errorf("%+v", it)
	}
}

func TestFindByVersionAndPath(t *testing.T) {
	ctx := context.Background()
	all := Discover(ctx)
	if len(all) == 0 {
		t.Fatal("no interpreters discovered")
	}
	for _, it := range all {
		if !it.Supported {
			continue
		}
		got, err := Find(ctx, it.MajorMinor())
		if err != nil {
			t.Errorf("Find(%s): %v", it.MajorMinor(), err)
			continue
		}
		if got.MajorMinor() != it.MajorMinor() {
			t.Errorf("Find(%s) gave %s", it.MajorMinor(), got.Version)
		}
		byPath, err := Find(ctx, it.Path)
		if err != nil || byPath.Version != it.Version {
			t.Errorf("Find(%s): %v %v", it.Path, byPath, err)
		}
	}
}

func TestFindErrors(t *testing.T) {
	ctx := context.Background()
	_, err := Find(ctx, "3.99")
	if err == nil || !strings.Contains(err.Error(), "available:") {
		t.Errorf("unknown version: %v", err)
	}
	if _, err := Find(ctx, "python; rm -rf /"); err == nil {
		t.Error("junk accepted")
	}
	if _, err := Find(ctx, "/bin/true"); err == nil {
		t.Error("/bin/true accepted as Python")
	}
	if _, err := Find(ctx, "/nonexistent/python3"); err == nil {
		t.Error("missing path accepted")
	}
	// An interpreter older than MinVersion is found but refused.
	old := os.ExpandEnv("$HOME/.pyenv/versions/3.7.16/bin/python3")
	if _, err := os.Stat(old); err == nil {
		if _, err := Find(ctx, old); err == nil || !strings.Contains(err.Error(), "needs 3.8") {
			t.Errorf("3.7 accepted: %v", err)
		}
	}
}

func TestArch(t *testing.T) {
	want := map[string]string{"amd64": "x86_64", "arm64": "aarch64"}[runtime.GOARCH]
	if want == "" {
		want = runtime.GOARCH
	}
	if got := Arch(); got != want {
		t.Errorf("Arch() = %s, want %s", got, want)
	}
}
