// Package pydist provides Python versions the host does not have: it
// downloads python-build-standalone's relocatable install_only builds, the
// ones uv installs, verifies each archive against the SHA-256 its download
// metadata names before unpacking a byte of it, unpacks it into the
// dependency cache (internal/deps) as a read-only tree, checks inside a
// sandbox that it runs and is the version promised, and hands it to the
// engine as one more interpreter, which the warm pool then serves with
// zygotes of its own.
//
// Its settings are uv's, so a uv user's carry over: the download metadata
// is uv's format (--python-downloads-json-url), a mirror replaces the
// archive URL's prefix as UV_PYTHON_INSTALL_MIRROR does, and the mode is
// uv's python-downloads: automatic, manual (only `pysandbox python
// install`) or never.
package pydist

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/pysandbox/pysandbox/internal/deps"
	"github.com/pysandbox/pysandbox/internal/interp"
	"github.com/pysandbox/pysandbox/internal/pep"
	"github.com/pysandbox/pysandbox/internal/sandbox"
)

// ErrUnmountable is a cache directory whose interpreters no sandbox could
// see: a sandbox mounts an interpreter at its own path, and has its own
// /tmp, /dev, /proc, /etc and /work.
var ErrUnmountable = errors.New("pydist: managed Pythons cannot be kept in this cache")

// hiddenBySandbox is the directory of a sandbox's own that covers dir, or
// "".
func hiddenBySandbox(dir string) string {
	for _, p := range []string{"/tmp", "/dev", "/proc", "/etc", "/work", "/.pysandbox"} {
		if dir == p || strings.HasPrefix(dir, p+"/") {
			return p
		}
	}
	return ""
}

// Mode says when interpreters are downloaded (uv's python-downloads).
type Mode string

const (
	Automatic Mode = "automatic" // when a run asks for a version the host lacks
	Manual    Mode = "manual"    // only by `pysandbox python install`
	Never     Mode = "never"     // not at all; installed ones are still used
)

// ParseMode reads a mode.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(strings.ToLower(strings.TrimSpace(s))); m {
	case Automatic, Manual, Never:
		return m, nil
	}
	return "", fmt.Errorf("python downloads %q: want automatic, manual or never", s)
}

// Preference orders the host's interpreters and the managed ones (uv's
// python-preference).
type Preference string

const (
	// PreferSystem uses the host's interpreter when one meets the
	// request, and a managed one (installed, or downloaded) otherwise.
	PreferSystem Preference = "system"
	// PreferManaged uses an installed managed interpreter when one meets
	// the request, then the host's, then a download.
	PreferManaged Preference = "managed"
	// OnlyManaged gives a run that names a version (python_version,
	// requires-python) a managed build, never the host's; a run that
	// names none gets the server's default interpreter.
	OnlyManaged Preference = "only-managed"
	// OnlySystem never uses a managed interpreter.
	OnlySystem Preference = "only-system"
)

// ParsePreference reads a preference.
func ParsePreference(s string) (Preference, error) {
	switch p := Preference(strings.ToLower(strings.TrimSpace(s))); p {
	case PreferSystem, PreferManaged, OnlyManaged, OnlySystem:
		return p, nil
	}
	return "", fmt.Errorf("python preference %q: want system, managed, only-managed or only-system", s)
}

// SourceManaged is the interp.Interpreter.Source of a managed interpreter.
const SourceManaged = "managed"

// Defaults.
const (
	DefaultMaxArchiveBytes = 512 << 20
	DefaultMaxTreeBytes    = 2 << 30
	DefaultTimeout         = 10 * time.Minute
	DefaultMaxHeld         = 4
	// failTTL is how long a failed install is remembered: a request for
	// the same archive within it gets the same answer at once, rather
	// than another download.
	failTTL = time.Minute
)

