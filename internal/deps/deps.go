// Package deps builds and caches dependency environments: directories of
// installed Python packages that sandboxes put on sys.path, read-only.
//
// An environment is content-addressed: its key hashes the interpreter, the
// canonical requirement set and the index configuration, so the same
// request always finds the same directory and a cache hit costs a stat, a
// small read and a touch. A miss runs a real installer (pip, or uv when the
// host has it under /usr) inside the same kind of sandbox as user code:
// installing a package can run its code (sdists always do), so the
// installer is as untrusted as the code that will import the result.
//
// On disk, under Config.Dir:
//
//	envs/<key>/meta.json   the Env, written last before the atomic rename;
//	                       its mtime is the LRU clock (touched on every hit)
//	envs/<key>/site/       the installed packages (pip --target)
//	build/<key>-<random>/  an install in progress, bind-mounted writable
//	trash/                 evicted envs on their way out
package deps

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/pysandbox/pysandbox/internal/interp"
	"github.com/pysandbox/pysandbox/internal/pep"
	"github.com/pysandbox/pysandbox/internal/sandbox"
)

const (
	// DefaultMaxBytes is the LRU cap when Config.MaxBytes is 0.
	DefaultMaxBytes = 2 << 30
	// DefaultTimeout bounds one install when Config.Timeout is 0.
	DefaultTimeout = 5 * time.Minute
	// MaxRequirements bounds one request; real projects need far fewer, and
	// every requirement is a line in the key and an argument to the installer.
	MaxRequirements = 256
)

// Config configures a Cache.
type Config struct {
	Dir string // cache root (created 0700)
	// MaxBytes caps what the envs take on disk, blocks and inodes (see
	// InodeCost), installs in progress included (0 = DefaultMaxBytes).
	MaxBytes int64
	Index    IndexConfig
	// Backend runs the installer: the same kind of sandbox as user code.
	Backend sandbox.Backend
	// Limits are the installer's limits (typically the same as runs').
	Limits  sandbox.Limits
	Timeout time.Duration // per install (0 = DefaultTimeout)
	// Network serves the installer sandbox's proxy listener when an index
	// must be reached (internal/egress): trusted are the index and
	// find-links targets (host:port), to be reached whatever their
	// addresses. nil: the installer has no network, and only local
	// --find-links wheelhouses work.
	Network func(l net.Listener, trusted []string) (stop func())
	Logger  *slog.Logger
}

// Env is a finished environment. Site is the host directory to put on
// sys.path (mounted read-only into sandboxes by the caller).
type Env struct {
	Key string `json:"key"`
	// Kind is "" for installed packages, KindPython for a managed
	// interpreter (artifact.go), whose tree Site then is.
	Kind         string   `json:"kind,omitempty"`
	Site         string   `json:"site"`         // host path of the installed packages (a --target directory)
	Requirements []string `json:"requirements"` // canonical, sorted
	Python       string   `json:"python"`       // version, e.g. "3.11.2"
	// Source and SHA256 say where an artifact came from and what it was
	// verified against.
	Source string `json:"source,omitempty"`
	SHA256 string `json:"sha256,omitempty"`
	// SizeBytes is what the env takes on disk, as the cache charges it:
	// InodeCost per inode plus its allocated blocks (see diskuse.go).
	SizeBytes int64 `json:"size_bytes"`
	// Accounting says how SizeBytes was measured: diskAccounting, or ""
	// for an env written before, whose figure was apparent sizes.
	Accounting string    `json:"accounting,omitempty"`
	Created    time.Time `json:"created"`
	LastUsed   time.Time `json:"last_used"`
}

// Cache is a directory of environments. It is safe for concurrent use.
// Several processes may share one Dir: publishing is an atomic rename, and
// the loser of a race keeps the winner's env. An env in use holds a shared
// flock(2) on its meta.json, so a Prune in any process (a running server,
// `pysandbox cache prune`) skips it.
type Cache struct {
	cfg      Config
	envsDir  string
	buildDir string
	trashDir string
	log      *slog.Logger
	uid, gid int
	// uv is the uv binary when the host has one the sandbox can see; ""
	// means pip run by the interpreter itself.
	uv string

	flight singleflight.Group

	mu     sync.Mutex
	inUse  map[string]int         // key -> holders of a release func
	locks  map[string]*os.File    // key -> meta.json, flock'd shared while in use
	builds map[string]*buildState // key -> the build callers are waiting for
	// reserved is the room builds of this process hold (reserve.go);
	// trashing is what eviction moved to trash and has not deleted yet.
	// Both count against MaxBytes with the published envs.
	reserved, trashing int64
	// measured holds the charge of envs written before diskAccounting,
	// measured once.
	measured map[string]int64

	// installs counts installer runs (tests check that concurrent callers
	// share one build).
	installs atomic.Int64
}

// New opens (creating if needed) the cache at cfg.Dir.
func New(cfg Config) (*Cache, error) {
	if cfg.Dir == "" {
		return nil, errors.New("deps: no cache directory")
	}
	if cfg.Backend == nil {
		return nil, errors.New("deps: no sandbox backend to run the installer")
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("deps: %w", err)
	}
	cfg.Dir = dir
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if err := checkIndex(&cfg.Index); err != nil {
		return nil, err
	}
	c := &Cache{
		cfg:      cfg,
		envsDir:  filepath.Join(dir, "envs"),
		buildDir: filepath.Join(dir, "build"),
		trashDir: filepath.Join(dir, "trash"),
		log:      cfg.Logger,
		uid:      os.Getuid(),
		gid:      os.Getgid(),
		inUse:    map[string]int{},
		locks:    map[string]*os.File{},
		builds:   map[string]*buildState{},
		measured: map[string]int64{},
		uv:       findUV(),
	}
	// 0700 all the way: the tree holds what untrusted installers produced,
	// and only the server (and the sandboxes it mounts envs into) may see it.
	for _, d := range []string{dir, c.envsDir, c.buildDir, c.trashDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("deps: %w", err)
		}
		if err := os.Chmod(d, 0o700); err != nil {
			return nil, fmt.Errorf("deps: %w", err)
		}
	}
	c.cleanStale()
	return c, nil
}

