package tools

import (
	"context"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/engine"
)

// CheckEnvironmentInput is empty: the tool takes no arguments.
type CheckEnvironmentInput struct{}

const checkEnvironmentDescription = `Describe the sandbox that run_python uses: the backend, whether code is really sandboxed, each isolation layer (namespaces, seccomp, no_new_privs, capabilities, cgroup memory and pids limits, rlimits) and whether it is in force, the network, the effective limits (memory, processes, timeout, output size, scratch space), the Python interpreters found and the versions the server can download, and the server's policy (which tools are allowed, need the user's approval or are denied, rate limits, which packages may be installed). Every value was measured from inside a real sandbox when the server started. Call it before a heavy job to learn the limits, or when a run fails unexpectedly.`

func (s *server) addCheckEnvironment(srv *mcp.Server) {
	addTool(s, srv, &mcp.Tool{
		Name:        "check_environment",
		Title:       "Check sandbox environment",
		Description: checkEnvironmentDescription,
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, s.checkEnvironment)
}

func (s *server) checkEnvironment(ctx context.Context, req *mcp.CallToolRequest, _ CheckEnvironmentInput) (*mcp.CallToolResult, *engine.Posture, error) {
	p := *s.posture(ctx) // a copy: the shared posture stays as measured
	p.Governance = s.governanceSummary()
	p.Governance.Network = s.networkSummary()
	p.Governance.Upstream = s.upstreamSummary()
	if !s.upstreamsOn() {
		delete(p.Governance.Tools, "list_tools_in_sandbox")
	}
	if p.Pool != nil {
		p.Pool = s.eng.PoolInfo() // it learns modules to preload as it runs
	}
	p.ManagedPythons = s.eng.ManagedPythons()
	p.Sessions = s.stateNote
	return &mcp.CallToolResult{
		IsError: !p.Usable(),
		Content: []mcp.Content{&mcp.TextContent{Text: PostureText(&p) + governanceText(p.Governance)}},
	}, &p, nil
}

func (s *server) governanceSummary() *engine.Governance {
	pol := s.gov.Policy()
	sum := &engine.Governance{Policy: pol.Source, Tools: map[string]string{},
		PackagesAllowed: pol.Packages.Allow, PackagesDenied: pol.Packages.Deny}
	for _, name := range Names {
		sum.Tools[name] = pol.Describe(name)
	}
	if pol.Python != nil {
		sum.PythonAllowed, sum.PythonDenied = pol.Python.Allow, pol.Python.Deny
	}
	return sum
}

func governanceText(sum *engine.Governance) string {
	var b strings.Builder
	fmt.Fprintf(&b, "policy: %s\n", sum.Policy)
	for _, name := range Names {
		if v, ok := sum.Tools[name]; ok {
			fmt.Fprintf(&b, "  %-18s %s\n", name, v)
		}
	}
	if len(sum.PackagesAllowed) > 0 {
		fmt.Fprintf(&b, "packages allowed: %s\n", strings.Join(sum.PackagesAllowed, ", "))
	}
	if len(sum.PackagesDenied) > 0 {
		fmt.Fprintf(&b, "packages denied: %s\n", strings.Join(sum.PackagesDenied, ", "))
	}
	if len(sum.PythonAllowed) > 0 {
		fmt.Fprintf(&b, "Python versions allowed: %s\n", strings.Join(sum.PythonAllowed, ", "))
	}
	if len(sum.PythonDenied) > 0 {
		fmt.Fprintf(&b, "Python versions denied: %s\n", strings.Join(sum.PythonDenied, ", "))
	}
	b.WriteString(networkText(sum.Network))
	b.WriteString(upstreamText(sum.Upstream))
	return b.String()
}

// PostureText renders a posture for people (and for clients that ignore
// structured output). `pysandbox check` prints the same text.
func PostureText(p *engine.Posture) string {
	var b strings.Builder
	fmt.Fprintf(&b, "backend: %s\nposture: %s\nnetwork: %s\n", p.Backend, strings.ToUpper(p.Posture), p.Network)
	if p.Python != nil {
		fmt.Fprintf(&b, "python: %s (%s)\n", p.Python.Version, p.Python.Path)
	}
	if p.Server != nil {
		fmt.Fprintf(&b, "server: %s\n", p.Server.Note)
	}
	b.WriteString("layers:\n")
	for _, l := range []struct {
		name string
		l    engine.Layer
	}{
		{"user namespace", p.Layers.UserNamespace}, {"mount namespace", p.Layers.MountNamespace},
		{"pid namespace", p.Layers.PIDNamespace}, {"net namespace", p.Layers.NetNamespace},
		{"ipc namespace", p.Layers.IPCNamespace}, {"uts namespace", p.Layers.UTSNamespace},
		{"cgroup namespace", p.Layers.CgroupNamespace}, {"seccomp", p.Layers.Seccomp},
		{"no_new_privs", p.Layers.NoNewPrivs}, {"capabilities dropped", p.Layers.CapabilitiesDropped},
		{"cgroup memory", p.Layers.CgroupMemory}, {"cgroup pids", p.Layers.CgroupPids},
		{"cgroup cpu", p.Layers.CgroupCPU}, {"session idle quota", p.Layers.SessionIdle},
		{"rlimits", p.Layers.Rlimits}, {"read-only root", p.Layers.ReadOnlyRoot},
		{"unprivileged user", p.Layers.UnprivilegedUser}, {"no host root", p.Layers.NoHostRoot},
		{"/proc masked", p.Layers.ProcMasked}, {"inotify refused", p.Layers.InotifyDenied},
		{"/usr/local hidden", p.Layers.UsrLocalHidden}, {"landlock", p.Layers.Landlock},
	} {
		mark := "no "
		if l.l.Active {
			mark = "yes"
		}
		fmt.Fprintf(&b, "  [%s] %-21s %s\n", mark, l.name, l.l.Detail)
	}
	lim := p.Limits
	cpu := "no CPU quota"
	if lim.CPUs > 0 {
		cpu = fmt.Sprintf("%.2g CPU", lim.CPUs)
	}
	fmt.Fprintf(&b, "limits: memory %d MiB (%s), %s, processes %d, scratch %d MiB, output %d KiB per stream, timeout %ds (max %ds), %d concurrent runs + %d queued\n",
		lim.MemoryBytes>>20, lim.MemoryEnforcedBy, cpu, lim.MaxProcs, lim.TmpBytes>>20, lim.MaxOutputBytes>>10,
		lim.DefaultTimeoutSeconds, lim.MaxTimeoutSeconds, lim.MaxConcurrent, lim.MaxQueue)
	if p.Pool != nil {
		fmt.Fprintf(&b, "warm pool: %d ready per zygote, preloaded %v", p.Pool.Size, p.Pool.Preloaded)
		if len(p.Pool.Learned) > 0 {
			fmt.Fprintf(&b, " (learned from recent runs: %v)", p.Pool.Learned)
		}
		for m, why := range p.Pool.Failed {
			fmt.Fprintf(&b, "; could not preload %s (%s)", m, why)
		}
		b.WriteString("\n")
	}
	if len(p.Interpreters) > 0 {
		b.WriteString("interpreters found:\n")
		for _, it := range p.Interpreters {
			note := ""
			if !it.Supported {
				note = " (too old for pysandbox)"
			}
			fmt.Fprintf(&b, "  %s  %s%s\n", it.Version, it.Path, note)
		}
	}
	if m := p.ManagedPythons; m != nil {
		fmt.Fprintf(&b, "managed Pythons (downloads %s, preference %s): installed %s; downloadable %s\n", m.Mode, m.Preference, listOrNone(m.Installed), listOrNone(m.Downloadable))
		if m.Problem != "" {
			fmt.Fprintf(&b, "  download metadata: %s\n", m.Problem)
		}
	}
	if p.Sessions != "" {
		fmt.Fprintf(&b, "sessions: %s\n", p.Sessions)
	}
	if len(p.Problems) > 0 {
		b.WriteString("problems:\n")
		for _, pr := range p.Problems {
			fmt.Fprintf(&b, "  - %s\n", pr)
		}
	}
	return b.String()
}

func listOrNone(l []string) string {
	if len(l) == 0 {
		return "none"
	}
	return strings.Join(l, ", ")
}
