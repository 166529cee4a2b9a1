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
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"
	"golang.org/x/sys/unix"

	"github.com/pysandbox/pysandbox/internal/egress"
	"github.com/pysandbox/pysandbox/internal/interp"
	"github.com/pysandbox/pysandbox/internal/pep"
	"github.com/pysandbox/pysandbox/internal/sandbox"
)

// keyVersion changes whenever the layout of an environment or the way it is
// built changes, so that old envs are never mistaken for new ones.
const keyVersion = "pysandbox-deps/1"

const (
	// DefaultMaxBytes is the LRU cap when Config.MaxBytes is 0.
	DefaultMaxBytes = 2 << 30
	// DefaultTimeout bounds one install when Config.Timeout is 0.
	DefaultTimeout = 5 * time.Minute
	// MaxRequirements bounds one request; real projects need far fewer, and
	// every requirement is a line in the key and an argument to the installer.
	MaxRequirements = 256
)

// IndexConfig says where the installer may fetch packages from.
type IndexConfig struct {
	IndexURL       string   // "" = the installer's default (PyPI)
	ExtraIndexURLs []string // more indexes, each passed as --extra-index-url
	// FindLinks are local wheelhouse directories (absolute host paths,
	// bind-mounted read-only into the installer's sandbox) or http(s) URLs.
	FindLinks []string
	NoIndex   bool // only FindLinks (offline)
	// AllowSdist lets the installer build source distributions, which runs
	// their setup code. By default only wheels are accepted.
	AllowSdist bool
}

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

// Targets are the host:port of every index and find-links URL: where the
// installer must be able to connect.
func (ix IndexConfig) Targets() []string {
	var out []string
	add := func(raw string) {
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" {
			return
		}
		hp := egress.Target(u)
		if !slices.Contains(out, hp) {
			out = append(out, hp)
		}
	}
	if !ix.NoIndex {
		if ix.IndexURL == "" {
			// pip's and uv's default: PyPI's pages and its file host.
			out = append(out, "pypi.org:443", "files.pythonhosted.org:443")
		} else {
			add(ix.IndexURL)
		}
		for _, u := range ix.ExtraIndexURLs {
			add(u)
		}
	}
	for _, fl := range ix.FindLinks {
		if isHTTPURL(fl) {
			add(fl)
		}
	}
	return out
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

// checkIndex validates the index configuration once, so a bad flag fails at
// start-up rather than as a puzzling install error.
func checkIndex(ix *IndexConfig) error {
	urls := append([]string(nil), ix.ExtraIndexURLs...)
	if ix.IndexURL != "" {
		urls = append(urls, ix.IndexURL)
	}
	for _, u := range urls {
		if !isHTTPURL(u) {
			return fmt.Errorf("deps: index URL %q must be an http or https URL", u)
		}
	}
	for _, fl := range ix.FindLinks {
		if isHTTPURL(fl) {
			continue
		}
		if !filepath.IsAbs(fl) || filepath.Clean(fl) != fl || fl == "/" {
			return fmt.Errorf("deps: find-links %q must be an http(s) URL or a clean absolute directory path", fl)
		}
		fi, err := os.Stat(fl)
		if err != nil {
			return fmt.Errorf("deps: find-links: %w", err)
		}
		if !fi.IsDir() {
			return fmt.Errorf("deps: find-links %s is not a directory", fl)
		}
		// A root server's installer runs as a sandbox uid of its own, which
		// is "other" to the wheelhouse; without this check pip would just
		// say that no matching distribution exists.
		if os.Geteuid() == 0 && fi.Mode().Perm()&0o005 != 0o005 {
			return fmt.Errorf("deps: find-links directory %s (mode %04o) must be readable and searchable by others: the installer runs as an unprivileged sandbox user", fl, fi.Mode().Perm())
		}
	}
	if ix.NoIndex && len(ix.FindLinks) == 0 {
		return errors.New("deps: NoIndex without FindLinks leaves the installer nothing to install from")
	}
	return nil
}

func isHTTPURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
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

// RequirementError is a request's requirements that no install may be
// made of: the caller's to fix, not the server's.
type RequirementError struct{ Msg string }

func (e *RequirementError) Error() string { return "deps: " + e.Msg }

