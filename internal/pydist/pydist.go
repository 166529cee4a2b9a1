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
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/pysandbox/pysandbox/internal/deps"
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

// URL is where d is downloaded from: its URL, through the mirror
// (credentials left out).
func (m *Manager) URL(d *Download) string { return redact(Mirrored(d.URL, m.cfg.Mirror)) }

// Mode is the download mode.
func (m *Manager) Mode() Mode { return m.cfg.Mode }

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
