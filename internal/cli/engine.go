package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/pysandbox/pysandbox/internal/deps"
	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/interp"
	"github.com/pysandbox/pysandbox/internal/pool"
	"github.com/pysandbox/pysandbox/internal/pydist"
	"github.com/pysandbox/pysandbox/internal/sandbox"
	"github.com/pysandbox/pysandbox/internal/sandbox/cgroup"
)

// engine builds the engine the flags describe. It never substitutes a
// weaker backend for the one asked for. The returned function releases
// what the engine holds (the warm pool); call it when done.
func (o *options) engine(ctx context.Context, log *slog.Logger) (*engine.Engine, func(), error) {
	noop := func() {}
	if err := o.validate(); err != nil {
		return nil, noop, err
	}
	kind, _ := sandbox.ParseKind(o.sandbox)
	// What servers killed without a chance to clean up left behind (their
	// cgroups) goes first; other live servers' groups are left alone.
	if removed, err := cgroup.Reclaim(); err != nil {
		log.Warn("could not remove the cgroups of servers that are gone", "err", err)
	} else if len(removed) > 0 {
		log.Info("removed cgroups left by servers that are gone", "count", len(removed))
	}
	backend, err := newBackend(kind)
	if err != nil {
		return nil, noop, err
	}
	cfg, err := o.engineConfig(ctx, kind, backend, log)
	if err != nil {
		return nil, noop, err
	}
	// The managed interpreters the engine ran on stay in use (never
	// evicted) until it is done with them.
	closePythons := noop
	if cfg.Pythons != nil {
		closePythons = cfg.Pythons.Close
	}
	cold, err := engine.New(cfg)
	if err != nil {
		closePythons()
		return nil, noop, err
	}
	native, ok := backend.(*sandbox.Native)
	if !ok || o.poolSize == 0 {
		if preload, _ := parsePreload(o.preload); o.poolSize > 0 && len(preload) > 0 {
			log.Warn("--preload needs the warm pool, which only the native backend has; ignoring it", "sandbox", o.sandbox)
		}
		return cold, closePythons, nil
	}
	eng, release, err := o.pooledEngine(ctx, cfg, cold, native, log)
	if err != nil {
		closePythons()
		return nil, noop, err
	}
	return eng, func() { release(); closePythons() }, nil
}

// newBackend is the sandbox backend of kind.
func newBackend(kind sandbox.Kind) (sandbox.Backend, error) {
	switch kind {
	case sandbox.KindNative:
		return sandbox.NewNative(), nil
	case sandbox.KindBwrap:
		b, err := sandbox.NewBwrap()
		if err != nil {
			return nil, err
		}
		return b, nil
	}
	return sandbox.None{}, nil
}

// engineConfig is the configuration of an engine on backend: the
// interpreter, the network proxy and the dependency cache the flags
// describe.
func (o *options) engineConfig(ctx context.Context, kind sandbox.Kind, backend sandbox.Backend, log *slog.Logger) (engine.Config, error) {
	py, findErr := interp.Find(ctx, o.python)
	if findErr != nil && !versionArgRE.MatchString(o.python) {
		return engine.Config{}, findErr
	}
	if err := o.buildProxy(log); err != nil {
		return engine.Config{}, err
	}
	netOn := o.networkRules().Enabled()
	if netOn && kind != sandbox.KindNative {
		log.Warn("runs get no network: the network proxy needs the native sandbox backend", "sandbox", o.sandbox)
		netOn = false
	}
	cache, err := o.depsCache(backend, log)
	var noDeps string
	if err != nil {
		var ue usageError
		if errors.As(err, &ue) {
			return engine.Config{}, err
		}
		// Runs without dependencies need no cache: serve them, and say why
		// the others cannot be.
		noDeps = err.Error()
		log.Warn("dependencies disabled", "err", err)
		cache = nil
	}
	var pythons *pydist.Manager
	var noPythons string
	pref, _ := pydist.ParsePreference(o.pyPreference)
	if cache != nil && pref != pydist.OnlySystem {
		// Managed interpreters live in the same cache, under its cap.
		if pythons, err = o.pythons(cache, backend, log); errors.Is(err, pydist.ErrUnmountable) {
			log.Warn("managed Pythons disabled", "err", err)
			noPythons = strings.TrimPrefix(err.Error(), "pydist: ")
		} else if err != nil {
			return engine.Config{}, err
		}
	}
	// --python 3.X: a managed build when the host lacks it (or, as the
	// preference says, even when it has it), as a run's python_version
	// would get.
	if pythons != nil && versionArgRE.MatchString(o.python) {
		req := pydist.Request{Version: o.python, Check: o.checkPython, Who: pydist.Who{Identity: "operator", Tool: "--python"},
			Progress: func(line string) { log.Info(line) }}
		switch {
		case pref == pydist.OnlyManaged || findErr != nil:
			if py, err = pythons.Find(ctx, req); err != nil {
				return engine.Config{}, fmt.Errorf("--python %s: %w", o.python, err)
			}
			findErr = nil
		case pref == pydist.PreferManaged:
			req.NoDownload = true
			if it, err := pythons.Find(ctx, req); err == nil {
				py = it
			}
		}
	}
	if findErr != nil {
		return engine.Config{}, findErr
	}
	return engine.Config{
		Backend:          backend,
		Python:           py,
		Discover:         interp.Discover,
		Deps:             cache,
		NoDepsReason:     noDeps,
		Pythons:          pythons,
		PythonPreference: pref,
		NoPythonsReason:  noPythons,
		CheckPython:      o.checkPython,
		CheckPackage:     o.checkPackage,
		Limits:           o.limits(),
		DefaultTimeout:   time.Duration(o.timeout),
		MaxTimeout:       time.Duration(o.maxTimeout),
		MaxOutput:        int(o.maxOutput),
		MaxConcurrent:    o.maxConcurrent,
		MaxQueue:         o.maxQueue,
		Network:          netOn,
		Logger:           log,
	}, nil
}

