package engine

import (
	"github.com/pysandbox/pysandbox/internal/deps"
	"github.com/pysandbox/pysandbox/internal/pep"
)

// PackageDeniedError is a requirement, or a package the installer pulled
// in, that the server's package rules refuse. Nothing was run.
type PackageDeniedError struct{ Err error }

func (e *PackageDeniedError) Error() string { return e.Err.Error() }
func (e *PackageDeniedError) Unwrap() error { return e.Err }

// checkRequested applies the package rules to what was asked for, before
// anything is installed (an sdist's build runs code, and even a wheel's
// download should not happen for a refused package).
func (e *Engine) checkRequested(reqs []string) error {
	if e.cfg.CheckPackage == nil {
		return nil
	}
	for _, s := range reqs {
		r, err := pep.ParseRequirement(s)
		if err != nil {
			return &RequestError{Msg: "invalid requirement: " + err.Error()}
		}
		if err := e.cfg.CheckPackage(r.Normalized, true); err != nil {
			return &PackageDeniedError{Err: err}
		}
	}
	return nil
}

// checkInstalled applies the package rules to every distribution in an
// environment, including those the installer pulled in as dependencies,
// before any code can import them. It also covers environments cached
// before the rules changed.
func (e *Engine) checkInstalled(env *deps.Env) error {
	if e.cfg.CheckPackage == nil {
		return nil
	}
	dists, err := env.Distributions()
	if err != nil {
		// Fail closed: an environment we cannot inspect is not used.
		return &PackageDeniedError{Err: err}
	}
	for _, d := range dists {
		if err := e.cfg.CheckPackage(d, false); err != nil {
			return &PackageDeniedError{Err: err}
		}
	}
	return nil
}
