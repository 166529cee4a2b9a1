package pool

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// flavor is one zygote and its ready children.
type flavor struct {
	key      string
	lastUsed time.Time    // guarded by Pool.extraMu
	active   atomic.Int64 // children handed out and not yet closed
	mu       sync.Mutex
	retiring bool      // guarded by mu: takes no more runs
	z        *zygote   // replaced when it dies or has served enough (see zygote)
	old      []*zygote // guarded by mu: replaced, waiting for their last child
	preload  []string
	modules  []string
	ready    chan *child
	refill   chan struct{}
	quit     chan struct{}
	quitOnce sync.Once
	restart  func(context.Context) (*zygote, error)
}

// acquire counts a run on f, unless f is being retired.
func (f *flavor) acquire() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.retiring {
		return false
	}
	f.active.Add(1)
	return true
}

// markRetiring stops f from taking runs, if none is using it now.
func (f *flavor) markRetiring() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.active.Load() > 0 {
		return false
	}
	f.retiring = true
	return true
}

// stop ends the flavor's refilling.
func (f *flavor) stop() { f.quitOnce.Do(func() { close(f.quit) }) }

// zygote returns the flavor's zygote for one more child, starting a new
// one if it died (it should not, but an OOM kill or a bug must not leave
// the server unable to run anything until it is restarted) or has served
// its share (Config.ZygoteMaxRuns, ZygoteMaxAge). The child is counted on
// the zygote before the lock is released, so a zygote is never closed
// between being chosen and forking; the caller calls release if it then
// has no child to show for it.
func (f *flavor) zygote(ctx context.Context, p *Pool) (*zygote, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reapOld()
	select {
	case <-f.z.done:
		p.cfg.Logger.Warn("pool: zygote died; starting a new one", "err", f.z.err())
		f.z.close()
	default:
		if !f.z.expired(p.cfg.ZygoteMaxRuns, p.cfg.ZygoteMaxAge) {
			f.z.live.Add(1)
			return f.z, nil
		}
		p.cfg.Logger.Debug("pool: replacing a zygote that has served its share", "forks", f.z.forks.Load(), "age", time.Since(f.z.born).Round(time.Second))
		f.z.retired.Store(true)
		f.old = append(f.old, f.z)
	}
	z, err := f.restart(ctx)
	if err != nil {
		return nil, err
	}
	f.z = z
	z.live.Add(1)
	return z, nil
}

// reapOld closes the replaced zygotes whose last child has ended. f.mu is
// held.
func (f *flavor) reapOld() {
	f.old = slices.DeleteFunc(f.old, func(z *zygote) bool {
		if z.live.Load() > 0 {
			return false
		}
		z.close()
		return true
	})
}

// release gives back a child counted by zygote; a replaced zygote goes
// with its last child.
func (f *flavor) release(z *zygote) {
	if z.live.Add(-1) == 0 && z.retired.Load() {
		go func() {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.reapOld()
		}()
	}
}

func (f *flavor) kick() {
	select {
	case f.refill <- struct{}{}:
	default:
	}
}
