package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	"github.com/pysandbox/pysandbox/internal/deps"
	"github.com/pysandbox/pysandbox/internal/interp"
	"github.com/pysandbox/pysandbox/internal/pep"
	"github.com/pysandbox/pysandbox/internal/pydist"
	"github.com/pysandbox/pysandbox/internal/sandbox"
	"github.com/pysandbox/pysandbox/internal/worker"
)

// StatusInstallError is a run whose dependencies could not be installed;
// the code did not run.
const StatusInstallError Status = "install_error"

// envSite is where a dependency environment is mounted, read-only, inside
// the sandbox; the worker puts it on sys.path (--site).
const envSite = "/.pysandbox/env"

// RequestError is a request that cannot be run as asked (an unknown Python
// version, invalid requirements, a requires-python no interpreter meets).
// Its message says what to change.
type RequestError struct{ Msg string }

func (e *RequestError) Error() string { return e.Msg }

// requestError is err as a RequestError when it is the request's fault
// (requirements no install may be made of), so that the caller hears
// what to change rather than of a failed sandbox.
func requestError(err error) error {
	if re, ok := errors.AsType[*deps.RequirementError](err); ok {
		return &RequestError{Msg: re.Msg}
	}
	return err
}

// runEnv is what a run needs beyond the code: its interpreter and, when it
// has dependencies, their environment.
type runEnv struct {
	py      *interp.Interpreter
	env     *deps.Env
	release func()
	// declared are the requirements the interpreter met as it is, when
	// env is nil for that reason: a session keeps them, so that what it
	// installs later is resolved with them.
	declared []string
}

func (r *runEnv) close() {
	if r.release != nil {
		r.release()
	}
}

// resolve picks the interpreter (python_version, else requires-python,
// else the default) and builds or finds the dependency environment (the
// dependencies parameter merged with the code's PEP 723 block).
func (e *Engine) resolve(ctx context.Context, code, version, caller string, extra []string, progress func(string)) (*runEnv, error) {
	meta, err := pep.ParseScriptMetadata(code)
	if err != nil {
		return nil, &RequestError{Msg: "the inline script metadata (# /// script) is invalid: " + err.Error()}
	}
	var blockDeps []string
	requiresPython := ""
	if meta != nil {
		blockDeps, requiresPython = meta.Dependencies, meta.RequiresPython
	}
	py, err := e.interpreter(ctx, version, requiresPython, caller, progress)
	if err != nil {
		return nil, err
	}
	reqs, errs := pep.MergeRequirements(blockDeps, extra)
	if len(errs) > 0 {
		var msgs []string
		for _, err := range errs {
			msgs = append(msgs, err.Error())
		}
		return nil, &RequestError{Msg: "invalid requirement: " + strings.Join(msgs, "; ")}
	}
	r := &runEnv{py: py}
	if len(reqs) == 0 {
		return r, nil
	}
	// The package rules see what was asked for, preinstalled or not.
	if err := e.checkRequested(reqs); err != nil {
		return nil, err
	}
	if have, ok := e.preinstalled(ctx, py, reqs); ok {
		tellPreinstalled(py, have, progress)
		r.declared = reqs
		return r, nil
	}
	if e.cfg.Deps == nil {
		why := "it was started without a dependency cache"
		if e.cfg.NoDepsReason != "" {
			why = e.cfg.NoDepsReason
		}
		return nil, &RequestError{Msg: "this server installs no dependencies (" + why + "); use only the standard library and preinstalled packages"}
	}
	env, release, err := e.cfg.Deps.Ensure(ctx, py, reqs, progress)
	if err != nil {
		return nil, requestError(err)
	}
	if err := e.checkInstalled(env); err != nil {
		release()
		return nil, err
	}
	r.env, r.release = env, release
	return r, nil
}

