package pydist

import (
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/egress"
	"github.com/pysandbox/pysandbox/internal/policy"
	"github.com/pysandbox/pysandbox/internal/pydist/hostbuild"
)

func TestUnreachableMirror(t *testing.T) {
	// A port bound and never listened on: nothing answers there.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	f := newFixture(t, func(c *Config) { c.Mirror = "http://" + addr + "/pbs" })
	_, err = f.m.Find(ctxFor(t), Request{Version: f.archive.MajorMinor()})
	var ie *InstallError
	if !errors.As(err, &ie) || !strings.Contains(err.Error(), "could not download") {
		t.Fatalf("err = %v", err)
	}
	if e := <-f.events; e.Outcome != "failed" {
		t.Errorf("event = %+v", e)
	}
	assertNothingLeft(t, f)
}

// The download may reach the mirror's host only: a redirect elsewhere is
// not followed, and the policy's deny rules still hold.
func TestDownloadStaysOnItsHost(t *testing.T) {
	a := systemArchive(t)
	other := hostbuild.NewMirror()
	t.Cleanup(other.Close)
	other.Put("/elsewhere.tar.gz", a.Path)
	f := newFixture(t)
	f.mirror.Redirect(f.path, other.URL+"/elsewhere.tar.gz")
	_, err := f.m.Find(ctxFor(t), Request{Version: a.MajorMinor()})
	if err == nil || !strings.Contains(err.Error(), "not the download host") || other.Hits("/elsewhere.tar.gz") != 0 {
		t.Fatalf("redirect: %v (other host hits %d)", err, other.Hits("/elsewhere.tar.gz"))
	}
	// A deny rule on the mirror's address.
	var deny []policy.HostRule
	proxy := egress.New(egress.Config{Rules: func() *policy.NetworkRules { return &policy.NetworkRules{Deny: deny} }})
	g := newFixture(t, func(c *Config) {
		c.Network = func(l net.Listener, trusted []string, who Who) func() {
			return proxy.Download(l, trusted, egress.Info{Tool: "python-download"})
		}
	})
	rule, err := policy.ParseHostRule(strings.TrimPrefix(g.mirror.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	deny = []policy.HostRule{rule}
	_, err = g.m.Find(ctxFor(t), Request{Version: a.MajorMinor()})
	if err == nil || !strings.Contains(err.Error(), "denies") || g.mirror.Hits(g.path) != 0 {
		t.Fatalf("denied mirror: %v (hits %d)", err, g.mirror.Hits(g.path))
	}
}

// A plain-http mirror that takes the connection and never answers: the
// download gives up, and the proxy's grant closes with it (it waited on
// the host forever before).
func TestSilentMirror(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var conns []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	f := newFixture(t, func(c *Config) {
		c.Mirror = "http://" + l.Addr().String() + "/pbs"
		c.HeaderTimeout = 300 * time.Millisecond
	})
	_, err = f.m.Find(ctxFor(t), Request{Version: f.archive.MajorMinor()})
	if err == nil || !strings.Contains(err.Error(), "no answer within") {
		t.Fatalf("err = %v", err)
	}
}
