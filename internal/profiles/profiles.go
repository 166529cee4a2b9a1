// Package profiles gives pysandbox the tool names, parameters and result
// formats of other Python MCP servers (serve --tools PROFILE), so that an
// agent, prompt or parser written for one of them works unchanged. Every
// profile's tools run through internal/tools' Host: the same sandbox,
// limits, policy, approval, rate limits, quotas and audit log as
// pysandbox's own tools. What a peer does that is a hole (the host
// network, no timeout, pip into the server, host paths) is not copied;
// docs/profiles.md lists each such difference.
package profiles

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/pysandbox/pysandbox/internal/pep"
	"github.com/pysandbox/pysandbox/internal/tools"
)

// Native is pysandbox's own tool set, the default.
const Native = "pysandbox"

// Options carry the peers' command-line flags that map onto pysandbox.
type Options struct {
	// Deps are installed for every run_python_code call (mcp-run-python's
	// --deps), cached like any dependency set.
	Deps []string
	// MaxOutputBytes caps each stream of execute_python's text
	// (--max-output-bytes, 102400).
	MaxOutputBytes int
}

type builder func(Options) tools.Profile

// all are the profiles, by name.
var all = map[string]builder{
	"mcp-run-python":          mcpRunPython,
	"mcp-python-exec-sandbox": mcpPythonExecSandbox,
	"mcp-run-python-code":     mcpRunPythonCode,
	"mcp-sandbox":             mcpSandbox,
}

// Names lists every profile name --tools accepts.
func Names() []string {
	out := []string{Native}
	for n := range all {
		out = append(out, n)
	}
	slices.Sort(out[1:])
	return out
}

// Select turns --tools' value (names separated by commas) into the
// profiles to serve and whether pysandbox's own tools are served too. Two
// profiles whose tools share a name cannot be served together.
func Select(spec string, opts Options) (profiles []tools.Profile, native bool, err error) {
	owner := map[string]string{} // tool name -> profile
	seen := map[string]bool{}
	for _, name := range strings.Split(spec, ",") {
		name = strings.TrimSpace(name)
		switch {
		case name == "":
			continue
		case seen[name]:
			return nil, false, fmt.Errorf("--tools names %q twice", name)
		}
		seen[name] = true
		var names []string
		if name == Native {
			native = true
			names = tools.Names
		} else {
			b, ok := all[name]
			if !ok {
				return nil, false, fmt.Errorf("--tools: no profile %q; the profiles are %s", name, strings.Join(Names(), ", "))
			}
			p := b(opts)
			profiles = append(profiles, p)
			names = p.Tools
		}
		for _, t := range names {
			if other, ok := owner[t]; ok {
				return nil, false, fmt.Errorf("--tools: %s and %s both have a tool named %s, and one server cannot offer both; serve them from two pysandbox servers", other, name, t)
			}
			owner[t] = name
		}
	}
	if !native && len(profiles) == 0 {
		return nil, false, errors.New("--tools names no profile")
	}
	if len(opts.Deps) > 0 && !seen["mcp-run-python"] {
		return nil, false, errors.New("--deps is mcp-run-python's: it applies to run_python_code only; use --tools mcp-run-python, or the tools' own dependencies parameters")
	}
	for _, d := range opts.Deps {
		if _, err := pep.ParseRequirement(d); err != nil {
			return nil, false, fmt.Errorf("--deps: %w", err)
		}
	}
	return profiles, native, nil
}

// ToolNames are the names of the tools the selection offers, which a
// policy file may name.
func ToolNames(profiles []tools.Profile, native bool) []string {
	var out []string
	if native {
		out = append(out, tools.Names...)
	}
	for _, p := range profiles {
		out = append(out, p.Tools...)
	}
	return out
}
