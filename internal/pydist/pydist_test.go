package pydist

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/deps"
	"github.com/pysandbox/pysandbox/internal/egress"
	"github.com/pysandbox/pysandbox/internal/pydist/hostbuild"
	"github.com/pysandbox/pysandbox/internal/sandbox"
)

func TestMain(m *testing.M) {
	// The native backend re-executes this test binary as the sandbox init.
	sandbox.InitMain()
	code := m.Run()
	if archiveDir != "" {
		os.RemoveAll(archiveDir)
	}
	os.Exit(code)
}

// archiveDir holds the archive built from the system interpreter, once
// for the whole test binary.
var archiveDir string

var archiveOnce struct {
	sync.Once
	a   *hostbuild.Archive
	err error
}

// systemArchive is an install_only archive of the system's python3.
func systemArchive(t testing.TB) *hostbuild.Archive {
	t.Helper()
	archiveOnce.Do(func() {
		archiveDir, archiveOnce.err = os.MkdirTemp("", "pydist-archive-")
		if archiveOnce.err == nil {
			archiveOnce.a, archiveOnce.err = hostbuild.System(archiveDir)
		}
	})
	if archiveOnce.err != nil {
		t.Skipf("this machine's python3 cannot be made into a relocatable archive: %v", archiveOnce.err)
	}
	return archiveOnce.a
}

// cacheDir is a cache directory outside /tmp: a sandbox has a /tmp of
// its own, over which an interpreter unpacked below /tmp could not be
// mounted at its own path.
func cacheDir(t testing.TB) string {
	t.Helper()
	base := "/var/tmp"
	if fi, err := os.Stat(base); err != nil || !fi.IsDir() {
		base = ""
	}
	d, err := os.MkdirTemp(base, "pydist-cache-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

type fixture struct {
	dir     string // the cache's directory
	m       *Manager
	cache   *deps.Cache
	mirror  *hostbuild.Mirror
	archive *hostbuild.Archive
	path    string // the archive's path on the mirror
	events  chan Event
	records chan egress.Record
}

// tag is the release tag of the test's archive URLs.
const tag = "20990101"

// newFixture is a manager over a cache of its own, with metadata naming
// the system interpreter's archive at its python-build-standalone URL, and
// a mirror on loopback that serves it.
func newFixture(t *testing.T, mods ...func(*Config)) *fixture {
	t.Helper()
	a := systemArchive(t)
	f := &fixture{archive: a, mirror: hostbuild.NewMirror(), events: make(chan Event, 64), records: make(chan egress.Record, 256)}
	t.Cleanup(f.mirror.Close)
	f.path = "/pbs/" + tag + "/" + a.Name()
	f.mirror.Put(f.path, a.Path)
	meta := filepath.Join(t.TempDir(), "download-metadata.json")
	if err := os.WriteFile(meta, hostbuild.Metadata(hostbuild.EntryOf(a, DefaultPrefix+"/"+tag+"/"+a.Name())), 0o644); err != nil {
		t.Fatal(err)
	}
	f.dir = cacheDir(t)
	cache, err := deps.New(deps.Config{Dir: f.dir, Backend: sandbox.NewNative(), Limits: testLimits})
	if err != nil {
		t.Fatal(err)
	}
	f.cache = cache
	proxy := egress.New(egress.Config{OnRecord: func(r egress.Record) {
		select {
		case f.records <- r:
		default:
		}
	}})
	cfg := Config{
		Cache: cache, Metadata: meta, Mirror: f.mirror.URL + "/pbs", Mode: Automatic,
		Backend: sandbox.NewNative(), Limits: testLimits,
		Network: func(l net.Listener, trusted []string, who Who) func() {
			return proxy.Download(l, trusted, egress.Info{Identity: who.Identity, Tool: "python-download"})
		},
		OnEvent: func(e Event) { f.events <- e },
	}
	for _, mod := range mods {
		mod(&cfg)
	}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	f.m = m
	return f
}

var testLimits = sandbox.Limits{MemoryBytes: 256 << 20, MaxProcs: 64, TmpBytes: 64 << 20}

func ctxFor(t *testing.T) context.Context {
	// A guard against a hang only: an install takes seconds.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// assertNothingLeft checks that a failed install left nothing in the
// cache: no entry, no build directory.
func assertNothingLeft(t *testing.T, f *fixture) {
	t.Helper()
	if in := f.m.Installed(); len(in) != 0 {
		t.Errorf("installed after a failure: %+v", in)
	}
	envs, _ := f.cache.List()
	if len(envs) != 0 {
		t.Errorf("cache entries after a failure: %+v", envs)
	}
}

// hostileFixture serves data as the archive of version 3.<minor>.<patch>,
// with metadata naming sum as its digest.
func hostileFixture(t *testing.T, data []byte, sum string, major, minor, patch int, mods ...func(*Config)) (*fixture, string) {
	t.Helper()
	f := newFixture(t, mods...)
	name := "cpython-hostile-install_only.tar.gz"
	f.path = "/pbs/" + tag + "/" + name
	f.mirror.PutBytes(f.path, data)
	meta := filepath.Join(t.TempDir(), "hostile.json")
	if err := os.WriteFile(meta, hostbuild.Metadata(hostbuild.Entry{Major: major, Minor: minor, Patch: patch, URL: DefaultPrefix + "/" + tag + "/" + name, SHA256: sum}), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := ParseCatalog(mustRead(t, meta), meta)
	if err != nil {
		t.Fatal(err)
	}
	f.m.catalog = c
	return f, fmt.Sprintf("%d.%d", major, minor)
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func TestCacheUnderTmpRefused(t *testing.T) {
	cache, err := deps.New(deps.Config{Dir: t.TempDir(), Backend: sandbox.NewNative()})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(cache.Dir(), "/tmp/") {
		t.Skip("the test's temporary directory is not under /tmp")
	}
	_, err = New(Config{Cache: cache})
	if !errors.Is(err, ErrUnmountable) || !strings.Contains(err.Error(), "--cache-dir") {
		t.Fatalf("err = %v", err)
	}
}