// pooledEngine is an engine whose backend is a warm pool over native,
// forking runs with cold's spec.
func (o *options) pooledEngine(ctx context.Context, cfg engine.Config, cold *engine.Engine, native *sandbox.Native, log *slog.Logger) (*engine.Engine, func(), error) {
	noop := func() {}
	preload, _ := parsePreload(o.preload)
	p, err := pool.New(ctx, pool.Config{
		Backend:       native,
		Spec:          cold.RunSpec(),
		Preload:       preload,
		Learn:         o.learnPreload,
		Size:          o.poolSize,
		MemoryBudget:  int64(o.poolMemory),
		MaxConcurrent: o.maxConcurrent,
		ZygoteMaxRuns: o.zygoteRuns,
		ZygoteMaxAge:  time.Duration(o.zygoteAge),
		Logger:        log,
		Trace:         o.trace,
	})
	if err != nil {
		return nil, noop, err
	}
	if o.onPool != nil {
		o.onPool(p)
	}
	cfg.Backend = p
	eng, err := engine.New(cfg)
	if err != nil {
		p.Close()
		return nil, noop, err
	}
	return eng, func() { p.Close() }, nil
}

// limits are the per-run limits the flags describe.
func (o *options) limits() sandbox.Limits {
	return sandbox.Limits{MemoryBytes: int64(o.memory), MaxProcs: o.maxProcs, TmpBytes: int64(o.tmpSize), CPUMilli: int64(o.cpus * 1000)}
}

// depsCache opens the dependency cache; installs run in backend's sandboxes.
func (o *options) depsCache(backend sandbox.Backend, log *slog.Logger) (*deps.Cache, error) {
	if err := o.checkIndex(); err != nil {
		return nil, err
	}
	return deps.New(deps.Config{
		Dir:      o.cacheDir,
		MaxBytes: int64(o.cacheSize),
		Index: deps.IndexConfig{
			IndexURL: o.indexURL, ExtraIndexURLs: o.extraIndexURLs, FindLinks: o.findLinks,
			NoIndex: o.noIndex, AllowSdist: o.allowSdist,
		},
		Backend: backend,
		Limits:  o.limits(),
		Timeout: time.Duration(o.installTimeout),
		Network: o.proxy.Installer,
		Logger:  log,
	})
}

// checkIndex refuses package index flags that cannot work.
func (o *options) checkIndex() error {
	for _, fl := range o.findLinks {
		if !strings.Contains(fl, "://") && !filepath.IsAbs(fl) {
			return usageError{fmt.Errorf("--find-links %q: give an absolute directory or a URL", fl)}
		}
	}
	if o.noIndex && len(o.findLinks) == 0 {
		return usageError{errors.New("--no-index needs at least one --find-links wheelhouse")}
	}
	return nil
}
