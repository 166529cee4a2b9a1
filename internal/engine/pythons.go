package engine

import (
	"errors"
	"fmt"

	"github.com/pysandbox/pysandbox/internal/pep"
	"github.com/pysandbox/pysandbox/internal/pydist"
)

// ManagedPythons is what check_environment says of the Python versions the
// server provides beyond the host's.
type ManagedPythons struct {
	// Mode is when they are downloaded: automatic, manual or never.
	Mode string `json:"mode"`
	// Installed are the versions unpacked in the cache, newest first.
	Installed []string `json:"installed"`
	// Downloadable are the newest release of each minor version the
	// download metadata has for this machine (automatic mode downloads
	// one when a run asks for it).
	Downloadable []string `json:"downloadable"`
	// Preference is which Python serves a run that names a version
	// (system, managed, only-managed).
	Preference string `json:"preference"`
	// Metadata is where the list comes from; Problem, when set, why it
	// could not be read, or why the server downloads none.
	Metadata string `json:"metadata"`
	Problem  string `json:"problem,omitempty"`
}

// ManagedPythons describes the managed interpreters now; nil when the
// server provides none. Metadata behind a URL that has not been fetched
// yet is not fetched for this.
func (e *Engine) ManagedPythons() *ManagedPythons {
	m := e.cfg.Pythons
	if m == nil {
		if e.cfg.NoPythonsReason != "" {
			return &ManagedPythons{Mode: "off", Installed: []string{}, Downloadable: []string{}, Problem: e.cfg.NoPythonsReason}
		}
		return nil
	}
	pref := e.cfg.PythonPreference
	if pref == "" {
		pref = pydist.PreferSystem
	}
	out := &ManagedPythons{Mode: string(m.Mode()), Preference: string(pref), Installed: []string{}, Downloadable: []string{}}
	for _, in := range m.Installed() {
		out.Installed = append(out.Installed, in.Version)
	}
	c := m.LoadedCatalog()
	if c == nil {
		out.Problem = "the download metadata is read from its URL when a run first needs it"
		return out
	}
	out.Metadata = c.Source
	if m.Mode() == pydist.Never {
		return out
	}
	for _, d := range c.Minors() {
		if e.checkPython(d.Version()) == nil {
			out.Downloadable = append(out.Downloadable, d.Version())
		}
	}
	return out
}

// WhichPython says, without downloading anything, which Python would
// serve a run with this python_version and requires-python: "3.11.2
// (/usr/bin/python3.11)", or "3.13.15, downloaded on first use"; an error
// saying why none would.
func (e *Engine) WhichPython(version, requiresPython string) (string, error) {
	var set *pep.SpecifierSet
	if requiresPython != "" {
		s, err := pep.ParseSpecifierSet(requiresPython)
		if err != nil {
			return "", fmt.Errorf("requires-python %q is invalid: %v", requiresPython, err)
		}
		set = &s
	}
	m := e.cfg.Pythons
	onlyManaged := m != nil && e.cfg.PythonPreference == pydist.OnlyManaged && (version != "" || set != nil)
	if !onlyManaged {
		if it, err := e.hostInterpreter(version, set, requiresPython); err == nil {
			return fmt.Sprintf("%s (%s)", it.Version, it.Path), e.checkPython(it.Version)
		} else if m == nil {
			return "", err
		}
	}
	desc, err := m.Preview(pydist.Request{Version: version, Spec: set, Check: e.checkPython})
	var na *pydist.NotAvailableError
	if errors.As(err, &na) {
		return "", errors.New(na.Msg)
	}
	return desc, err
}