// Config configures a Manager.
type Config struct {
	// Cache stores the unpacked interpreters, under its cap.
	Cache *deps.Cache
	// Metadata is uv's download metadata: "" for the shipped file, else a
	// file path or an http(s) URL (fetched through Network on first need).
	Metadata string
	// Mirror replaces DefaultPrefix in archive URLs.
	Mirror string
	Mode   Mode
	// Backend runs the check of an unpacked interpreter (a sandbox of the
	// same kind as runs'); Limits are its limits.
	Backend sandbox.Backend
	Limits  sandbox.Limits
	// Network serves the downloads' proxy listener (egress).
	Network         Network
	MaxArchiveBytes int64         // 0: DefaultMaxArchiveBytes
	MaxTreeBytes    int64         // 0: DefaultMaxTreeBytes
	Timeout         time.Duration // one install, download included (0: DefaultTimeout)
	ProgressEvery   time.Duration // between download progress lines (0: 2 s)
	// HeaderTimeout bounds the wait for a host's answer to begin (0: 60 s).
	HeaderTimeout time.Duration
	// MaxHeld bounds the managed interpreters one server runs on at
	// once (0: DefaultMaxHeld). Each it has used stays in use, never
	// evicted, until it stops: without a bound, callers naming version
	// after version could pin the whole cache.
	MaxHeld int
	// OnEvent receives every install, refusal and removal (the audit log).
	OnEvent func(Event)
	Logger  *slog.Logger
}

// Event is an install, a refusal or a removal, for the audit log.
type Event struct {
	Action   string // "install", "remove"
	Outcome  string // "installed", "failed", "refused" (digest or archive), "removed"
	Version  string
	URL      string
	SHA256   string // what the metadata names
	Bytes    int64  // downloaded
	Duration time.Duration
	Error    string
	Who      Who
}

// Manager finds, installs and removes managed interpreters.
type Manager struct {
	cfg    Config
	log    *slog.Logger
	flight singleflight.Group

	mu      sync.Mutex
	catalog *Catalog
	held    map[string]held // cache key -> the interpreter, in use for the server's life
	failed  map[string]failure
}

type held struct {
	version string
	release func()
}

type failure struct {
	err error
	at  time.Time
}

// New checks cfg; metadata given as a file is read now, so a bad one
// fails at start.
func New(cfg Config) (*Manager, error) {
	if cfg.Cache == nil {
		return nil, errors.New("pydist: no cache")
	}
	if cfg.Mode == "" {
		cfg.Mode = Automatic
	}
	if _, err := ParseMode(string(cfg.Mode)); err != nil {
		return nil, err
	}
	if cfg.MaxArchiveBytes <= 0 {
		cfg.MaxArchiveBytes = DefaultMaxArchiveBytes
	}
	if cfg.MaxTreeBytes <= 0 {
		cfg.MaxTreeBytes = DefaultMaxTreeBytes
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.HeaderTimeout <= 0 {
		cfg.HeaderTimeout = 60 * time.Second
	}
	if cfg.MaxHeld <= 0 {
		cfg.MaxHeld = DefaultMaxHeld
	}
	if cfg.ProgressEvery <= 0 {
		cfg.ProgressEvery = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if p := hiddenBySandbox(cfg.Cache.Dir()); p != "" {
		return nil, fmt.Errorf("%w: the cache directory %s is under %s, which every sandbox replaces with its own; use a --cache-dir elsewhere, such as /var/cache/pysandbox or ~/.cache/pysandbox", ErrUnmountable, cfg.Cache.Dir(), p)
	}
	if cfg.Mirror != "" && !isHTTP(cfg.Mirror) {
		return nil, fmt.Errorf("pydist: the mirror %q is not an http(s) URL", cfg.Mirror)
	}
	m := &Manager{cfg: cfg, log: cfg.Logger, held: map[string]held{}, failed: map[string]failure{}}
	switch {
	case cfg.Metadata == "":
		m.catalog = Shipped()
	case isHTTP(cfg.Metadata):
		// Fetched on first need, through the proxy.
	default:
		data, err := readFile(cfg.Metadata)
		if err != nil {
			return nil, err
		}
		c, err := ParseCatalog(data, cfg.Metadata)
		if err != nil {
			return nil, err
		}
		m.catalog = c
	}
	return m, nil
}

func isHTTP(s string) bool {
	return strings.HasPrefix(s, "https://") || strings.HasPrefix(s, "http://")
}

func readFile(p string) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("pydist: download metadata: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxMetadataBytes+1))
	if err != nil {
		return nil, fmt.Errorf("pydist: download metadata: %w", err)
	}
	return data, nil
}

// URL is where d is downloaded from: its URL, through the mirror
// (credentials left out).
func (m *Manager) URL(d *Download) string { return redact(Mirrored(d.URL, m.cfg.Mirror)) }

// Mode is the download mode.
func (m *Manager) Mode() Mode { return m.cfg.Mode }

// Catalog returns the download metadata, fetching it on first need when
// it is a URL.
func (m *Manager) Catalog(ctx context.Context, who Who) (*Catalog, error) {
	m.mu.Lock()
	c := m.catalog
	m.mu.Unlock()
	if c != nil {
		return c, nil
	}
	// One fetch for every caller, bounded in time whoever started it;
	// each caller waits only as long as its own context allows.
	ch := m.flight.DoChan("metadata", func() (any, error) {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), metadataTimeout)
		defer cancel()
		var b strings.Builder
		lw := &limitWriter{w: &b, n: MaxMetadataBytes}
		if _, _, err := m.fetch(fctx, m.cfg.Metadata, who, lw, func(int64) error { return nil }, nil); err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				err = fmt.Errorf("%s did not send it within %s", redact(m.cfg.Metadata), metadataTimeout)
			}
			return nil, err
		}
		c, err := ParseCatalog([]byte(b.String()), redact(m.cfg.Metadata))
		if err != nil {
			return nil, err
		}
		m.mu.Lock()
		m.catalog = c
		m.mu.Unlock()
		return c, nil
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return nil, fmt.Errorf("the download metadata could not be read: %w", r.Err)
		}
		return r.Val.(*Catalog), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// metadataTimeout bounds the fetch of metadata given as a URL.
