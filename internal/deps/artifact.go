package deps

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"time"
)

// An artifact is a tree that something other than the package installer
// builds into the cache: a managed interpreter, unpacked by
// internal/pydist. It lives beside the environments, under envs/<key>/
// with a meta.json of its own kind, so one cap (Config.MaxBytes), one LRU,
// one set of in-use locks and one `pysandbox cache prune` cover both: an
// interpreter a server runs on is never evicted under it, and an unused
// one goes when room is needed, like any environment.

// KindPython is the Env.Kind of a managed interpreter: its tree (the
// archive's python/ directory) is Env.Site.
const KindPython = "python"

// contentDir is the directory under envs/<key>/ that holds the tree.
func contentDir(kind string) string {
	if kind == KindPython {
		return "python"
	}
	return "site"
}

// artifactKeyRE bounds artifact keys to names that are one path element,
// cannot collide with an environment's 32-hex key, and read well in
// `pysandbox cache ls`.
var artifactKeyRE = regexp.MustCompile(`^[a-z][a-z0-9]*-[a-z0-9][a-z0-9._+_-]{0,120}$`)

// Artifact describes a tree to build into the cache.
type Artifact struct {
	Kind   string // KindPython
	Python string // the interpreter's version, recorded in meta.json
	Source string // where it came from (a URL), recorded in meta.json
	SHA256 string // the digest it was verified against, recorded too
	// Fill builds the tree in dir (an empty directory the caller owns
	// until Fill returns; Fill sets its final mode). Before it creates an
	// entry it must charge what the entry will take on disk (EntryCharge):
	// charge fails when the cache cannot make room, and Fill must then
	// stop. progress receives short lines for every caller waiting.
	Fill func(ctx context.Context, dir string, charge func(int64) error, progress func(string)) error
	// Timeout bounds the build (0: the cache's install timeout).
	Timeout time.Duration
}

// Dir is the cache's directory (absolute).
func (c *Cache) Dir() string { return c.cfg.Dir }

// EntryCharge is what an entry of n data bytes is charged before it is
// written: an inode and its data in whole blocks. What the tree finally
// measures replaces the estimate once it is built.
func EntryCharge(n int64) int64 { return InodeCost + roundBlock(n) }

// EnsureArtifact returns the artifact under key, building it with a.Fill
// if it is not in the cache. Concurrent calls for one key (in this
// process) share one build, as Ensure's do; the release func marks the
// artifact in use until called.
func (c *Cache) EnsureArtifact(ctx context.Context, key string, a Artifact, progress func(string)) (*Env, func(), error) {
	if !artifactKeyRE.MatchString(key) || a.Kind != KindPython || a.Fill == nil {
		return nil, nil, fmt.Errorf("deps: invalid artifact %q of kind %q", key, a.Kind)
	}
	return c.ensure(ctx, key, a.Kind, key, func(st *buildState) error { return c.buildArtifact(st, key, a) }, progress)
}

// Acquire returns the env or artifact under key marked in use, or nil when
// the cache does not hold it.
func (c *Cache) Acquire(key string) (*Env, func(), error) {
	if !artifactKeyRE.MatchString(key) && !envKeyRE.MatchString(key) {
		return nil, nil, nil
	}
	return c.acquire(key)
}

var envKeyRE = regexp.MustCompile(`^[0-9a-f]{32}$`)

// ErrInUse is returned by Remove for an entry a process is using.
var ErrInUse = errors.New("deps: in use")

// Remove deletes the env or artifact under key unless a process (this one
// or another sharing the directory) uses it.
func (c *Cache) Remove(key string) error {
	if !artifactKeyRE.MatchString(key) && !envKeyRE.MatchString(key) {
		return fmt.Errorf("deps: no entry %q", key)
	}
	c.mu.Lock()
	if _, err := c.readMeta(key); err != nil {
		c.mu.Unlock()
		return fmt.Errorf("deps: no entry %q", key)
	}
	if c.inUse[key] > 0 {
		c.mu.Unlock()
		return fmt.Errorf("%w by this server", ErrInUse)
	}
	others, lock := c.lockedByOthers(key)
	if others {
		c.mu.Unlock()
		return fmt.Errorf("%w by another process (a running server)", ErrInUse)
	}
	dir, err := c.moveToTrashLocked(key)
	if lock != nil {
		lock.Close()
	}
	c.mu.Unlock()
	if err != nil {
		return fmt.Errorf("deps: remove %s: %w", key, err)
	}
	removeTree(dir)
	return nil
}

// buildArtifact builds a into build/, then publishes it as envs/<key>.
func (c *Cache) buildArtifact(st *buildState, key string, a Artifact) (err error) {
	timeout := a.Timeout
	if timeout <= 0 {
		timeout = c.cfg.Timeout
	}
	ctx, cancel := context.WithTimeout(st.ctx, timeout)
	defer cancel()
	if _, err := c.readMeta(key); err == nil {
		return nil
	}
	res := c.newReservation()
	defer res.release()
	bdir, err := os.MkdirTemp(c.buildDir, key+"-")
	if err != nil {
		return fmt.Errorf("deps: %w", err)
	}
	published := false
	defer func() {
		if !published {
			removeTree(bdir)
		}
	}()
	content := filepath.Join(bdir, contentDir(a.Kind))
	if err := os.Mkdir(content, 0o700); err != nil {
		return fmt.Errorf("deps: %w", err)
	}
	start := time.Now()
	if err := a.Fill(ctx, content, res.charge, st.emit); err != nil {
		if st.ctx.Err() != nil {
			return errAbandoned
		}
		return err
	}
	size, err := diskUsage(content)
	if err != nil {
		return err
	}
	env := Env{Key: key, Kind: a.Kind, Python: a.Python, Source: a.Source, SHA256: a.SHA256}
	if published, err = c.store(bdir, &env, size, res); err != nil {
		return err
	}
	c.log.Info("deps: stored", "key", key, "kind", a.Kind, "python", a.Python, "size", env.SizeBytes, "took", time.Since(start).Round(time.Millisecond))
	return nil
}