// Canonicalize validates reqs and returns them canonical (names and extras
// normalized, specifiers sorted), de-duplicated and sorted: the form the key
// hashes and the installer receives. URL requirements are refused: "name @
// url" would let the request point the installer at arbitrary archives (or
// paths) outside the configured indexes, and a URL's content is not
// addressed by its text, so the cache could not key it.
func Canonicalize(reqs []string) ([]string, error) {
	if len(reqs) == 0 {
		return nil, &RequirementError{Msg: "no requirements"}
	}
	if len(reqs) > MaxRequirements {
		return nil, &RequirementError{Msg: fmt.Sprintf("%d requirements (limit %d)", len(reqs), MaxRequirements)}
	}
	seen := map[string]bool{}
	var out []string
	for _, s := range reqs {
		r, err := pep.ParseRequirement(strings.Trim(s, " \t"))
		if err != nil {
			return nil, &RequirementError{Msg: "invalid requirement: " + err.Error()}
		}
		if r.URL != "" {
			return nil, &RequirementError{Msg: fmt.Sprintf("requirement %q: direct URL requirements (name @ url) are not supported; name the package and a version instead (e.g. %s==1.0), installed from the configured index", s, r.Normalized)}
		}
		r.Name = r.Normalized
		if len(r.Extras) > 0 {
			ex := make([]string, len(r.Extras))
			for i, e := range r.Extras {
				ex[i] = pep.NormalizeName(e)
			}
			slices.Sort(ex)
			r.Extras = slices.Compact(ex)
		}
		if r.Specifier != "" {
			// A comma is a conjunction: order carries no meaning.
			sp := strings.Split(r.Specifier, ",")
			slices.Sort(sp)
			r.Specifier = strings.Join(slices.Compact(sp), ",")
		}
		cs := r.String()
		if !seen[cs] {
			seen[cs] = true
			out = append(out, cs)
		}
	}
	sort.Strings(out)
	return out, nil
}

// Key returns the content address of reqs on py with this cache's index
// configuration. It fails only for invalid requirements.
func (c *Cache) Key(py *interp.Interpreter, reqs []string) (string, error) {
	if py == nil {
		return "", errors.New("deps: no interpreter")
	}
	canon, err := Canonicalize(reqs)
	if err != nil {
		return "", err
	}
	return c.key(py, canon), nil
}

func (c *Cache) key(py *interp.Interpreter, canon []string) string {
	path := py.Path
	if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real
	}
	installer := "pip"
	if c.uv != "" {
		installer = "uv"
	}
	// JSON keeps the fields unambiguous: no value can forge a separator.
	data, _ := json.Marshal(struct {
		V            string
		Installer    string
		Python, Path string
		Requirements []string
		Index        IndexConfig
	}{keyVersion, installer, py.Version, path, canon, c.cfg.Index})
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])[:32]
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

// acquire returns the env and marks it in use, or nil when it is not built.
// The mutex orders it against Prune, which moves envs away under it.
func (c *Cache) acquire(key string) (*Env, func(), error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	env, err := c.readMeta(key)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		// A damaged env is rebuilt: the build moves it away first.
		c.log.Warn("deps: unreadable environment, rebuilding", "key", key, "err", err)
		return nil, nil, nil
	}
	now := time.Now()
	if err := os.Chtimes(filepath.Join(c.envDir(key), metaName), now, now); err != nil {
		c.log.Warn("deps: touch", "key", key, "err", err)
	} else {
		env.LastUsed = now
	}
	if c.inUse[key] == 0 {
		lock, err := c.lockShared(key)
		if err != nil {
			// Evicted by another process between our read and our lock:
			// build it again.
			c.log.Info("deps: environment went away while being opened; rebuilding", "key", key, "err", err)
			return nil, nil, nil
		}
		c.locks[key] = lock
	}
	c.inUse[key]++
	var once sync.Once
	release := func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.inUse[key]--; c.inUse[key] <= 0 {
				delete(c.inUse, key)
				if f := c.locks[key]; f != nil {
					f.Close() // drops the shared lock
					delete(c.locks, key)
				}
			}
		})
	}
	return env, release, nil
}

// lockShared takes a shared lock on an env's meta.json, for as long as
// this process uses the env. Prune in another process takes the exclusive
// lock before moving an env away; if it moved one while we waited, our
// file is no longer at the path, and the env counts as gone.
func (c *Cache) lockShared(key string) (*os.File, error) {
	p := filepath.Join(c.envDir(key), metaName)
	f, err := os.OpenFile(p, os.O_RDONLY|noFollow, 0)
	if err != nil {
		return nil, err
	}
	if err := flock(f, unix.LOCK_SH); err != nil {
		f.Close()
		return nil, err
	}
	held, err1 := f.Stat()
	now, err2 := os.Stat(p)
	if err1 != nil || err2 != nil || !os.SameFile(held, now) {
		f.Close()
		return nil, fs.ErrNotExist
	}
	return f, nil
}

// lockedByOthers reports whether another process uses an env: it cannot
// take the exclusive lock. When it returns false, the caller holds that
// lock through f until it closes it (after moving the env away).
func (c *Cache) lockedByOthers(key string) (bool, *os.File) {
	f, err := os.OpenFile(filepath.Join(c.envDir(key), metaName), os.O_RDONLY|noFollow, 0)
	if err != nil {
		return false, nil // no meta.json (a broken env): nobody can be using it
	}
	if err := flock(f, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return true, nil
	}
	return false, f
}

func flock(f *os.File, how int) error {
	for {
		err := unix.Flock(int(f.Fd()), how)
		if err != unix.EINTR {
			if err != nil {
				return os.NewSyscallError("flock", err)
			}
			return nil
		}
	}
}