const metadataTimeout = 60 * time.Second

// LoadedCatalog is the metadata if it has been read, without fetching it.
func (m *Manager) LoadedCatalog() *Catalog {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.catalog
}

// redact is u with any password replaced, for every message, record and
// file: credentials in a mirror's or the metadata's URL reach the host
// they are for, and nothing else.
func redact(u string) string {
	pu, err := url.Parse(u)
	if err != nil || pu.User == nil {
		return u
	}
	pu.User = url.User("xxxxx")
	return pu.String()
}

type limitWriter struct {
	w io.Writer
	n int64
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > l.n {
		return 0, fmt.Errorf("pydist: the download metadata is over %d MiB", MaxMetadataBytes>>20)
	}
	l.n -= int64(len(p))
	return l.w.Write(p)
}

// Installed lists the managed interpreters in the cache, newest first.
func (m *Manager) Installed() []Installed {
	envs, err := m.cfg.Cache.List()
	if err != nil {
		m.log.Warn("pydist: list the cache", "err", err)
		return nil
	}
	var out []Installed
	for _, e := range envs {
		if e.Kind != deps.KindPython {
			continue
		}
		it, ok := interpreterOf(&e)
		if !ok {
			continue
		}
		out = append(out, Installed{Interpreter: it, Key: e.Key, SizeBytes: e.SizeBytes, Source: e.Source, SHA256: e.SHA256, LastUsed: e.LastUsed})
	}
	sortInstalled(out)
	return out
}

// Installed is a managed interpreter in the cache.
type Installed struct {
	*interp.Interpreter
	Key       string
	SizeBytes int64
	Source    string // the URL it came from
	SHA256    string
	LastUsed  time.Time
}

func sortInstalled(l []Installed) {
	for i := 1; i < len(l); i++ {
		for j := i; j > 0 && versionLess(l[j-1].Version, l[j].Version); j-- {
			l[j-1], l[j] = l[j], l[j-1]
		}
	}
}

func versionLess(a, b string) bool {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(pa) && i < len(pb); i++ {
		x, _ := strconv.Atoi(strings.TrimRightFunc(pa[i], notDigit))
		y, _ := strconv.Atoi(strings.TrimRightFunc(pb[i], notDigit))
		if x != y {
			return x < y
		}
	}
	return len(pa) < len(pb)
}

func notDigit(r rune) bool { return r < '0' || r > '9' }

