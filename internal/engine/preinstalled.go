package engine

import (
	"context"
	"fmt"
	"strings"

	"github.com/pysandbox/pysandbox/internal/interp"
	"github.com/pysandbox/pysandbox/internal/pep"
)

// notPreinstalled returns the requirements the interpreter's own packages
// do not meet, and the others as "name version", which it also tells
// progress of. A requirement the server's Python meets as it is needs
// no installer: on a server without an index (or without a dependency
// cache) a script that declares pandas, as PEP 723 asks, runs with the
// pandas the host has instead of failing to download one. Only a plain
// name with a version range counts; extras, markers and URLs always go
// to the installer.
func (e *Engine) notPreinstalled(ctx context.Context, py *interp.Interpreter, reqs []string, progress func(string)) (rest, have []string) {
	dists := e.distributions(ctx, py)
	if len(dists) == 0 {
		return reqs, nil
	}
	for _, s := range reqs {
		r, err := pep.ParseRequirement(s)
		if err != nil || r.URL != "" || r.Marker != "" || len(r.Extras) > 0 {
			rest = append(rest, s)
			continue
		}
		v, ok := dists[r.Normalized]
		if ok && r.Specifier != "" {
			set, err := pep.ParseSpecifierSet(r.Specifier)
			ok = err == nil && set.Contains(v)
		}
		if !ok {
			rest = append(rest, s)
			continue
		}
		have = append(have, fmt.Sprintf("%s %s", r.Normalized, v))
	}
	if len(have) > 0 && progress != nil {
		progress("already in the server's Python " + py.Version + ", not installed: " + strings.Join(have, ", "))
	}
	return rest, have
}

// distributions are py's own distributions, read once per interpreter;
// none when they cannot be read (every requirement then goes to the
// installer, as before).
func (e *Engine) distributions(ctx context.Context, py *interp.Interpreter) map[string]string {
	if v, ok := e.baseDists.Load(py.Path); ok {
		return v.(map[string]string)
	}
	dists, err := py.Distributions(ctx)
	if err != nil {
		e.log.Warn("the interpreter's own packages could not be listed; every requirement goes to the installer", "python", py.Path, "err", err)
		dists = map[string]string{}
	}
	e.baseDists.Store(py.Path, dists)
	return dists
}
