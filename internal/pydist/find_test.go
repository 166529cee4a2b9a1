package pydist

import (
	"errors"
	"strings"
	"testing"
)

func TestModes(t *testing.T) {
	for _, mode := range []Mode{Manual, Never} {
		t.Run(string(mode), func(t *testing.T) {
			f := newFixture(t, func(c *Config) { c.Mode = mode })
			_, err := f.m.Find(ctxFor(t), Request{Version: f.archive.MajorMinor()})
			var na *NotAvailableError
			if !errors.As(err, &na) {
				t.Fatalf("find in %s mode: %v", mode, err)
			}
			if f.mirror.Hits(f.path) != 0 {
				t.Fatalf("%s mode downloaded", mode)
			}
			_, _, err = f.m.Install(ctxFor(t), f.archive.MajorMinor(), Who{}, nil, nil)
			if mode == Never {
				if !errors.As(err, &na) {
					t.Fatalf("install in never mode: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("install in manual mode: %v", err)
			}
			// Installed by the operator, it serves runs.
			if _, err := f.m.Find(ctxFor(t), Request{Version: f.archive.MajorMinor()}); err != nil {
				t.Fatalf("find after install: %v", err)
			}
		})
	}
}

func TestPolicyCheckedBeforeDownload(t *testing.T) {
	f := newFixture(t)
	denied := errors.New("denied by policy")
	_, err := f.m.Find(ctxFor(t), Request{Version: f.archive.MajorMinor(), Check: func(v string) error {
		if v == f.archive.Version() {
			return denied
		}
		return nil
	}})
	if !errors.Is(err, denied) {
		t.Fatalf("err = %v", err)
	}
	if f.mirror.Hits(f.path) != 0 {
		t.Fatal("a denied version was downloaded")
	}
}

func TestUnknownVersion(t *testing.T) {
	f := newFixture(t)
	_, err := f.m.Find(ctxFor(t), Request{Version: "3.99"})
	var na *NotAvailableError
	if !errors.As(err, &na) || !strings.Contains(err.Error(), "downloadable: "+f.archive.Version()) {
		t.Fatalf("err = %v", err)
	}
}