// interpreterOf is the interpreter of a cache entry.
func interpreterOf(e *deps.Env) (*interp.Interpreter, bool) {
	var major, minor, patch int
	// "3.13.1", or "3.15.0rc1" for a prerelease (its version as the
	// metadata named it, which the policy is asked about).
	if n, _ := fmt.Sscanf(e.Python, "%d.%d.%d", &major, &minor, &patch); n != 3 {
		return nil, false
	}
	bin := filepath.Join(e.Site, "bin", fmt.Sprintf("python%d.%d", major, minor))
	if fi, err := os.Lstat(bin); err != nil || !fi.Mode().IsRegular() {
		// Unpack checked it was a file or a link inside the tree.
		real, err := filepath.EvalSymlinks(bin)
		if err != nil || !strings.HasPrefix(real, e.Site+"/") {
			return nil, false
		}
		bin = real
	}
	return &interp.Interpreter{
		Path: bin, Version: e.Python, Major: major, Minor: minor, Prefix: e.Site,
		Supported: major == interp.MinVersion[0] && minor >= interp.MinVersion[1], Source: SourceManaged,
	}, true
}

// Request is what a run asks for.
type Request struct {
	Version string             // "3.13", "3.13.1", or ""
	Spec    *pep.SpecifierSet  // requires-python, or nil
	Check   func(string) error // the server's Python policy, asked before any download
	// NoDownload finds only installed interpreters, whatever the mode.
	NoDownload bool
	Who        Who
	// Progress gets the install's lines while this call waits for it.
	Progress func(string)
}

// NotAvailableError is a version this server cannot provide: not in the
// metadata, or not installed while downloads are off. Its message says
// what is possible instead.
type NotAvailableError struct{ Msg string }

func (e *NotAvailableError) Error() string { return e.Msg }

// InstallError is a download or unpack that failed: the host, the
// archive, the disk. The run did not happen.
type InstallError struct {
	Version string
	Err     error
}

func (e *InstallError) Error() string {
	return fmt.Sprintf("Python %s could not be installed: %s", e.Version, strings.TrimPrefix(e.Err.Error(), "pydist: "))
}
func (e *InstallError) Unwrap() error { return e.Err }

// Find returns a managed interpreter for req: one installed already, or,
// in automatic mode, one it downloads. The interpreter stays in use (the
// cache never evicts it) until Close.
func (m *Manager) Find(ctx context.Context, req Request) (*interp.Interpreter, error) {
	for _, in := range m.Installed() {
		if matches(in.Interpreter, req) {
			if err := check(req, in.Version); err != nil {
				return nil, err
			}
			if err := m.canHold(in.Key); err != nil {
				return nil, err
			}
			if it, ok := m.hold(in.Key); ok {
				return it, nil
			}
		}
	}
	if err := m.downloads(req); err != nil {
		return nil, err
	}
	d, err := m.pick(ctx, req.Version, req.Spec, req.Who, req.Check)
	if err != nil {
		return nil, err
	}
	if err := check(req, d.Version()); err != nil {
		return nil, err
	}
	if err := m.canHold(artifactKey(d)); err != nil {
		return nil, err
	}
	key, err := m.install(ctx, d, req.Who, req.Progress)
	if err != nil {
		return nil, err
	}
	it, ok := m.hold(key)
	if !ok {
		return nil, &InstallError{Version: d.Version(), Err: errors.New("it was removed from the cache as soon as it was installed; try again")}
	}
	return it, nil
}

// check asks the request's policy about a version.
func check(req Request, version string) error {
	if req.Check == nil {
		return nil
	}
	return req.Check(version)
}

// downloads refuses a request that no download may serve: one that asks
// for none, or any, in manual and never modes.
func (m *Manager) downloads(req Request) error {
	what := req.Version
	if what == "" && req.Spec != nil {
		what = "for requires-python " + req.Spec.String()
	}
	if req.NoDownload {
		return &NotAvailableError{Msg: fmt.Sprintf("no managed Python %s is installed", what)}
	}
	if m.cfg.Mode != Automatic {
		how := "the operator can install it with `pysandbox python install " + req.Version + "`"
		if m.cfg.Mode == Never {
			how = "this server never downloads interpreters (--python-downloads never)"
		}
		return &NotAvailableError{Msg: fmt.Sprintf("Python %s is not installed on this server; %s", what, how)}
	}
	return nil
}

