package engine

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/pysandbox/pysandbox/internal/interp"
	"github.com/pysandbox/pysandbox/internal/pep"
)

// distsFor is how long an interpreter's listing of its own packages is
// used before it is read again (the host's packages may change), and how
// long a listing that failed is not tried again.
const distsFor = time.Minute

// preinstalled tells whether the interpreter's own packages meet every one
// of reqs as they are, and if so lists them ("name version"). Such a set
// needs no installer: on a server without an index (or without a
// dependency cache) a script that declares pandas, as PEP 723 asks, runs
// with the pandas the host has instead of failing to download one. Only
// the whole set counts: one requirement the host does not meet sends them
// all to the installer, which resolves them together (a package it
// installs for the others must not break a version range the host's copy
// met). Only plain names with version ranges can be met; extras, markers
// and URLs always go to the installer.
func (e *Engine) preinstalled(ctx context.Context, py *interp.Interpreter, reqs []string) ([]string, bool) {
	if len(reqs) == 0 {
		return nil, false
	}
	dists := e.distributions(ctx, py)
	if len(dists) == 0 {
		return nil, false
	}
	have := make([]string, 0, len(reqs))
	for _, s := range reqs {
		r, err := pep.ParseRequirement(s)
		if err != nil || r.URL != "" || r.Marker != "" || len(r.Extras) > 0 {
			return nil, false
		}
		v, ok := dists[r.Normalized]
		if ok && r.Specifier != "" {
			set, err := pep.ParseSpecifierSet(r.Specifier)
			ok = err == nil && set.Contains(v)
		}
		if !ok {
			return nil, false
		}
		have = append(have, fmt.Sprintf("%s %s", r.Normalized, v))
	}
	return have, true
}

// tellPreinstalled says so on the progress stream.
func tellPreinstalled(py *interp.Interpreter, have []string, progress func(string)) {
	if progress != nil {
		progress("already in the server's Python " + py.Version + ", nothing to install: " + strings.Join(have, ", "))
	}
}

// baseDists is one interpreter's listing and when it was read.
type baseDists struct {
	dists map[string]string
	at    time.Time
}

// distributions are py's own distributions, read at most once a minute;
// none when they cannot be read (every requirement then goes to the
// installer, as it would without this). The reading is the server's, not
// the caller's: a call cancelled meanwhile does not cut it short.
func (e *Engine) distributions(ctx context.Context, py *interp.Interpreter) map[string]string {
	if v, ok := e.baseDists.Load(py.Path); ok && time.Since(v.(baseDists).at) < distsFor {
		return v.(baseDists).dists
	}
	dists, err := py.Distributions(context.WithoutCancel(ctx))
	if err != nil {
		e.log.Warn("the interpreter's own packages could not be listed; every requirement goes to the installer for a minute", "python", py.Path, "err", err)
		dists = map[string]string{}
	}
	e.baseDists.Store(py.Path, baseDists{dists: dists, at: time.Now()})
	return dists
}