// interpreter picks the Python for a run: the host's (the default, then
// the others found), then the managed ones (e.cfg.Pythons), which may
// download it. The server's Python policy is asked about the one picked,
// and about a download before it starts.
func (e *Engine) interpreter(ctx context.Context, version, requiresPython, caller string, progress func(string)) (*interp.Interpreter, error) {
	var set *pep.SpecifierSet
	if requiresPython != "" {
		s, err := pep.ParseSpecifierSet(requiresPython)
		if err != nil {
			return nil, &RequestError{Msg: fmt.Sprintf("requires-python %q is invalid: %v", requiresPython, err)}
		}
		set = &s
	}
	pref := e.cfg.PythonPreference
	if e.cfg.Pythons == nil {
		pref = pydist.OnlySystem
	}
	managed := func(download bool) (*interp.Interpreter, error) {
		return e.cfg.Pythons.Find(ctx, pydist.Request{Version: version, Spec: set, Check: e.checkPython, NoDownload: !download,
			Who: pydist.Who{Identity: caller, Tool: "run"}, Progress: progress})
	}
	if version != "" {
		m := pythonVersionRE.FindStringSubmatch(version)
		if m == nil {
			return nil, &RequestError{Msg: fmt.Sprintf("python_version %.40q is not one pysandbox runs: give a Python 3 version (3.8 or later), such as 3.12 or 3.12.4", version)}
		}
		// 3.x older than the worker runs on: say so, rather than that no
		// such Python is here (the host may well have it).
		if minor, _ := strconv.Atoi(m[1]); minor < interp.MinVersion[1] {
			return nil, &RequestError{Msg: fmt.Sprintf("python_version %s is older than pysandbox runs: its worker needs Python %d.%d or later; give a later version, such as 3.12", version, interp.MinVersion[0], interp.MinVersion[1])}
		}
	}
	asked := version != "" || (set != nil && !set.Contains(e.cfg.Python.Version))
	switch {
	case pref == pydist.OnlyManaged && (version != "" || set != nil):
		// Only managed builds serve a version a run names, by
		// python_version or by requires-python.
		// A run that names a version gets a managed build of it, never
		// the host's; one that names none, the default.
		it, err := managed(true)
		var na *pydist.NotAvailableError
		if errors.As(err, &na) {
			return nil, &RequestError{Msg: na.Msg + " (this server's --python-preference only-managed leaves the host's interpreters out)"}
		}
		return it, err
	case pref == pydist.PreferManaged && asked:
		if it, err := managed(false); err == nil {
			return it, nil
		} else if !isNotAvailable(err) {
			return nil, e.pythonError(err)
		}
	}
	it, err := e.hostInterpreter(version, set, requiresPython)
	if err != nil {
		var nf *notFound
		if !errors.As(err, &nf) {
			return nil, err
		}
		if pref == pydist.OnlySystem {
			msg := nf.msg
			if e.cfg.NoPythonsReason != "" {
				msg += "; the server downloads no other (" + e.cfg.NoPythonsReason + ")"
			}
			return nil, &RequestError{Msg: msg}
		}
		it, err = managed(true)
		if err != nil {
			return nil, e.pythonError(err)
		}
		return it, nil
	}
	if err := e.checkPython(it.Version); err != nil {
		return nil, err
	}
	return it, nil
}

func isNotAvailable(err error) bool {
	var na *pydist.NotAvailableError
	return errors.As(err, &na)
}

// pythonVersionRE is what python_version may be: "3.12" or "3.12.4",
// its minor version the first group.
var pythonVersionRE = regexp.MustCompile(`^3\.([0-9]{1,2})(\.[0-9]{1,3})?$`)

// checkPython asks the server's Python policy about a version.
func (e *Engine) checkPython(version string) error {
	if e.cfg.CheckPython == nil {
		return nil
	}
	if err := e.cfg.CheckPython(version); err != nil {
		return &PythonDeniedError{Err: err}
	}
	return nil
}

// PythonDeniedError is a run refused by the server's Python policy: the
// interpreter it needs is a version the policy does not allow.
type PythonDeniedError struct{ Err error }

func (e *PythonDeniedError) Error() string { return e.Err.Error() }
func (e *PythonDeniedError) Unwrap() error { return e.Err }

// notFound is a request no host interpreter meets; its message lists what
// the host has.
type notFound struct{ msg string }

func (e *notFound) Error() string { return e.msg }

// pythonError explains a managed interpreter that could not be had: a
// version nobody provides is the request's to change; an install that
// failed is reported as a result of its own (installResult).
func (e *Engine) pythonError(err error) error {
	if err == nil {
		return nil
	}
	var na *pydist.NotAvailableError
	if errors.As(err, &na) {
		return &RequestError{Msg: na.Msg + "; on the host: " + available(e.interpreters())}
	}
	return err
}

