package deps

import (
	"context"
	"errors"
	"sync"
)

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
