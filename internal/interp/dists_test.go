package interp

import (
	"context"
	"path/filepath"
	"testing"
)

func TestDistName(t *testing.T) {
	for _, c := range []struct{ entry, name, version, py string }{
		{"pandas-1.5.3.egg-info", "pandas", "1.5.3", ""},
		{"python_dateutil-2.8.2.egg-info", "python-dateutil", "2.8.2", ""},
		{"six-1.16.0-py3.11.egg-info", "six", "1.16.0", "3.11"},
		{"Jinja2-3.1.2.dist-info", "jinja2", "3.1.2", ""},
		{"zope.interface-5.5.2.dist-info", "zope-interface", "5.5.2", ""},
		{"numpy", "", "", ""},
		{"broken.dist-info", "", "", ""},
		{"x-not a version.dist-info", "", "", ""},
	} {
		name, version, py, ok := distName(c.entry)
		if name != c.name || version != c.version || py != c.py || ok != (c.name != "") {
			t.Errorf("distName(%q) = %q %q %q %v, want %q %q %q", c.entry, name, version, py, ok, c.name, c.version, c.py)
		}
	}
}

// TestDistributions: the system interpreter's own packages, as the
// sandbox sees them (python3-pandas is among the test suite's packages).
func TestDistributions(t *testing.T) {
	it, err := Find(context.Background(), "")
	if err != nil {
		t.Skip("no python3:", err)
	}
	dists, err := it.Distributions(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	matches, _ := filepath.Glob("/usr/lib/python3/dist-packages/pandas-*.egg-info")
	if len(matches) > 0 && it.Path == "/usr/bin/python3.11" && dists["pandas"] == "" {
		t.Errorf("pandas is installed (%s) but not listed: %v", matches[0], dists)
	}
	for name, v := range dists {
		if name == "" || v == "" {
			t.Errorf("%q %q", name, v)
		}
	}
}
