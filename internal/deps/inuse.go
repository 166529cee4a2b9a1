package deps

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

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