// findUV returns uv's path when it is on PATH and lies under /usr, the only
// host tree every sandbox sees; a uv elsewhere could not run inside.
func findUV() string {
	p, err := exec.LookPath("uv")
	if err != nil {
		return ""
	}
	real, err := filepath.EvalSymlinks(p)
	if err != nil || !filepath.IsAbs(real) || !strings.HasPrefix(real, "/usr/") {
		return ""
	}
	return real
}

// staleAfter is how old a leftover build directory must be before New
// removes it: old enough that no install of another process sharing Dir
// can still be running in it.
const staleAfter = 24 * time.Hour

// cleanStale removes what crashed processes left behind.
func (c *Cache) cleanStale() {
	if ents, err := os.ReadDir(c.trashDir); err == nil {
		for _, e := range ents {
			removeTree(filepath.Join(c.trashDir, e.Name()))
		}
	}
	ents, err := os.ReadDir(c.buildDir)
	if err != nil {
		return
	}
	limit := max(staleAfter, 2*c.cfg.Timeout)
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > limit {
			removeTree(filepath.Join(c.buildDir, e.Name()))
		}
	}
}

func (c *Cache) envDir(key string) string { return filepath.Join(c.envsDir, key) }

const metaName = "meta.json"

// readMeta reads an env's meta.json; LastUsed is its mtime.
func (c *Cache) readMeta(key string) (*Env, error) {
	p := filepath.Join(c.envDir(key), metaName)
	f, err := os.OpenFile(p, os.O_RDONLY|noFollow, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	var env Env
	if err := json.NewDecoder(io.LimitReader(f, 1<<20)).Decode(&env); err != nil {
		return nil, fmt.Errorf("deps: %s: %w", p, err)
	}
	// The path is where the env is now, whatever it was when written.
	env.Key = key
	env.Site = filepath.Join(c.envDir(key), contentDir(env.Kind))
	env.LastUsed = fi.ModTime()
	return &env, nil
}

// Ensure returns the environment for reqs on py, building it if needed.
// Concurrent calls for the same key share one build; a caller whose ctx
// ends stops waiting, and the build is killed only when no caller is left.
// progress, when non-nil, receives the installer's output line by line
// (trimmed, non-empty, short), from another goroutine, while a build this
// call waits for runs. The release func marks the env in use until called
// (it is idempotent); in-use envs are never evicted by this process.
func (c *Cache) Ensure(ctx context.Context, py *interp.Interpreter, reqs []string, progress func(string)) (*Env, func(), error) {
	if py == nil {
		return nil, nil, errors.New("deps: no interpreter")
	}
	canon, err := Canonicalize(reqs)
	if err != nil {
		return nil, nil, err
	}
	key := c.key(py, canon)
	return c.ensure(ctx, key, "", "environment "+key, func(st *buildState) error { return c.build(st, key, py, canon) }, progress)
}

// ensure returns the entry under key, of kind, building it with build
// when the cache does not hold it: the loop Ensure and EnsureArtifact
// share. what names the entry in errors.
func (c *Cache) ensure(ctx context.Context, key, kind, what string, build func(*buildState) error, progress func(string)) (*Env, func(), error) {
	built := false
	for attempt := 0; ; attempt++ {
		env, release, err := c.acquire(key)
		if err != nil {
			return nil, nil, err
		}
		if env != nil {
			if env.Kind != kind {
				release()
				return nil, nil, fmt.Errorf("deps: %s holds a %q, not a %q", key, env.Kind, kind)
			}
			if built {
				// Only now, with the new env held: pruning first could evict it.
				if _, err := c.Prune(c.cfg.MaxBytes); err != nil {
					c.log.Warn("deps: prune after build", "err", err)
				}
			}
			return env, release, nil
		}
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		if attempt == 3 {
			return nil, nil, fmt.Errorf("deps: %s disappeared as soon as it was built (evicted by a concurrent prune?)", what)
		}
		err = c.waitBuild(ctx, key, build, progress)
		if errors.Is(err, errAbandoned) && ctx.Err() == nil {
			// We joined a build that its own callers had given up on and
			// that was being killed; start a fresh one.
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		built = true
	}
}

// Installs is the number of installer runs so far.
func (c *Cache) Installs() int64 { return c.installs.Load() }

// Distributions lists the PEP 503 normalised names of the distributions
// installed in the environment, from their .dist-info directories, so that
// the package policy can see what the installer pulled in.
func (e *Env) Distributions() ([]string, error) {
	entries, err := os.ReadDir(e.Site)
	if err != nil {
		return nil, fmt.Errorf("deps: list the environment: %w", err)
	}
	var names []string
	for _, de := range entries {
		base, ok := strings.CutSuffix(de.Name(), ".dist-info")
		if !ok || !de.IsDir() {
			continue
		}
		// {name}-{version}.dist-info, where the name has no '-' (it is
		// escaped to '_'), so the name ends at the first '-'.
		name, _, _ := strings.Cut(base, "-")
		names = append(names, pep.NormalizeName(name))
	}
	return names, nil
}
