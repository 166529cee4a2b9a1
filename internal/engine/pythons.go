package engine

import (
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
	// Metadata is where the list comes from; Problem, when set, why it
	// could not be read.
	Metadata string `json:"metadata"`
	Problem  string `json:"problem,omitempty"`
}

// ManagedPythons describes the managed interpreters now; nil when the
// server provides none. Metadata behind a URL that has not been fetched
// yet is not fetched for this.
func (e *Engine) ManagedPythons() *ManagedPythons {
	m := e.cfg.Pythons
	if m == nil {
		return nil
	}
	out := &ManagedPythons{Mode: string(m.Mode()), Installed: []string{}, Downloadable: []string{}}
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
