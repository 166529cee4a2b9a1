// Package pool is the warm pool: it keeps single-use sandboxes ready ahead
// of demand, each forked from a zygote that has already started the
// interpreter and imported the preloaded modules.
//
// Design (chosen by measurement, see docs/performance.md): a cold sandbox costs
// about 50 ms (two process starts, an interpreter start, imports), and
// with pandas preloaded over 300 ms of CPU, which caps a 2-core machine at
// a few runs per second. A fork of a warm interpreter costs a few
// milliseconds whatever it has imported. So one zygote per interpreter
// runs inside an ordinary sandbox and forks a child per run, straight into
// a fresh pid namespace; each child gets its own user, mount, pid, net,
// ipc, uts and cgroup namespaces, its own tmpfs, /proc and cgroup (memory,
// pids, CPU), rlimits, no capabilities, no_new_privs, Landlock and the
// strict seccomp filter before any user code runs, and is used once. Runs
// never share a process, a namespace or a file.
//
// Namespace ownership: the zygote lives in a user namespace of its own,
// where it holds every capability; a child builds its other namespaces
// with them, then enters a user namespace of its own (owning nothing) and
// drops everything. So every namespace of a run is owned by the zygote's
// user namespace, where no run holds a capability.
//
// The pool implements sandbox.Backend, so the engine does not know whether
// a run is pooled.
//
// Trust. A zygote is more privileged than a run: its seccomp filter allows
// unshare, setns and mount, and it holds every capability in its own user
// namespace (which maps no privileged host id; for a root server, the
// block of ids that gives each child a host uid of its own). So nothing a caller controls ever executes
// in a zygote, nor in a child before its lockdown:
//   - a zygote imports only the interpreter's standard library and
//     site-packages (--preload and learned names resolve there and nowhere
//     else): the working directory and dependency environments are never on
//     its sys.path, even when the environment is mounted in its sandbox;
//   - a child imports nothing between the fork and its strict seccomp
//     filter, capability drop, no_new_privs and Landlock domain; only then
//     does it add the working directory and the environments (processing
//     their .pth files) to sys.path, after the standard library;
//   - dependency environments therefore get warm zygotes of their own
//     without any of their code running in one.
//
// A zygote is replaced after Config.ZygoteMaxRuns forks or ZygoteMaxAge,
// since its children share its memory layout and str hash seed.
package pool

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pysandbox/pysandbox/internal/sandbox"
	"github.com/pysandbox/pysandbox/internal/sandbox/cgroup"
)

// childSeq numbers children across every pool of the process, so their
// cgroup names never collide.
var childSeq atomic.Uint64

// childUIDs hands out the children's ids, in turn through the mapped
// block, never one a live child has.
var childUIDs = newUIDSet(sandbox.ChildIDCount)

// Config configures a pool.
type Config struct {
	// Backend starts the zygote's own sandbox and serves the runs the pool
	// cannot (another interpreter or other limits).
	Backend *sandbox.Native
	// Spec is the sandbox spec of a run; only runs with exactly this spec
	// are pooled. Its Args must end in the worker script and --oneshot.
	Spec *sandbox.Spec
	// Preload names modules the zygote imports once for every run.
	Preload []string
	// Learn is how many more modules the pool may preload on its own,
	// having seen recent runs import them (0: none). LearnWindow and
	// LearnMin say when a module is hot: imported by at least LearnMin of
	// the last LearnWindow runs (defaults 50 and 10).
	Learn                 int
	LearnWindow, LearnMin int
	// Size is how many children are kept ready.
	Size int
	// MemoryBudget caps the memory of the zygote plus the idle children;
	// the pool keeps fewer ready children rather than exceed it.
	MemoryBudget int64
	// MaxConcurrent is the engine's concurrency cap: the zygote's process
	// limits must leave room for that many runs at once.
	MaxConcurrent int
	// ZygoteMaxRuns and ZygoteMaxAge bound how long one zygote serves
	// (0: no bound). Every child of a zygote shares its address-space
	// layout and its str hash seed; a zygote that has forked MaxRuns
	// children or is older than MaxAge is replaced by a fresh one (a new
	// interpreter: new layout, new seed) at its next fork, and goes once
	// its last child has ended.
	ZygoteMaxRuns int64
	ZygoteMaxAge  time.Duration
	Logger        *slog.Logger
	// Trace, when set, has every child time its setup and is called with
	// the record once the child has ended (see Trace): for benchmarks.
	Trace func(*Trace)
}

