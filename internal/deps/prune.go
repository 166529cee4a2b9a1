package deps

import (
	"fmt"
	"os"
	"sort"
)

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