// Preview says, without downloading or holding anything, which managed
// Python would serve req: "3.11.2 (managed, PATH)", or "3.13.15,
// downloaded on first use"; an error saying why none would. Metadata
// behind a URL is not fetched for it.
func (m *Manager) Preview(req Request) (string, error) {
	for _, in := range m.Installed() {
		if matches(in.Interpreter, req) {
			return fmt.Sprintf("%s (managed, %s)", in.Version, in.Path), check(req, in.Version)
		}
	}
	if err := m.downloads(req); err != nil {
		return "", err
	}
	c := m.LoadedCatalog()
	if c == nil {
		return "downloaded on first use, if the download metadata names one", nil
	}
	d, err := c.Find(req.Version, req.Spec)
	if err != nil {
		what := "Python " + req.Version
		if req.Version == "" && req.Spec != nil {
			what = "a Python for requires-python " + req.Spec.String()
		}
		return "", &NotAvailableError{Msg: what + " is neither on this server nor in its download metadata"}
	}
	return fmt.Sprintf("%s, downloaded on first use", d.Version()), check(req, d.Version())
}

func matches(it *interp.Interpreter, req Request) bool {
	if !it.Supported {
		return false
	}
	if req.Version != "" && it.MajorMinor() != req.Version && it.Version != req.Version {
		return false
	}
	return req.Spec == nil || req.Spec.Contains(it.Version)
}

// pick finds the download for a request in the metadata.
func (m *Manager) pick(ctx context.Context, version string, spec *pep.SpecifierSet, who Who, check func(string) error) (*Download, error) {
	c, err := m.Catalog(ctx, who)
	if err != nil {
		return nil, &InstallError{Version: version, Err: err}
	}
	d, err := c.Find(version, spec)
	if err != nil {
		var vs []string
		for _, d := range c.Minors() {
			if check == nil || check(d.Version()) == nil {
				vs = append(vs, d.Version())
			}
		}
		what := "Python " + version
		if version == "" && spec != nil {
			what = "a Python for requires-python " + spec.String()
		}
		list := "none for this machine"
		if len(vs) > 0 {
			list = strings.Join(vs, ", ")
		}
		return nil, &NotAvailableError{Msg: fmt.Sprintf("%s is neither on this server nor in its download metadata; downloadable: %s", what, list)}
	}
	return d, nil
}

// canHold refuses a new interpreter when the server runs on MaxHeld
// already.
func (m *Manager) canHold(key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.held[key]; ok || len(m.held) < m.cfg.MaxHeld {
		return nil
	}
	var vs []string
	for _, h := range m.held {
		vs = append(vs, h.version)
	}
	sort.Strings(vs)
	return &NotAvailableError{Msg: fmt.Sprintf("this server already runs on %d managed Pythons (%s), as many as it keeps at once; use one of them, or ask the operator (a restart frees them)", len(vs), strings.Join(vs, ", "))}
}

// hold marks an installed interpreter in use for the server's life.
func (m *Manager) hold(key string) (*interp.Interpreter, bool) {
	env, release, err := m.cfg.Cache.Acquire(key)
	if err != nil || env == nil {
		return nil, false
	}
	it, ok := interpreterOf(env)
	if !ok {
		release()
		return nil, false
	}
	m.mu.Lock()
	if _, dup := m.held[key]; dup {
		m.mu.Unlock()
		release()
	} else {
		m.held[key] = held{version: it.Version, release: release}
		m.mu.Unlock()
	}
	return it, true
}

// Close lets go of the interpreters in use: the cache may evict them.
func (m *Manager) Close() {
	m.mu.Lock()
	all := m.held
	m.held = map[string]held{}
	m.mu.Unlock()
	for _, h := range all {
		h.release()
	}
}