// hostInterpreter picks among the host's interpreters; a *notFound when
// none meets the request.
func (e *Engine) hostInterpreter(version string, set *pep.SpecifierSet, requiresPython string) (*interp.Interpreter, error) {
	if version == "" && (set == nil || set.Contains(e.cfg.Python.Version)) {
		return e.cfg.Python, nil // the common case: no need to look further
	}
	all := e.interpreters()
	if version != "" {
		for _, it := range all {
			if it.Supported && (it.MajorMinor() == version || it.Version == version) {
				if set != nil && !set.Contains(it.Version) {
					return nil, &RequestError{Msg: fmt.Sprintf("python_version %s does not satisfy the script's requires-python %q", it.Version, requiresPython)}
				}
				return it, nil
			}
		}
		return nil, &notFound{fmt.Sprintf("Python %s is not available on this server; available: %s", version, available(all))}
	}
	if set == nil || set.Contains(e.cfg.Python.Version) {
		return e.cfg.Python, nil
	}
	// The newest interpreter that satisfies requires-python.
	for _, it := range all {
		if it.Supported && set.Contains(it.Version) {
			return it, nil
		}
	}
	return nil, &notFound{fmt.Sprintf("no interpreter on this server satisfies requires-python %q; available: %s", requiresPython, available(all))}
}

func (e *Engine) interpreters() []*interp.Interpreter {
	e.discoverOnce.Do(func() {
		if len(e.cfg.Interpreters) == 0 && e.cfg.Discover != nil {
			e.cfg.Interpreters = e.cfg.Discover(context.Background())
		}
	})
	if len(e.cfg.Interpreters) > 0 {
		return e.cfg.Interpreters
	}
	return []*interp.Interpreter{e.cfg.Python}
}

func available(all []*interp.Interpreter) string {
	var vs []string
	for _, it := range all {
		if it.Supported {
			vs = append(vs, it.Version)
		}
	}
	return strings.Join(vs, ", ")
}

// specFor is the sandbox spec of a worker for py with env's packages.
func (e *Engine) specFor(r *runEnv, oneshot bool, stdout, stderr io.Writer) *sandbox.Spec {
	py := e.cfg.Python
	if r != nil && r.py != nil {
		py = r.py
	}
	var sites []string
	var binds []sandbox.Bind
	if r != nil && r.env != nil {
		sites = append(sites, envSite)
		binds = append(binds, sandbox.Bind{Source: r.env.Site, Target: envSite})
	}
	return &sandbox.Spec{
		Python: py.Path,
		Prefix: py.Prefix,
		Args:   worker.Command(py.Path, workerPath, oneshot, sites...)[1:],
		Env:    e.workerEnv(),
		Proxy:  e.cfg.Network,
		Files:  []sandbox.File{{Path: workerPath, Content: worker.Source}, {Path: toolsPath, Content: worker.ToolsSource}, {Path: factsPath, Content: worker.CodeFactsSource}, {Path: "/.pysandbox/" + worker.SnapshotFile, Content: worker.SnapshotSource}},
		Binds:  binds,
		Limits: e.cfg.Limits,
		Stdout: stdout,
		Stderr: stderr,
	}
}

// installResult reports a failed install as a result of its own status:
// the agent sees which requirement failed and why, never a crash.
func (e *Engine) installResult(err error) (*Result, bool) {
	var pe *pydist.InstallError
	if errors.As(err, &pe) {
		return &Result{
			Status:   StatusInstallError,
			ExitCode: -1,
			Message:  pe.Error() + "; retry later, or tell the server's operator (pysandbox python install, --python-install-mirror)",
			Sandbox:  string(e.cfg.Backend.Kind()),
		}, true
	}
	var ie *deps.InstallError
	if !errors.As(err, &ie) {
		return nil, false
	}
	return &Result{
		Status:   StatusInstallError,
		ExitCode: -1,
		Stderr:   strings.Join(ie.Lines, "\n"),
		Message:  ie.Summary() + ". " + ie.Advice(),
		Sandbox:  string(e.cfg.Backend.Kind()),
	}, true
}