// errAbandoned is a build killed because every caller waiting for it left.
var errAbandoned = errors.New("deps: build abandoned by its callers")

// buildState is shared by the callers waiting for one key's build. The
// build runs under its own context, detached from any one caller: it is
// cancelled only when the last waiter leaves, so a caller that gives up
// does not kill the build others still wait for.
type buildState struct {
	ctx     context.Context
	cancel  context.CancelFunc
	waiters int

	pmu      sync.Mutex
	nextID   int
	progress map[int]func(string)
}

func (b *buildState) emit(line string) {
	b.pmu.Lock()
	fns := make([]func(string), 0, len(b.progress))
	for _, f := range b.progress {
		fns = append(fns, f)
	}
	b.pmu.Unlock()
	for _, f := range fns {
		f(line)
	}
}

// waitBuild joins (or starts) the build of key and waits for it or for ctx.
func (c *Cache) waitBuild(ctx context.Context, key string, build func(*buildState) error, progress func(string)) error {
	c.mu.Lock()
	st := c.builds[key]
	if st == nil {
		bctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		st = &buildState{ctx: bctx, cancel: cancel, progress: map[int]func(string){}}
		c.builds[key] = st
	}
	st.waiters++
	c.mu.Unlock()
	st.pmu.Lock()
	id := st.nextID
	st.nextID++
	if progress != nil {
		st.progress[id] = progress
	}
	st.pmu.Unlock()
	leave := func() {
		st.pmu.Lock()
		delete(st.progress, id)
		st.pmu.Unlock()
		c.mu.Lock()
		defer c.mu.Unlock()
		if st.waiters--; st.waiters == 0 {
			st.cancel()
			if c.builds[key] == st {
				delete(c.builds, key)
			}
		}
	}
	ch := c.flight.DoChan(key, func() (any, error) {
		c.mu.Lock()
		cur := c.builds[key]
		c.mu.Unlock()
		if cur == nil {
			// Whoever started this flight has already left.
			return nil, errAbandoned
		}
		return nil, build(cur)
	})
	select {
	case r := <-ch:
		leave()
		return r.Err
	case <-ctx.Done():
		leave()
		return ctx.Err()
	}
}

// List returns every finished environment, most recently used first.
func (c *Cache) List() ([]Env, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	envs, _, err := c.listLocked()
	return envs, err
}

// listLocked reads every env's meta.json; broken lists the entries of envs/
// that are not readable envs.
func (c *Cache) listLocked() (envs []Env, broken []string, err error) {
	ents, err := os.ReadDir(c.envsDir)
	if err != nil {
		return nil, nil, fmt.Errorf("deps: %w", err)
	}
	for _, e := range ents {
		env, err := c.readMeta(e.Name())
		if err != nil {
			broken = append(broken, e.Name())
			continue
		}
		if env.Accounting != diskAccounting {
			c.measureOldLocked(env)
		}
		envs = append(envs, *env)
	}
	sort.Slice(envs, func(i, j int) bool { return envs[i].LastUsed.After(envs[j].LastUsed) })
	return envs, broken, nil
}

// measureOldLocked replaces the apparent size an env written before
// diskAccounting carries with what it takes on disk, measured once.
func (c *Cache) measureOldLocked(env *Env) {
	if c.measured == nil {
		c.measured = map[string]int64{}
	}
	n, ok := c.measured[env.Key]
	if !ok {
		var err error
		if n, err = diskUsage(c.envDir(env.Key)); err != nil {
			c.log.Warn("deps: measure an older environment", "key", env.Key, "err", err)
			return
		}
		c.measured[env.Key] = n
	}
	env.SizeBytes = n
}

// Prune evicts the least recently used envs that are not in use until
// what they take on disk is at most maxBytes (0 removes every unused env),
// and returns what it evicted. Envs are moved to trash/ under the lock,
// which is quick, and deleted after it is released, so cache hits never
// wait for a delete; until deleted they still count against the cap for
// installs in progress.
func (c *Cache) Prune(maxBytes int64) ([]Env, error) {
	c.mu.Lock()
	envs, broken, err := c.listLocked()
	if err != nil {
		c.mu.Unlock()
		return nil, err
	}
	var doomed []string
	for _, name := range broken {
		// Half-written or damaged (not something this package publishes):
		// it can only get in the way of a rebuild.
		if c.inUse[name] == 0 {
			d, err := c.moveToTrashLocked(name)
			if err != nil {
				c.log.Warn("deps: evict broken env", "name", name, "err", err)
				continue
			}
			doomed = append(doomed, d)
		}
	}
	var total int64
	for _, e := range envs {
		total += e.SizeBytes
	}
	evicted, more, freed, _ := c.evictLocked(envs, total-maxBytes, true)
	c.trashing += freed
	c.mu.Unlock()
	c.discard(append(doomed, more...), evicted, freed)
	return evicted, nil
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
