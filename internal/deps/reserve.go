package deps

import (
	"os"
	"path/filepath"
)

// The cap holds for installs that run at the same time: each reserves
// room before it copies its environment out of the scratch space, under
// the same lock that orders everything the cache does, against what the
// published environments are charged plus what the installs in progress
// have reserved plus what is still being deleted. Room is made by evicting
// least recently used environments no process uses; when that cannot make
// enough, the install is refused with an InstallError saying so, before
// anything is copied. The reservation is an upper bound estimated from
// the scratch tree; the copy charges what it creates as it goes and grows
// the reservation (with the same check) if it runs past it, and once the
// environment is measured the reservation is set to that figure, then
// handed over when the environment is published.
//
// Reservations are this process's: servers sharing one cache directory see
// each other's published environments, not each other's installs in
// progress.

// reservation is the room one build holds in the cache.
type reservation struct {
	c    *Cache
	held int64 // reserved; counted in c.reserved
	used int64 // charged so far
}

func (c *Cache) newReservation() *reservation { return &reservation{c: c} }

// ensure grows the reservation to at least n.
func (r *reservation) ensure(n int64) error {
	if n <= r.held {
		return nil
	}
	return r.c.reserve(r, n-r.held)
}

// charge adds n (negative to give back) to what the build has spent, and
// fails when that no longer fits.
func (r *reservation) charge(n int64) error {
	r.used += n
	if err := r.ensure(r.used); err != nil {
		// Not spent: a caller may try again with less.
		r.used -= n
		return err
	}
	return nil
}

// settle makes the reservation exactly n, what the environment measures.
func (r *reservation) settle(n int64) error {
	r.used = n
	if err := r.ensure(n); err != nil {
		return err
	}
	r.c.mu.Lock()
	r.c.reserved -= r.held - n
	r.held = n
	r.c.mu.Unlock()
	return nil
}

// release gives the reservation back (a build that failed or lost the
// race to publish). It is idempotent.
func (r *reservation) release() {
	r.c.mu.Lock()
	r.c.releaseLocked(r)
	r.c.mu.Unlock()
}

// releaseLocked gives it back with c.mu held: publish does, in the same
// critical section that makes the environment count as published.
func (c *Cache) releaseLocked(r *reservation) {
	c.reserved -= r.held
	r.held = 0
}

// reserve adds n to r, evicting what it must; it refuses when the cache
// cannot make room.
func (c *Cache) reserve(r *reservation, n int64) error {
	limit := c.cfg.MaxBytes
	if r.held+n > limit {
		return refuse("the installed packages take more than %s on disk, more than the whole cache may hold (%s)", mib(r.held+n), mib(limit))
	}
	for {
		c.mu.Lock()
		envs, _, err := c.listLocked()
		if err != nil {
			c.mu.Unlock()
			return err
		}
		var published int64
		for _, e := range envs {
			published += e.SizeBytes
		}
		over := published + c.reserved + c.trashing + n - limit
		if over <= 0 {
			c.reserved += n
			r.held += n
			c.mu.Unlock()
			return nil
		}
		evicted, doomed, freed, evictable := c.evictLocked(envs, over, false)
		if len(evicted) == 0 {
			inUse, reserved, trashing := published-evictable, c.reserved-r.held, c.trashing
			c.mu.Unlock()
			c.log.Warn("deps: cache full, install refused", "need", r.held+n, "cap", limit, "in_use", inUse, "reserved", reserved)
			msg := "the dependency cache is full: this install needs %s on disk, and of the cache's %s (--cache-size) environments in use hold %s and other installs in progress have reserved %s"
			args := []any{mib(r.held + n), mib(limit), mib(inUse), mib(reserved)}
			if trashing > 0 {
				msg += " (%s more is being deleted)"
				args = append(args, mib(trashing))
			}
			return refuse(msg+"; try again when they finish", args...)
		}
		c.trashing += freed
		c.mu.Unlock()
		c.discard(doomed, evicted, freed)
	}
}

// evictLocked moves to trash the least recently used envs (of envs, most
// recently used first) that no process uses, until they free need bytes.
// With partial false it moves none unless they free enough; evictable is
// then what they would have freed. c.mu is held; the caller counts freed
// in c.trashing until discard has deleted doomed.
func (c *Cache) evictLocked(envs []Env, need int64, partial bool) (evicted []Env, doomed []string, freed, evictable int64) {
	if need <= 0 {
		return nil, nil, 0, 0
	}
	type pick struct {
		env  Env
		lock *os.File // held exclusively until the env is moved
	}
	var picked []pick
	for i := len(envs) - 1; i >= 0 && evictable < need; i-- {
		e := envs[i]
		if c.inUse[e.Key] > 0 {
			continue
		}
		others, lock := c.lockedByOthers(e.Key)
		if others {
			continue
		}
		picked = append(picked, pick{e, lock})
		evictable += e.SizeBytes
	}
	if evictable < need && !partial {
		for _, p := range picked {
			if p.lock != nil {
				p.lock.Close()
			}
		}
		return nil, nil, 0, evictable
	}
	for _, p := range picked {
		dir, err := c.moveToTrashLocked(p.env.Key)
		if p.lock != nil {
			p.lock.Close()
		}
		if err != nil {
			c.log.Warn("deps: evict", "key", p.env.Key, "err", err)
			continue
		}
		doomed = append(doomed, dir)
		evicted = append(evicted, p.env)
		freed += p.env.SizeBytes
	}
	return evicted, doomed, freed, evictable
}

// moveToTrashLocked renames an env into trash/ (quick, under c.mu) and
// returns the directory to delete once the lock is released.
func (c *Cache) moveToTrashLocked(name string) (string, error) {
	dst, err := os.MkdirTemp(c.trashDir, name+"-")
	if err != nil {
		return "", err
	}
	if err := os.Rename(c.envDir(name), filepath.Join(dst, "env")); err != nil {
		os.Remove(dst)
		return "", err
	}
	delete(c.measured, name)
	return dst, nil
}

// discard deletes what eviction moved to trash, then stops counting it.
// Until then it still takes the disk, so it still counts against the cap.
func (c *Cache) discard(doomed []string, evicted []Env, freed int64) {
	for _, d := range doomed {
		removeTree(d)
	}
	c.mu.Lock()
	c.trashing -= freed
	c.mu.Unlock()
	for _, e := range evicted {
		c.log.Info("deps: evicted environment", "key", e.Key, "requirements", e.Requirements, "size", e.SizeBytes, "last_used", e.LastUsed)
	}
}