// Install installs a version (any mode but never), returning it and
// whether it was downloaded now.
func (m *Manager) Install(ctx context.Context, version string, who Who, check func(string) error, progress func(string)) (*Installed, bool, error) {
	if m.cfg.Mode == Never {
		return nil, false, &NotAvailableError{Msg: "python downloads are off (--python-downloads never)"}
	}
	d, err := m.pick(ctx, version, nil, who, check)
	if err != nil {
		return nil, false, err
	}
	if check != nil {
		if err := check(d.Version()); err != nil {
			return nil, false, err
		}
	}
	had := false
	for _, in := range m.Installed() {
		if in.Key == artifactKey(d) {
			had = true
		}
	}
	key, err := m.install(ctx, d, who, progress)
	if err != nil {
		return nil, false, err
	}
	for _, in := range m.Installed() {
		if in.Key == key {
			return &in, !had, nil
		}
	}
	return nil, false, &InstallError{Version: d.Version(), Err: errors.New("it was removed from the cache as soon as it was installed")}
}

// Remove deletes the installed interpreters of a version ("3.13" or
// "3.13.1") and returns what it removed.
func (m *Manager) Remove(version string, who Who) ([]Installed, error) {
	var removed []Installed
	found := false
	for _, in := range m.Installed() {
		if in.MajorMinor() != version && in.Version != version {
			continue
		}
		found = true
		if err := m.cfg.Cache.Remove(in.Key); err != nil {
			if errors.Is(err, deps.ErrInUse) {
				return removed, fmt.Errorf("managed Python %s is %s; stop the server that runs on it first", in.Version, strings.TrimPrefix(err.Error(), "deps: "))
			}
			return removed, err
		}
		removed = append(removed, in)
		m.event(Event{Action: "remove", Outcome: "removed", Version: in.Version, URL: in.Source, SHA256: in.SHA256, Who: who})
	}
	if !found {
		return nil, &NotAvailableError{Msg: fmt.Sprintf("no managed Python %s is installed", version)}
	}
	return removed, nil
}

func (m *Manager) event(e Event) {
	if m.cfg.OnEvent != nil {
		m.cfg.OnEvent(e)
	}
}

// artifactKey is a download's name in the cache: its metadata key and
// the start of its digest, so a rebuilt archive of the same version is
// another entry.
func artifactKey(d *Download) string {
	return strings.ToLower(d.Key) + "-" + d.SHA256[:16]
}

// install makes sure the cache holds d, downloading, verifying, unpacking
// and checking it when it does not; concurrent calls share one install.
func (m *Manager) install(ctx context.Context, d *Download, who Who, progress func(string)) (string, error) {
	key := artifactKey(d)
	u := Mirrored(d.URL, m.cfg.Mirror)
	m.mu.Lock()
	f, ok := m.failed[key]
	m.mu.Unlock()
	if ok && time.Since(f.at) < failTTL {
		return "", &InstallError{Version: d.Version(), Err: fmt.Errorf("%w (%s ago; it is tried again %s after)", f.err, time.Since(f.at).Round(time.Second), failTTL)}
	}
	_, release, err := m.cfg.Cache.EnsureArtifact(ctx, key, deps.Artifact{
		Kind: deps.KindPython, Python: d.Version(), Source: redact(u), SHA256: d.SHA256, Timeout: m.cfg.Timeout,
		Fill: func(ctx context.Context, dir string, charge func(int64) error, progress func(string)) error {
			return m.fill(ctx, d, u, who, dir, charge, progress)
		},
	}, progress)
	if err != nil {
		var ie *InstallError
		var ae *ArchiveError
		var de *DownloadError
		var ce *checksumError
		var dep *deps.InstallError
		if (errors.As(err, &ae) || errors.As(err, &de) || errors.As(err, &ce)) && ctx.Err() == nil {
			m.mu.Lock()
			m.failed[key] = failure{err: err, at: time.Now()}
			m.mu.Unlock()
		}
		switch {
		case errors.As(err, &ie):
			return "", ie
		case errors.As(err, &ae), errors.As(err, &de):
			return "", &InstallError{Version: d.Version(), Err: err}
		case errors.As(err, &dep):
			return "", &InstallError{Version: d.Version(), Err: errors.New(strings.Join(dep.Lines, "; "))}
		case ctx.Err() != nil:
			return "", ctx.Err()
		}
		return "", &InstallError{Version: d.Version(), Err: err}
	}
	release()
	return key, nil
}

