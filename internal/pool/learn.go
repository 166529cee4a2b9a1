package pool

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"
)

// learner watches which modules recent runs import and names one to
// preload when it is hot: imported by at least min of the last window
// runs. Module names come from the code of runs, so they are hostile: a
// module is only ever tried once, must be a plain name, and must not be
// one whose import does something (see noPreload); whatever it costs is
// checked against the pool's memory budget before it is used.
type learner struct {
	max, window, min int

	mu       sync.Mutex
	attempts int        // zygotes started to try a module, failed ones too
	recent   [][]string // top-level modules of the last runs, a ring
	next     int
	counts   map[string]int
	tried    map[string]bool
	added    []string
	pending  bool // a zygote with a new module is being prepared
}

// Bounds on what hostile code can make the learner do: the names taken
// from one run, and the zygotes started to try modules over the pool's
// life, whether or not the module imported (each costs a cold interpreter
// start, and a name that never imports must not buy endless tries).
const (
	maxNamesPerRun   = 32
	attemptsPerSlot  = 3
	minLearnAttempts = 4
)

// noPreload are modules whose import has effects beyond defining things
// (printing, opening windows or browsers, starting GUIs or demos).
var noPreload = map[string]bool{
	"this": true, "antigravity": true, "__hello__": true, "__phello__": true,
	"turtle": true, "turtledemo": true, "tkinter": true, "idlelib": true, "pydoc_data": true,
}

func newLearner(max, window, min int, preload []string) *learner {
	if window <= 0 {
		window = 50
	}
	if min <= 0 {
		min = 10
	}
	l := &learner{max: max, window: window, min: min, counts: map[string]int{}, tried: map[string]bool{}}
	for _, m := range preload {
		top, _, _ := strings.Cut(m, ".")
		l.tried[top] = true
	}
	return l
}

// observe records one run's imports and returns a module to preload now,
// or "". has reports whether the zygotes already hold a module.
func (l *learner) observe(imports []string, has func(string) bool) string {
	var tops []string
	for _, imp := range imports {
		top, _, _ := strings.Cut(imp, ".")
		if plainName(top) && !slices.Contains(tops, top) {
			tops = append(tops, top)
			if len(tops) == maxNamesPerRun {
				break
			}
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.recent) < l.window {
		l.recent = append(l.recent, tops)
	} else {
		for _, m := range l.recent[l.next] {
			if l.counts[m]--; l.counts[m] <= 0 {
				delete(l.counts, m)
			}
		}
		l.recent[l.next] = tops
		l.next = (l.next + 1) % l.window
	}
	for _, m := range tops {
		l.counts[m]++
	}
	return l.pick(has)
}

// pick returns the next module to try, marking it pending, or "". l.mu is
// held.
func (l *learner) pick(has func(string) bool) string {
	if l.pending || len(l.added) >= l.max || l.attempts >= max(l.max*attemptsPerSlot, minLearnAttempts) {
		return ""
	}
	// The hottest module not yet tried, whether or not this run imports
	// it (another may have been in preparation when it got hot).
	var hot []string
	for m, n := range l.counts {
		if n >= l.min && !l.tried[m] && !noPreload[m] {
			hot = append(hot, m)
		}
	}
	slices.SortFunc(hot, func(a, b string) int {
		if l.counts[a] != l.counts[b] {
			return l.counts[b] - l.counts[a]
		}
		return strings.Compare(a, b)
	})
	for _, m := range hot {
		l.tried[m] = true // once, whatever happens next
		if !has(m) {
			l.pending = true
			l.attempts++
			return m
		}
	}
	return ""
}

// done ends a preparation (added says whether the module is now
// preloaded) and returns the next module to try, if another got hot
// meanwhile.
func (l *learner) done(m string, added bool, has func(string) bool) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pending = false
	if added {
		l.added = append(l.added, m)
	}
	return l.pick(has)
}

func (l *learner) learned() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.added)
}

// plainName is a top-level module name: an identifier not starting with
// an underscore.
func plainName(s string) bool {
	if s == "" || len(s) > 100 || s[0] == '_' || (s[0] >= '0' && s[0] <= '9') {
		return false
	}
	for _, r := range s {
		if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// hasModule reports whether the light or the preloading zygote already
// holds a top-level module.
func (p *Pool) hasModule(m string) bool {
	for _, f := range []*flavor{p.light, p.heavy.Load()} {
		if f == nil {
			continue
		}
		f.mu.Lock()
		has := slices.Contains(f.z.Ready.Modules, m)
		f.mu.Unlock()
		if has {
			return true
		}
	}
	return false
}

// preloadLearned starts a preloading zygote with m added to what the
// current one preloads and, if m imported and the memory budget allows
// it, switches runs to it; the old one is retired once its runs end.
func (p *Pool) preloadLearned(m string) {
	defer p.wg.Done()
	added := false
	defer func() {
		if next := p.learn.done(m, added, p.hasModule); next != "" && p.ctx.Err() == nil {
			p.wg.Add(1)
			go p.preloadLearned(next)
		}
	}()
	old := p.heavy.Load()
	preload := slices.Clone(p.cfg.Preload)
	var oldRSS int64
	if old != nil {
		preload = slices.Clone(old.preload)
		old.mu.Lock()
		oldRSS = old.z.Ready.RSSBytes
		old.mu.Unlock()
	}
	preload = append(preload, m)
	log := p.cfg.Logger.With("module", m)
	ctx, cancel := context.WithTimeout(p.ctx, time.Minute)
	defer cancel()
	f, err := p.newFlavor(ctx, p.cfg.Spec, preload)
	if err != nil {
		if p.ctx.Err() == nil {
			log.Warn("pool: could not start a zygote preloading a hot module", "err", err)
		}
		return
	}
	if why, failed := f.z.Ready.Failed[m]; failed {
		log.Info("pool: a hot module cannot be preloaded; runs import it themselves", "error", why)
		p.retire(f)
		return
	}
	if used := p.memoryUsed() - oldRSS + f.z.Ready.RSSBytes; used > p.cfg.MemoryBudget {
		log.Info("pool: not preloading a hot module: the pool's memory budget is too small", "needs_bytes", f.z.Ready.RSSBytes-oldRSS, "budget_bytes", p.cfg.MemoryBudget)
		p.retire(f)
		return
	}
	f.modules = f.z.Ready.Preloaded
	p.heavy.Store(f)
	p.serve(f)
	added = true
	log.Info("pool: preloading a module recent runs import", "preloaded", strings.Join(f.modules, ","), "zygote_rss_bytes", f.z.Ready.RSSBytes)
	if old != nil {
		p.retireWhenIdle(old)
	}
}

// retireWhenIdle retires a zygote that no longer gets runs once the runs
// it forked have ended: they live in its pid namespace.
func (p *Pool) retireWhenIdle(f *flavor) {
	f.stop()
	for !f.markRetiring() {
		select {
		case <-p.ctx.Done():
			// The pool is closing: its runs end with it.
			p.retire(f)
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
	p.retire(f)
}