// Pool is a warm pool. It is safe for concurrent use.
type Pool struct {
	cfg     Config
	cgroups cgroup.Info
	env     map[string]string
	rlimits [][3]uint64

	// cgFree holds empty cgroups of finished runs, reset for the next one:
	// creating and deleting a memory cgroup costs more than a whole run.
	cgFree chan *cgroup.Group
	// cgDropped counts groups recycle deleted rather than kept: not
	// empty enough to reuse, or no room.
	cgDropped atomic.Int64

	defaultKey string

	// extra are zygotes for other interpreters and dependency environments
	// (a hot environment gets its own), created on first use, the least
	// recently used one retired when there are too many.
	extraMu sync.Mutex
	extra   map[string]*flavor

	// light's zygote has imported nothing but the worker; heavy's (nil
	// until there is something to preload) has imported the preloaded
	// modules too. A run whose code imports one of those goes to heavy,
	// every other run to light, which forks faster because it is small.
	// heavy is replaced when the pool learns a new hot module.
	light *flavor
	heavy atomic.Pointer[flavor]
	learn *learner

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// Counters for Stats.
	hits, misses, idleDeaths atomic.Int64
}

// New starts the zygote, waits until it has imported cfg.Preload, and
// starts filling the pool in the background. A module that cannot be
// imported is a warning in the log (see Preload), not an error.
func New(ctx context.Context, cfg Config) (*Pool, error) {
	if cfg.Backend == nil || cfg.Spec == nil {
		return nil, fmt.Errorf("pool: a backend and a spec are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Size < 0 {
		cfg.Size = 0
	}
	if cfg.MaxConcurrent <= 0 {
		cfg.MaxConcurrent = 16
	}
	if cfg.MemoryBudget <= 0 {
		cfg.MemoryBudget = 1 << 30
	}
	p := &Pool{
		cfg:     cfg,
		cgroups: cfg.Backend.Cgroups(),
		env:     map[string]string{},
		cgFree:  make(chan *cgroup.Group, 2*(cfg.Size+cfg.MaxConcurrent)+4),
	}
	for _, kv := range cfg.Spec.Env {
		k, v, _ := strings.Cut(kv, "=")
		p.env[k] = v
	}
	p.rlimits = sandbox.RlimitTriples(cfg.Spec.Limits, p.cgroups)
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.extra = map[string]*flavor{}
	_, p.defaultKey, _ = p.match(cfg.Spec)

	var err error
	if p.light, err = p.newFlavor(ctx, cfg.Spec, nil); err != nil {
		return nil, err
	}
	p.serve(p.light)
	if len(cfg.Preload) > 0 {
		heavy, err := p.newFlavor(ctx, cfg.Spec, cfg.Preload)
		if err != nil {
			p.Close()
			return nil, err
		}
		for name, why := range heavy.z.Ready.Failed {
			cfg.Logger.Warn("preload: module not available; runs will import it themselves if they can", "module", name, "error", why)
		}
		heavy.modules = heavy.z.Ready.Preloaded
		p.heavy.Store(heavy)
		p.serve(heavy)
	}
	if cfg.Learn > 0 {
		p.learn = newLearner(cfg.Learn, cfg.LearnWindow, cfg.LearnMin, cfg.Preload)
	}
	return p, nil
}

// newFlavor starts a zygote that imports preload and keeps its children.
func (p *Pool) newFlavor(ctx context.Context, base *sandbox.Spec, preload []string) (*flavor, error) {
	cfg := p.cfg
	zspec := *base
	zspec.Args = append(slices.Clone(stripOneshot(base.Args)), "--zygote")
	zspec.Imports = nil
	zspec.Zygote = true
	zspec.Stdout, zspec.Stderr = os.Stderr, os.Stderr
	perRun := max(cfg.Spec.Limits.MaxProcs, 64)
	zspec.Limits = sandbox.Limits{
		MemoryBytes: cfg.MemoryBudget,
		// Every child's tasks also count against the zygote's RLIMIT_NPROC
		// (user namespaces charge their ancestors), so leave room for all.
		MaxProcs: perRun * int64(cfg.MaxConcurrent+cfg.Size+2),
		// The zygote's rlimits are the ceiling of its children's: the same
		// file size limit, so a child may keep it. Its own scratch stays
		// empty, and an empty tmpfs costs nothing.
		TmpBytes:   cfg.Spec.Limits.TmpBytes,
		CPUSeconds: 0,
	}
	z, err := startZygote(ctx, cfg.Backend, &zspec, preload)
	if err != nil {
		return nil, err
	}
	f := &flavor{z: z, preload: preload, ready: make(chan *child, max(cfg.Size, 1)), refill: make(chan struct{}, 1), quit: make(chan struct{})}
	f.restart = func(ctx context.Context) (*zygote, error) { return startZygote(ctx, cfg.Backend, &zspec, preload) }
	return f, nil
}

// serve starts keeping f's children ready. It is called once f is where
// memoryUsed can see it.
func (p *Pool) serve(f *flavor) {
	p.wg.Add(1)
	go p.refillLoop(f)
	f.kick()
}

// Kind is native: a pooled run is a native sandbox.
func (p *Pool) Kind() sandbox.Kind { return sandbox.KindNative }

// CgroupSupport reports the cgroup limits each run gets.
func (p *Pool) CgroupSupport() (mem, pids bool, mode, reason string) {
	return p.cfg.Backend.CgroupSupport()
}

// CPUSupport reports whether runs get a CPU quota (and sessions the idle
// quota between runs).
func (p *Pool) CPUSupport() bool { return p.cfg.Backend.CPUSupport() }

// Preload reports which modules the preloading zygote imported and which
// failed.
func (p *Pool) Preload() (loaded []string, failed map[string]string) {
	heavy := p.heavy.Load()
	if heavy == nil {
		return nil, nil
	}
	return heavy.z.Ready.Preloaded, heavy.z.Ready.Failed
}

// Info describes the pool for check_environment.
func (p *Pool) Info() sandbox.PoolInfo {
	loaded, failed := p.Preload()
	if loaded == nil {
		loaded = []string{}
	}
	info := sandbox.PoolInfo{Size: p.cfg.Size, Preloaded: loaded, Failed: failed}
	if p.learn != nil {
		info.Learned = p.learn.learned()
	}
	return info
}

// Stats are counters for benchmarks and logs.
type Stats struct {
	// Ready children now, of Target (Size for each zygote of the pool's
	// own spec).
	Ready, Target            int64
	Hits, Misses, IdleDeaths int64
}

func (p *Pool) Stats() Stats {
	ready, target := len(p.light.ready), p.cfg.Size
	if heavy := p.heavy.Load(); heavy != nil {
		ready += len(heavy.ready)
		target += p.cfg.Size
	}
	return Stats{Ready: int64(ready), Target: int64(target), Hits: p.hits.Load(), Misses: p.misses.Load(), IdleDeaths: p.idleDeaths.Load()}
}

// Start hands out a ready child for a run with the pool's spec, forks one
// on the spot when none is ready, and leaves any other spec to the cold
// backend (same isolation, just slower).
func (p *Pool) Start(ctx context.Context, spec *sandbox.Spec) (sandbox.Sandbox, error) {
	oneshot, key, ok := p.match(spec)
	if !ok {
		return p.cfg.Backend.Start(ctx, spec)
	}
	if key == p.defaultKey && p.learn != nil {
		if m := p.learn.observe(spec.Imports, p.hasModule); m != "" {
			p.wg.Add(1)
			go p.preloadLearned(m)
		}
	}
	var f *flavor
	for {
		if key == p.defaultKey {
			f = p.flavorFor(spec.Imports)
		} else {
			var err error
			if f, err = p.extraFlavor(ctx, key, spec); err != nil {
				return nil, err
			}
			if f == nil {
				// Every extra zygote is busy: the same sandbox, started cold.
				return p.cfg.Backend.Start(ctx, spec)
			}
		}
		// A zygote being retired (replaced by one that preloads more, or
		// evicted) takes no new runs: choose again.
		if f.acquire() {
			break
		}
	}
	var c *child
	if oneshot {
	take:
		for {
			select {
			case c = <-f.ready:
				if c.alive() && !c.zyg.retired.Load() && !c.zyg.expired(p.cfg.ZygoteMaxRuns, p.cfg.ZygoteMaxAge) {
					break take
				}
				// Died while idle, or forked from a zygote that has served
				// its share (its layout and hash seed have been shared long
				// enough): replaced, never handed out.
				c.Close()
				c = nil
			default:
				break take
			}
		}
	}
	// Refilling competes for the CPU with the run that just started, so it
	// waits for that run to end (see child.Close) unless the pool is
	// running low.
	if len(f.ready) < max(p.cfg.Size/2, 1) {
		f.kick()
	}
	if c == nil {
		p.misses.Add(1)
		var err error
		if c, err = p.spawn(ctx, f, oneshot, false); err != nil {
			f.active.Add(-1)
			return nil, err
		}
	} else {
		p.hits.Add(1)
		if c.lowWeight {
			// Made ahead of demand at the lowest weight: a run's now.
			if err := c.cg.SetWeight(runWeight); err != nil {
				p.cfg.Logger.Warn("pool: could not give a run its CPU weight", "err", err)
			}
		}
	}
	c.stamp("taken")
	c.onClose = func() { f.active.Add(-1); f.kick() }
	c.attach(spec.Stdout, spec.Stderr)
	return c, nil
}

// runWeight is a run's CPU weight, a plain process's.
const runWeight = 100

// maxExtraFlavors bounds the zygotes kept for other interpreters and
// environments, each a resident interpreter of its own.
const maxExtraFlavors = 4

// extraFlavor returns the zygote for key, starting it on first use. It
// returns nil, nil when every slot is taken by a zygote with runs in
// flight (their children live in its pid namespace, so it cannot go).
func (p *Pool) extraFlavor(ctx context.Context, key string, spec *sandbox.Spec) (*flavor, error) {
	p.extraMu.Lock()
	defer p.extraMu.Unlock()
	if f, ok := p.extra[key]; ok {
		f.lastUsed = time.Now()
		return f, nil
	}
	if len(p.extra) >= maxExtraFlavors {
		var victim *flavor
		for _, f := range p.extra {
			if f.active.Load() == 0 && (victim == nil || f.lastUsed.Before(victim.lastUsed)) {
				victim = f
			}
		}
		if victim == nil || !victim.markRetiring() {
			return nil, nil
		}
		delete(p.extra, victim.key)
		go p.retire(victim)
	}
	f, err := p.newFlavor(ctx, spec, nil)
	if err != nil {
		return nil, err
	}
	f.key, f.lastUsed = key, time.Now()
	p.extra[key] = f
	p.serve(f)
	return f, nil
}

// retire stops a flavor's refilling and closes its idle children and its
// zygote.
func (p *Pool) retire(f *flavor) error {
	f.stop()
	for drained := false; !drained; {
		select {
		case c := <-f.ready:
			c.Close()
		default:
			drained = true
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, z := range f.old {
		z.close()
	}
	f.old = nil
	return f.z.close()
}

// flavorFor picks the preloading zygote when the code imports one of its
// modules (or a submodule), the light one otherwise.
func (p *Pool) flavorFor(imports []string) *flavor {
	heavy := p.heavy.Load()
	if heavy == nil {
		return p.light
	}
	for _, imp := range imports {
		top, _, _ := strings.Cut(imp, ".")
		for _, m := range heavy.modules {
			if mtop, _, _ := strings.Cut(m, "."); mtop == top {
				return heavy
			}
		}
	}
	return p.light
}

// match reports whether the pool can serve spec, with which flavor key:
// the same limits, environment and worker as the pool's spec, on any
// interpreter and with any dependency environment (binds and --site
// arguments), each such combination with a zygote of its own.
func (p *Pool) match(spec *sandbox.Spec) (oneshot bool, key string, ok bool) {
	ps := p.cfg.Spec
	if spec.Limits != ps.Limits || spec.Zygote || spec.Proxy != ps.Proxy || !slices.Equal(spec.Env, ps.Env) || !slices.EqualFunc(spec.Files, ps.Files, sameFile) {
		return false, "", false
	}
	args := spec.Args
	if len(args) > 0 && args[len(args)-1] == "--oneshot" {
		oneshot, args = true, args[:len(args)-1]
	}
	var b strings.Builder
	b.WriteString(spec.Python + "\x00" + spec.Prefix)
	for _, a := range args {
		b.WriteString("\x00" + a)
	}
	for _, bd := range spec.Binds {
		fmt.Fprintf(&b, "\x00bind:%s:%s:%v", bd.Source, bd.Target, bd.Writable)
	}
	return oneshot, b.String(), true
}

func sameFile(a, b sandbox.File) bool {
	return a.Path == b.Path && string(a.Content) == string(b.Content)
}

func stripOneshot(args []string) []string {
	if len(args) > 0 && args[len(args)-1] == "--oneshot" {
		return args[:len(args)-1]
	}
	return args
}

// refillLoop keeps Size children of f ready, within the memory budget.
func (p *Pool) refillLoop(f *flavor) {
	defer p.wg.Done()
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-f.quit:
			return
		case <-f.refill:
		}
		for len(f.ready) < p.cfg.Size && p.underBudget() {
			// At the lowest weight only while ready children remain: an
			// empty pool means runs are waiting for this one.
			c, err := p.spawn(p.ctx, f, true, len(f.ready) > 0)
			if err != nil {
				if p.ctx.Err() == nil {
					p.cfg.Logger.Warn("pool: could not prepare a worker", "err", err)
					select {
					case <-time.After(time.Second):
					case <-p.ctx.Done():
						return
					}
				}
				break
			}
			select {
			case f.ready <- c:
			default:
				c.Close()
			}
		}
	}
}

// underBudget estimates the memory held by the zygotes and the idle
// children: each zygote's resident set, and what each idle child has made
// its own (its cgroup's usage; pages shared with the zygote are not
// charged to it).
func (p *Pool) underBudget() bool { return p.memoryUsed() <= p.cfg.MemoryBudget }

// memoryUsed is underBudget's estimate.
func (p *Pool) memoryUsed() int64 {
	var used int64
	p.extraMu.Lock()
	all := []*flavor{p.light, p.heavy.Load()}
	for _, f := range p.extra {
		all = append(all, f)
	}
	p.extraMu.Unlock()
	for _, f := range all {
		if f == nil {
			continue
		}
		f.mu.Lock()
		used += f.z.Ready.RSSBytes
		f.mu.Unlock()
		n := len(f.ready)
		perChild := int64(8 << 20) // a fork's own pages, when no cgroup measures them
		// Sample one idle child rather than walk the channel.
		select {
		case c := <-f.ready:
			if m := c.MemoryCurrent(); m > 0 {
				perChild = m
			}
			select {
			case f.ready <- c:
			default:
				c.Close()
			}
		default:
		}
		used += int64(n+1) * perChild
	}
	return used
}

// Close stops refilling, kills the idle children and the zygotes, and
// removes every cgroup it made.
func (p *Pool) Close() error {
	p.cancel()
	p.wg.Wait()
	defer func() {
		for drained := false; !drained; {
			select {
			case g := <-p.cgFree:
				g.Delete()
			default:
				drained = true
			}
		}
	}()
	p.extraMu.Lock()
	for k, f := range p.extra {
		delete(p.extra, k)
		p.retire(f)
	}
	p.extraMu.Unlock()
	var err error
	for _, f := range []*flavor{p.light, p.heavy.Load()} {
		if f == nil {
			continue
		}
		if e := p.retire(f); e != nil && err == nil {
			err = e
		}
	}
	return err
}