// fill downloads d into the build directory next to dir, checks its
// digest, unpacks it into dir and checks the result runs.
func (m *Manager) fill(ctx context.Context, d *Download, u string, who Who, dir string, charge func(int64) error, progress func(string)) (err error) {
	note := func(s string) {
		if progress != nil {
			progress("Python " + d.Version() + ": " + s)
		}
	}
	start := time.Now()
	charge = (&budget{charge: charge}).take
	ev := Event{Action: "install", Version: d.Version(), URL: redact(u), SHA256: d.SHA256, Who: who}
	defer func() {
		ev.Duration = time.Since(start)
		switch {
		case err == nil:
			ev.Outcome = "installed"
		case errors.As(err, new(*ArchiveError)), errors.As(err, new(*checksumError)):
			ev.Outcome, ev.Error = "refused", err.Error()
		default:
			ev.Outcome, ev.Error = "failed", err.Error()
		}
		m.event(ev)
		if err != nil {
			m.log.Warn("pydist: install failed", "version", d.Version(), "url", ev.URL, "err", err)
		} else {
			m.log.Info("pydist: installed", "version", d.Version(), "url", ev.URL, "bytes", ev.Bytes, "took", ev.Duration.Round(time.Millisecond))
		}
	}()
	archive := filepath.Join(filepath.Dir(dir), "archive.tar.gz")
	f, err := os.OpenFile(archive, os.O_RDWR|os.O_CREATE|os.O_EXCL|os.O_TRUNC|noFollow, 0o600)
	if err != nil {
		return diskError("save the download", err)
	}
	defer func() {
		f.Close()
		os.Remove(archive)
	}()
	if err := charge(deps.EntryCharge(0)); err != nil {
		return err
	}
	note("downloading " + redact(u))
	n, sum, err := m.fetch(ctx, u, who, f, charge, note)
	ev.Bytes = n
	if err != nil {
		return err
	}
	if sum != d.SHA256 {
		// Refused and deleted (by the deferred remove) before anything of
		// it is read.
		return &checksumError{url: redact(u), want: d.SHA256, got: sum}
	}
	note(fmt.Sprintf("downloaded %.1f MiB, SHA-256 verified; unpacking", float64(n)/(1<<20)))
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("pydist: %w", err)
	}
	if err := unpack(ctx, bufio.NewReaderSize(f, 256<<10), dir, m.cfg.MaxTreeBytes, charge); err != nil {
		return err
	}
	f.Close()
	os.Remove(archive)
	// The archive's room, given back now that it is gone.
	if err := charge(-deps.EntryCharge(n)); err != nil {
		return err
	}
	if err := finish(dir); err != nil {
		return err
	}
	note("checking that it runs")
	if err := m.probe(ctx, dir, d); err != nil {
		return err
	}
	return nil
}

// checksumError is an archive whose digest is not the metadata's.
type checksumError struct{ url, want, got string }

func (e *checksumError) Error() string {
	return fmt.Sprintf("the archive from %s has SHA-256 %s, not the %s its download metadata names; it was deleted unread", e.url, e.got, e.want)
}

// budget takes room from the cache in chunks: each charge the cache
// makes takes its lock and reads its entries, which an archive of
// thousands of files should not pay for each file. What is taken and not
// used is given back when the tree is measured.
type budget struct {
	charge  func(int64) error
	prepaid int64
}

// chargeChunk is the least a budget takes from the cache at once.
const chargeChunk = 4 << 20

func (b *budget) take(n int64) error {
	if n <= b.prepaid {
		b.prepaid -= n
		return nil
	}
	need := n - b.prepaid
	chunk := max(need, chargeChunk)
	if err := b.charge(chunk); err != nil {
		// The cache may still hold what is needed, without the margin.
		if chunk == need {
			return err
		}
		if err := b.charge(need); err != nil {
			return err
		}
		chunk = need
	}
	b.prepaid += chunk - n
	return nil
}
