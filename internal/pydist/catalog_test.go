package pydist

import (
	"strings"
	"testing"

	"github.com/pysandbox/pysandbox/internal/pep"
	"github.com/pysandbox/pysandbox/internal/pydist/hostbuild"
)

func TestShippedCatalog(t *testing.T) {
	c := Shipped()
	if len(c.Skipped) != 0 {
		t.Errorf("shipped metadata has entries skipped here: %v", c.Skipped)
	}
	var minors []string
	for _, d := range c.Minors() {
		minors = append(minors, d.MajorMinor())
		if !strings.HasPrefix(d.URL, DefaultPrefix+"/") {
			t.Errorf("%s: URL %s is not under %s", d.Key, d.URL, DefaultPrefix)
		}
	}
	if got := strings.Join(minors, " "); got != "3.15 3.14 3.13 3.12 3.11 3.10 3.9 3.8" {
		t.Errorf("minor versions = %s", got)
	}
	// "3.15" has only a prerelease: it is what "3.15" gets; "3.14" gets
	// its release.
	for _, tc := range []struct{ ask, want string }{{"3.15", "3.15.0rc1"}, {"3.14", "3.14.7"}, {"3.8", "3.8.20"}, {"3.12.14", "3.12.14"}} {
		d, err := c.Find(tc.ask, nil)
		if err != nil || d.Version() != tc.want {
			t.Errorf("Find(%s) = %v, %v; want %s", tc.ask, d, err, tc.want)
		}
	}
}

func TestCatalogSelection(t *testing.T) {
	sum := strings.Repeat("0", 64)
	u := func(name string) string { return DefaultPrefix + "/1/" + name }
	data := hostbuild.Metadata(
		hostbuild.Entry{Major: 3, Minor: 12, Patch: 9, URL: u("a-install_only.tar.gz"), SHA256: sum},
		hostbuild.Entry{Major: 3, Minor: 12, Patch: 13, URL: u("b-install_only_stripped.tar.gz"), SHA256: sum},
		hostbuild.Entry{Major: 3, Minor: 12, Patch: 14, Prerelease: "rc1", URL: u("c-install_only.tar.gz"), SHA256: sum},
		hostbuild.Entry{Major: 3, Minor: 13, Patch: 1, URL: u("full.tar.zst"), SHA256: sum},
		hostbuild.Entry{Major: 3, Minor: 13, Patch: 2, URL: u("d-install_only.tar.gz"), SHA256: "NOTHEX"},
		hostbuild.Entry{Major: 3, Minor: 7, Patch: 17, URL: u("e-install_only.tar.gz"), SHA256: sum},
		hostbuild.Entry{Major: 3, Minor: 13, Patch: 3, URL: "file:///etc/passwd-install_only.tar.gz", SHA256: sum},
	)
	c, err := ParseCatalog(data, "test")
	if err != nil {
		t.Fatal(err)
	}
	if c.Skipped["no sha256"] != 1 || c.Skipped["unsupported version"] != 1 || c.Skipped["not an install_only .tar.gz over http(s)"] != 2 {
		t.Errorf("skipped = %v", c.Skipped)
	}
	// A partial pin is its newest release, not a prerelease of it.
	if d, err := c.Find("3.12", nil); err != nil || d.Version() != "3.12.13" {
		t.Errorf("3.12 = %v %v", d, err)
	}
	if d, err := c.Find("3.12.14rc1", nil); err != nil || d.Version() != "3.12.14rc1" {
		t.Errorf("3.12.14rc1 = %v %v", d, err)
	}
	spec, _ := pep.ParseSpecifierSet("<3.12.10")
	if d, err := c.Find("", &spec); err != nil || d.Version() != "3.12.9" {
		t.Errorf("<3.12.10 = %v %v", d, err)
	}
	for _, ask := range []string{"3.13", "3.7", "3.99"} {
		if d, err := c.Find(ask, nil); err != ErrNoSuchVersion {
			t.Errorf("%s = %v %v, want none", ask, d, err)
		}
	}
	for _, bad := range []string{"[]", "{", `{"a": 1} {}`, strings.Repeat(" ", MaxMetadataBytes+1)} {
		if _, err := ParseCatalog([]byte(bad), "bad"); err == nil {
			t.Errorf("ParseCatalog(%.20q) took it", bad)
		}
	}
}

func TestMirrored(t *testing.T) {
	u := DefaultPrefix + "/20260814/cpython-3.13.1%2B20260814-x86_64-unknown-linux-gnu-install_only.tar.gz"
	for _, tc := range []struct{ mirror, want string }{
		{"", u},
		{"https://mirror.example/pbs", "https://mirror.example/pbs/20260814/cpython-3.13.1%2B20260814-x86_64-unknown-linux-gnu-install_only.tar.gz"},
		{"https://mirror.example/pbs/", "https://mirror.example/pbs/20260814/cpython-3.13.1%2B20260814-x86_64-unknown-linux-gnu-install_only.tar.gz"},
	} {
		if got := Mirrored(u, tc.mirror); got != tc.want {
			t.Errorf("Mirrored(%q) = %s", tc.mirror, got)
		}
	}
	// Only the prefix, at a path boundary, is replaced.
	other := "https://example.com/x-install_only.tar.gz"
	if got := Mirrored(other, "https://m"); got != other {
		t.Errorf("a URL elsewhere became %s", got)
	}
	if got := Mirrored(DefaultPrefix+"x/y", "https://m"); got != DefaultPrefix+"x/y" {
		t.Errorf("a longer prefix became %s", got)
	}
}
