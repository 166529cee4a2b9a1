package pydist

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/pysandbox/pysandbox/internal/interp"
	"github.com/pysandbox/pysandbox/internal/pep"
)

// Request is what a run asks for.
type Request struct {
	Version string             // "3.13", "3.13.1", or ""
	Spec    *pep.SpecifierSet  // requires-python, or nil
	Check   func(string) error // the server's Python policy, asked before any download
	// NoDownload finds only installed interpreters, whatever the mode.
	NoDownload bool
	Who        Who
	// Progress gets the install's lines while this call waits for it.
	Progress func(string)
}

// NotAvailableError is a version this server cannot provide: not in the
// metadata, or not installed while downloads are off. Its message says
// what is possible instead.
type NotAvailableError struct{ Msg string }

func (e *NotAvailableError) Error() string { return e.Msg }

// InstallError is a download or unpack that failed: the host, the
// archive, the disk. The run did not happen.
type InstallError struct {
	Version string
	Err     error
}

func (e *InstallError) Error() string {
	return fmt.Sprintf("Python %s could not be installed: %s", e.Version, strings.TrimPrefix(e.Err.Error(), "pydist: "))
}
func (e *InstallError) Unwrap() error { return e.Err }

// Find returns a managed interpreter for req: one installed already, or,
// in automatic mode, one it downloads. The interpreter stays in use (the
// cache never evicts it) until Close.
func (m *Manager) Find(ctx context.Context, req Request) (*interp.Interpreter, error) {
	for _, in := range m.Installed() {
		if matches(in.Interpreter, req) {
			if err := check(req, in.Version); err != nil {
				return nil, err
			}
			if err := m.canHold(in.Key); err != nil {
				return nil, err
			}
			if it, ok := m.hold(in.Key); ok {
				return it, nil
			}
		}
	}
	if err := m.downloads(req); err != nil {
		return nil, err
	}
	d, err := m.pick(ctx, req.Version, req.Spec, req.Who, req.Check)
	if err != nil {
		return nil, err
	}
	if err := check(req, d.Version()); err != nil {
		return nil, err
	}
	if err := m.canHold(artifactKey(d)); err != nil {
		return nil, err
	}
	key, err := m.install(ctx, d, req.Who, req.Progress)
	if err != nil {
		return nil, err
	}
	it, ok := m.hold(key)
	if !ok {
		return nil, &InstallError{Version: d.Version(), Err: errors.New("it was removed from the cache as soon as it was installed; try again")}
	}
	return it, nil
}

// check asks the request's policy about a version.
func check(req Request, version string) error {
	if req.Check == nil {
		return nil
	}
	return req.Check(version)
}

// downloads refuses a request that no download may serve: one that asks
// for none, or any, in manual and never modes.
func (m *Manager) downloads(req Request) error {
	what := req.Version
	if what == "" && req.Spec != nil {
		what = "for requires-python " + req.Spec.String()
	}
	if req.NoDownload {
		return &NotAvailableError{Msg: fmt.Sprintf("no managed Python %s is installed", what)}
	}
	if m.cfg.Mode != Automatic {
		how := "the operator can install it with `pysandbox python install " + req.Version + "`"
		if m.cfg.Mode == Never {
			how = "this server never downloads interpreters (--python-downloads never)"
		}
		return &NotAvailableError{Msg: fmt.Sprintf("Python %s is not installed on this server; %s", what, how)}
	}
	return nil
}

// Preview says, without downloading or holding anything, which managed
// Python would serve req: "3.11.2 (managed, PATH)", or "3.13.15,
// downloaded on first use"; an error saying why none would. Metadata
// behind a URL is not fetched for it.
func (m *Manager) Preview(req Request) (string, error) {
	for _, in := range m.Installed() {
		if matches(in.Interpreter, req) {
			return fmt.Sprintf("%s (managed, %s)", in.Version, in.Path), check(req, in.Version)
		}
	}
	if err := m.downloads(req); err != nil {
		return "", err
	}
	c := m.LoadedCatalog()
	if c == nil {
		return "downloaded on first use, if the download metadata names one", nil
	}
	d, err := c.Find(req.Version, req.Spec)
	if err != nil {
		what := "Python " + req.Version
		if req.Version == "" && req.Spec != nil {
			what = "a Python for requires-python " + req.Spec.String()
		}
		return "", &NotAvailableError{Msg: what + " is neither on this server nor in its download metadata"}
	}
	return fmt.Sprintf("%s, downloaded on first use", d.Version()), check(req, d.Version())
}

func matches(it *interp.Interpreter, req Request) bool {
	if !it.Supported {
		return false
	}
	if req.Version != "" && it.MajorMinor() != req.Version && it.Version != req.Version {
		return false
	}
	return req.Spec == nil || req.Spec.Contains(it.Version)
}

// pick finds the download for a request in the metadata.
func (m *Manager) pick(ctx context.Context, version string, spec *pep.SpecifierSet, who Who, check func(string) error) (*Download, error) {
	c, err := m.Catalog(ctx, who)
	if err != nil {
		return nil, &InstallError{Version: version, Err: err}
	}
	d, err := c.Find(version, spec)
	if err != nil {
		var vs []string
		for _, d := range c.Minors() {
			if check == nil || check(d.Version()) == nil {
				vs = append(vs, d.Version())
			}
		}
		what := "Python " + version
		if version == "" && spec != nil {
			what = "a Python for requires-python " + spec.String()
		}
		list := "none for this machine"
		if len(vs) > 0 {
			list = strings.Join(vs, ", ")
		}
		return nil, &NotAvailableError{Msg: fmt.Sprintf("%s is neither on this server nor in its download metadata; downloadable: %s", what, list)}
	}
	return d, nil
}
