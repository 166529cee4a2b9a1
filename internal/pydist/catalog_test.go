package pydist

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

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

// Metadata behind a URL is fetched through the proxy on first need.
func TestMetadataFromURL(t *testing.T) {
	a := systemArchive(t)
	f := newFixture(t)
	f.mirror.PutBytes("/meta.json", hostbuild.Metadata(hostbuild.EntryOf(a, DefaultPrefix+"/"+tag+"/"+a.Name())))
	f.m.cfg.Metadata, f.m.catalog = f.mirror.URL+"/meta.json", nil
	if _, err := f.m.Find(ctxFor(t), Request{Version: a.MajorMinor()}); err != nil {
		t.Fatal(err)
	}
	if f.mirror.Hits("/meta.json") != 1 {
		t.Errorf("metadata hits = %d", f.mirror.Hits("/meta.json"))
	}
	// A URL that does not answer: a clear error, and a retry next time.
	f.m.cfg.Metadata, f.m.catalog = f.mirror.URL+"/missing.json", nil
	_, err := f.m.Catalog(ctxFor(t), Who{})
	if err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("missing metadata: %v", err)
	}
}

// Metadata from a host that sends a byte now and then: a caller waits
// only as long as its own context allows, and check_environment's
// summary never starts the fetch.
func TestSlowMetadataHost(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.Read(make([]byte, 4096))
				c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{"))
				for {
					time.Sleep(100 * time.Millisecond)
					if _, err := c.Write([]byte(" ")); err != nil {
						return
					}
				}
			}()
		}
	}()
	f := newFixture(t)
	f.m.cfg.Metadata, f.m.catalog = "http://"+l.Addr().String()+"/meta.json", nil
	if f.m.LoadedCatalog() != nil {
		t.Fatal("a catalog before any fetch")
	}
	for range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		_, err := f.m.Find(ctx, Request{Version: "3.13"})
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want the caller's deadline", err)
		}
	}
}
