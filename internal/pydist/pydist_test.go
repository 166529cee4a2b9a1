package pydist

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pysandbox/pysandbox/internal/deps"
	"github.com/pysandbox/pysandbox/internal/egress"
	"github.com/pysandbox/pysandbox/internal/policy"
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

func TestInstallFromMirror(t *testing.T) {
	f := newFixture(t)
	var lines []string
	var mu sync.Mutex
	it, err := f.m.Find(ctxFor(t), Request{Version: f.archive.MajorMinor(), Who: Who{Identity: "alice", Tool: "run"}, Progress: func(s string) {
		mu.Lock()
		lines = append(lines, s)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	if it.Version != f.archive.Version() || it.Source != SourceManaged || !strings.HasPrefix(it.Path, it.Prefix+"/bin/") {
		t.Fatalf("interpreter = %+v", it)
	}
	if f.mirror.Hits(f.path) != 1 {
		t.Errorf("mirror hits = %d, want 1", f.mirror.Hits(f.path))
	}
	mu.Lock()
	joined := strings.Join(lines, "\n")
	mu.Unlock()
	for _, want := range []string{"downloading " + f.mirror.URL + f.path, "SHA-256 verified", "checking that it runs"} {
		if !strings.Contains(joined, want) {
			t.Errorf("progress lacks %q:\n%s", want, joined)
		}
	}
	// The tree is read-only for everyone but the server, and has no
	// archive left beside it.
	fi, err := os.Stat(it.Path)
	if err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("interpreter mode: %v %v", fi, err)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(it.Prefix), "archive.tar.gz")); !os.IsNotExist(err) {
		t.Errorf("the archive was left in the cache: %v", err)
	}
	e := <-f.events
	if e.Action != "install" || e.Outcome != "installed" || e.Who.Identity != "alice" || e.SHA256 != f.archive.SHA256 || e.Bytes != f.archive.Size {
		t.Errorf("event = %+v", e)
	}
	// The connection went through the proxy, recorded for the caller.
	rec := <-f.records
	if rec.Tool != "python-download" || rec.Identity != "alice" || rec.Decision != egress.Allowed || rec.BytesIn < f.archive.Size {
		t.Errorf("egress record = %+v", rec)
	}
	// A second request finds it installed: no download.
	it2, err := f.m.Find(ctxFor(t), Request{Version: f.archive.Version()})
	if err != nil || it2.Path != it.Path {
		t.Fatalf("second find: %v %v", it2, err)
	}
	if f.mirror.Hits(f.path) != 1 {
		t.Errorf("mirror hits after a second find = %d", f.mirror.Hits(f.path))
	}
	// In use: not removable, not evicted.
	if _, err := f.m.Remove(f.archive.MajorMinor(), Who{}); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Errorf("remove of an interpreter in use: %v", err)
	}
	f.m.Close()
	removed, err := f.m.Remove(f.archive.MajorMinor(), Who{Identity: "cli"})
	if err != nil || len(removed) != 1 {
		t.Fatalf("remove: %v %v", removed, err)
	}
	if _, err := os.Stat(it.Path); !os.IsNotExist(err) {
		t.Errorf("removed interpreter still there: %v", err)
	}
}

func TestConcurrentFirstRequestsDownloadOnce(t *testing.T) {
	f := newFixture(t)
	f.mirror.Delay = 200 * time.Millisecond
	var wg sync.WaitGroup
	paths := make([]string, 4)
	errs := make([]error, 4)
	for i := range paths {
		wg.Add(1)
		go func() {
			defer wg.Done()
			it, err := f.m.Find(ctxFor(t), Request{Version: f.archive.MajorMinor()})
			errs[i] = err
			if it != nil {
				paths[i] = it.Path
			}
		}()
	}
	wg.Wait()
	for i := range paths {
		if errs[i] != nil || paths[i] != paths[0] {
			t.Fatalf("caller %d: %q %v (first: %q)", i, paths[i], errs[i], paths[0])
		}
	}
	if n := f.mirror.Hits(f.path); n != 1 {
		t.Errorf("mirror hits = %d, want 1", n)
	}
}

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

