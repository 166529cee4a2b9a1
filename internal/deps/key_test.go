package deps

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/pysandbox/pysandbox/internal/interp"
)

func TestKeys(t *testing.T) {
	t.Parallel()
	py := &interp.Interpreter{Path: "/usr/bin/python3.11", Version: "3.11.2", Major: 3, Minor: 11, Prefix: "/usr"}
	py12 := &interp.Interpreter{Path: "/root/.pyenv/versions/3.12.1/bin/python3.12", Version: "3.12.1", Major: 3, Minor: 12, Prefix: "/root/.pyenv/versions/3.12.1"}
	samePathOtherVersion := &interp.Interpreter{Path: py.Path, Version: "3.11.9", Major: 3, Minor: 11, Prefix: "/usr"}
	online := newCache(t, IndexConfig{IndexURL: "http://127.0.0.1:1/simple/"})
	other := newCache(t, IndexConfig{IndexURL: "http://127.0.0.1:2/simple/"})
	sdist := newCache(t, IndexConfig{IndexURL: "http://127.0.0.1:1/simple/", AllowSdist: true})

	key := func(c *Cache, py *interp.Interpreter, reqs ...string) string {
		t.Helper()
		k, err := c.Key(py, reqs)
		if err != nil {
			t.Fatal(err)
		}
		if len(k) != 32 {
			t.Fatalf("key %q is not 32 hex chars", k)
		}
		return k
	}
	base := key(online, py, "pysbx-alpha", "pysbx-beta>=1.0,<2")
	for _, same := range [][]string{
		{"pysbx-beta>=1.0,<2", "pysbx-alpha"},
		{"Pysbx_Alpha", "PYSBX.beta <2, >=1.0"},
		{"pysbx-alpha", "pysbx-beta>=1.0,<2", "pysbx_alpha"},
	} {
		if k := key(online, py, same...); k != base {
			t.Errorf("%q: key %s, want %s", same, k, base)
		}
	}
	for name, k := range map[string]string{
		"other set":         key(online, py, "pysbx-alpha"),
		"other specifier":   key(online, py, "pysbx-alpha", "pysbx-beta>=1.0"),
		"other interpreter": key(online, py12, "pysbx-alpha", "pysbx-beta>=1.0,<2"),
		"other version":     key(online, samePathOtherVersion, "pysbx-alpha", "pysbx-beta>=1.0,<2"),
		"other index":       key(other, py, "pysbx-alpha", "pysbx-beta>=1.0,<2"),
		"sdists allowed":    key(sdist, py, "pysbx-alpha", "pysbx-beta>=1.0,<2"),
	} {
		if k == base {
			t.Errorf("%s: same key as the base", name)
		}
	}
	// Extras are normalised and sorted too.
	if key(online, py, "x[B_b,a]") != key(online, py, "X[a,b-b]") {
		t.Error("extras spelling changed the key")
	}
	canon, err := Canonicalize([]string{" PYSBX.beta <2, >=1.0 ", "x[B_b,a]; python_version >= '3'"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"pysbx-beta<2,>=1.0", `x[a,b-b]; python_version >= "3"`}; !slices.Equal(canon, want) {
		t.Errorf("canonical = %q, want %q", canon, want)
	}
}

func TestInvalidAndURLRequirements(t *testing.T) {
	t.Parallel()
	py := &interp.Interpreter{Path: "/usr/bin/python3", Version: "3.11.2", Major: 3, Minor: 11, Prefix: "/usr"}
	c := newCache(t, IndexConfig{IndexURL: "http://127.0.0.1:1/simple/"})
	for _, tc := range []struct {
		reqs []string
		want string
	}{
		{[]string{"pysbx-alpha", "not a requirement!"}, "invalid requirement"},
		{[]string{"--index-url=http://evil/"}, "invalid requirement"},
		{[]string{"pkg @ https://example.com/pkg-1.0-py3-none-any.whl"}, "direct URL requirements"},
		{[]string{"pkg @ file:///etc/shadow"}, "direct URL requirements"},
		{nil, "no requirements"},
	} {
		_, _, err := c.Ensure(context.Background(), py, tc.reqs, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err = %v, want %q", tc.reqs, err, tc.want)
		}
		var ie *InstallError
		if errors.As(err, &ie) {
			t.Errorf("%q: got an InstallError: nothing should have run", tc.reqs)
		}
		if _, err := c.Key(py, tc.reqs); err == nil {
			t.Errorf("%q: Key accepted it", tc.reqs)
		}
	}
	if c.Installs() != 0 {
		t.Errorf("installer ran %d times", c.Installs())
	}
}
