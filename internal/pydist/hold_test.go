package pydist

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/pysandbox/pysandbox/internal/pydist/hostbuild"
)

// A server runs on at most MaxHeld managed Pythons: each it used stays
// in use (never evicted) until it stops, so callers naming version after
// version could otherwise pin the whole cache. The next one is refused
// before anything is downloaded.
func TestHeldInterpretersBounded(t *testing.T) {
	a := systemArchive(t)
	f := newFixture(t, func(c *Config) { c.MaxHeld = 1 })
	other := hostbuild.EntryOf(a, DefaultPrefix+"/"+tag+"/other-install_only.tar.gz")
	other.Minor++
	c, err := ParseCatalog(hostbuild.Metadata(hostbuild.EntryOf(a, DefaultPrefix+"/"+tag+"/"+a.Name()), other), "test")
	if err != nil {
		t.Fatal(err)
	}
	f.m.catalog = c
	if _, err := f.m.Find(ctxFor(t), Request{Version: a.MajorMinor()}); err != nil {
		t.Fatal(err)
	}
	_, err = f.m.Find(ctxFor(t), Request{Version: fmt.Sprintf("3.%d", other.Minor)})
	var na *NotAvailableError
	if !errors.As(err, &na) || !strings.Contains(err.Error(), "already runs on 1 managed Pythons ("+a.Version()+")") {
		t.Fatalf("err = %v", err)
	}
	if f.mirror.Hits("/pbs/"+tag+"/other-install_only.tar.gz") != 0 {
		t.Error("the refused version was downloaded")
	}
	// The one it holds is still served.
	if _, err := f.m.Find(ctxFor(t), Request{Version: a.MajorMinor()}); err != nil {
		t.Fatal(err)
	}
}