func TestHostileArchives(t *testing.T) {
	a := systemArchive(t)
	good := mustRead(t, a.Path)
	for _, tc := range []struct {
		name     string
		data     []byte
		sum      string // "" = the data's own
		patch    int    // -1 = the archive's
		outcome  string
		want     string
		cacheCap int64
	}{
		{name: "digest mismatch", data: good, sum: strings.Repeat("ab", 32), patch: -1, outcome: "refused", want: "it was deleted unread"},
		{name: "truncated", data: good[:len(good)/2], patch: -1, outcome: "refused", want: "is truncated"},
		{name: "wrong version inside", data: good, patch: 99, outcome: "refused", want: "not the 3." + strconv.Itoa(a.Minor) + ".99"},
		{name: "does not run", data: tarGz(t, top, binDir, ent{name: fmt.Sprintf("python/bin/python3.%d", a.Minor), typ: tar.TypeReg, body: "\x7fELF garbage", mode: 0o755}), patch: -1, outcome: "refused", want: "does not run here"},
		{name: "escaping symlink", data: tarGz(t, top, binDir, ent{name: "python/lib", typ: tar.TypeSymlink, link: "/"}), patch: -1, outcome: "refused", want: "symlink out of the tree"},
		{name: "cache too small", data: good, patch: -1, outcome: "failed", want: "more than the whole cache may hold", cacheCap: 8 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sum := tc.sum
			if sum == "" {
				sum = sha(tc.data)
			}
			patch := tc.patch
			if patch < 0 {
				patch = a.Patch
			}
			var mods []func(*Config)
			f, ver := hostileFixture(t, tc.data, sum, 3, a.Minor, patch, mods...)
			if tc.cacheCap > 0 {
				f.dir = cacheDir(t)
				cache, err := deps.New(deps.Config{Dir: f.dir, Backend: sandbox.NewNative(), MaxBytes: tc.cacheCap})
				if err != nil {
					t.Fatal(err)
				}
				f.cache, f.m.cfg.Cache = cache, cache
			}
			_, err := f.m.Find(ctxFor(t), Request{Version: ver})
			var ie *InstallError
			if !errors.As(err, &ie) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want an InstallError saying %q", err, tc.want)
			}
			e := <-f.events
			if e.Outcome != tc.outcome {
				t.Errorf("event outcome = %q (%s), want %q", e.Outcome, e.Error, tc.outcome)
			}
			assertNothingLeft(t, f)
			// Nothing of the build is left either: the build directory is
			// empty again.
			builds, _ := os.ReadDir(filepath.Join(f.dir, "build"))
			if len(builds) != 0 {
				t.Errorf("build directory not cleaned: %v", builds)
			}
		})
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

// A disk that fills while the archive is saved or unpacked: a plain
// answer, and nothing left behind.
func TestDiskFull(t *testing.T) {
	a := systemArchive(t)
	for _, size := range []string{"8m", "24m"} { // the download fills it; the unpack does
		t.Run(size, func(t *testing.T) {
			dir := cacheDir(t)
			if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
				t.Skipf("cannot mount a small tmpfs here (%v): needs root", err)
			}
			t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
			f := newFixture(t)
			cache, err := deps.New(deps.Config{Dir: dir, Backend: sandbox.NewNative()})
			if err != nil {
				t.Fatal(err)
			}
			f.dir, f.cache, f.m.cfg.Cache = dir, cache, cache
			_, err = f.m.Find(ctxFor(t), Request{Version: a.MajorMinor()})
			if err == nil || !strings.Contains(err.Error(), "the disk holding the cache is full") {
				t.Fatalf("err = %v", err)
			}
			assertNothingLeft(t, f)
			builds, _ := os.ReadDir(filepath.Join(dir, "build"))
			if len(builds) != 0 {
				t.Errorf("build directory not cleaned: %v", builds)
			}
		})
	}
}

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

// A failed install is remembered for a while: the same request gets the
// same answer at once, without another download.
func TestFailureRemembered(t *testing.T) {
	a := systemArchive(t)
	f, ver := hostileFixture(t, mustRead(t, a.Path), strings.Repeat("ab", 32), 3, a.Minor, a.Patch)
	for i := range 2 {
		_, err := f.m.Find(ctxFor(t), Request{Version: ver})
		if err == nil || !strings.Contains(err.Error(), "deleted unread") {
			t.Fatalf("try %d: %v", i, err)
		}
	}
	if n := f.mirror.Hits(f.path); n != 1 {
		t.Errorf("mirror hits = %d, want 1", n)
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
