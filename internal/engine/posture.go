package engine

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pysandbox/pysandbox/internal/interp"
	"github.com/pysandbox/pysandbox/internal/sandbox"
)

// Layer is one isolation layer and whether it is really in force, as
// measured from inside a sandbox.
type Layer struct {
	Active bool   `json:"active"`
	Detail string `json:"detail,omitempty"`
}

// Layers lists every isolation layer.
type Layers struct {
	UserNamespace       Layer `json:"user_namespace"`
	MountNamespace      Layer `json:"mount_namespace"`
	PIDNamespace        Layer `json:"pid_namespace"`
	NetNamespace        Layer `json:"net_namespace"`
	IPCNamespace        Layer `json:"ipc_namespace"`
	UTSNamespace        Layer `json:"uts_namespace"`
	CgroupNamespace     Layer `json:"cgroup_namespace"`
	Seccomp             Layer `json:"seccomp"`
	NoNewPrivs          Layer `json:"no_new_privs"`
	CapabilitiesDropped Layer `json:"capabilities_dropped"`
	CgroupMemory        Layer `json:"cgroup_memory"`
	CgroupPids          Layer `json:"cgroup_pids"`
	// CgroupCPU: each run has a CPU quota (cpu.cfs_quota_us / cpu.max);
	// SessionIdle: sessions are held to a thousandth of a CPU between runs.
	CgroupCPU        Layer `json:"cgroup_cpu"`
	SessionIdle      Layer `json:"session_idle"`
	Rlimits          Layer `json:"rlimits"`
	ReadOnlyRoot     Layer `json:"read_only_root"`
	UnprivilegedUser Layer `json:"unprivileged_user"`
	// NoHostRoot: the sandbox's uid_map maps nothing to uid 0 of the
	// namespace above it (host root, for a cold sandbox).
	NoHostRoot Layer `json:"no_host_root"`
	// ProcMasked: what /proc would tell about the host is empty or
	// unreadable, and /proc/sys and its kin are read-only.
	ProcMasked Layer `json:"proc_masked"`
	// InotifyDenied: file watches on the shared read-only trees are
	// refused (they would show what other tenants' runs open).
	InotifyDenied Layer `json:"inotify_denied"`
	// UsrLocalHidden: the host's /usr/local shows only its Python
	// directories.
	UsrLocalHidden Layer `json:"usr_local_hidden"`
	// Landlock: writes only beneath /tmp, /work and /dev/shm, abstract
	// sockets and signals scoped to the sandbox, where the kernel has it.
	// The kernel's ABI is measured inside; the domain is applied at setup
	// (a process cannot see its own Landlock domain).
	Landlock Layer `json:"landlock"`
}

// Limits are the effective limits of every run.
type Limits struct {
	MemoryBytes           int64   `json:"memory_bytes"`
	MemoryEnforcedBy      string  `json:"memory_enforced_by"` // "cgroup v1", "cgroup v2", "RLIMIT_AS", "none"
	MaxProcs              int64   `json:"max_procs"`
	CPUs                  float64 `json:"cpus"` // CPU quota per run (0: none)
	TmpBytes              int64   `json:"tmp_bytes"`
	MaxOutputBytes        int     `json:"max_output_bytes"`
	DefaultTimeoutSeconds int     `json:"default_timeout_seconds"`
	MaxTimeoutSeconds     int     `json:"max_timeout_seconds"`
	MaxConcurrent         int     `json:"max_concurrent"`
	MaxQueue              int     `json:"max_queue"`
}

// Posture is the output of check_environment and `pysandbox check`.
type Posture struct {
	Backend string `json:"backend"`
	// Posture is "sandboxed" only when every namespace, seccomp,
	// no_new_privs and the capability drop were seen in force.
	Posture      string                `json:"posture"`
	Layers       Layers                `json:"layers"`
	Network      string                `json:"network"`
	Limits       Limits                `json:"limits"`
	Python       *interp.Interpreter   `json:"python"`
	Interpreters []*interp.Interpreter `json:"interpreters"`
	// ManagedPythons are the versions the server downloads on demand.
	ManagedPythons *ManagedPythons `json:"managed_pythons,omitempty"`
	// Pool describes the warm pool, when runs come from one.
	Pool *sandbox.PoolInfo `json:"pool,omitempty"`
	// Problems lists every layer that is missing and why, with advice.
	Problems   []string  `json:"problems"`
	MeasuredAt time.Time `json:"measured_at"`
	// Governance is filled in by the MCP layer: the rules calls are under.
	Governance *Governance `json:"governance,omitempty"`
	// Server is where the server itself runs (a pod, privileged or in a
	// user namespace; root or not).
	Server *ServerContext `json:"server,omitempty"`
	// Sessions says whether paused sessions outlive the server, and where
	// they are kept (or why they are not).
	Sessions string `json:"sessions,omitempty"`
}

// Governance is what the server's policy means for the agent, so it can
// plan within it.
type Governance struct {
	Policy string `json:"policy"` // where the policy came from
	// Tools maps each tool to allow, deny or approve (the user is asked
	// first), followed by its rate limits.
	Tools           map[string]string `json:"tools"`
	PackagesAllowed []string          `json:"packages_allowed,omitempty"` // empty: any package not denied
	PackagesDenied  []string          `json:"packages_denied,omitempty"`
	// PythonAllowed and PythonDenied are the policy's python rules.
	PythonAllowed []string `json:"python_allowed,omitempty"`
	PythonDenied  []string `json:"python_denied,omitempty"`
	// Network is what runs may reach through the server's proxy; nil: no
	// network at all.
	Network *NetworkPolicy `json:"network,omitempty"`
	// Upstream is what code may call through its "tools" module; nil:
	// nothing.
	Upstream *UpstreamPolicy `json:"upstream,omitempty"`
}

// UpstreamPolicy says which upstream MCP servers code can call, and
// under what caps.
type UpstreamPolicy struct {
	Servers []UpstreamServer `json:"servers"`
	// Rules are the policy's rules for upstream tools (SERVER.TOOL or
	// SERVER.*): allow, deny or approve, and rate limits. Tools no rule
	// names follow the policy's default.
	Rules       map[string]string `json:"rules,omitempty"`
	Default     string            `json:"default"`
	CallsPerRun int               `json:"calls_per_run"`
	BytesPerRun int64             `json:"bytes_per_run"`
}

// UpstreamServer is one upstream server's state.
type UpstreamServer struct {
	Name   string `json:"name"`
	Status string `json:"status"` // ready, connecting, failed
	Error  string `json:"error,omitempty"`
	Tools  int    `json:"tools"` // callable from code under the policy
}

// NetworkPolicy is the network section of a policy, as check_environment
// reports it.
type NetworkPolicy struct {
	Proxy             string   `json:"proxy"` // where HTTP_PROXY and HTTPS_PROXY point inside
	Allow             []string `json:"allow"`
	Approve           []string `json:"approve,omitempty"` // the user is asked first
	Deny              []string `json:"deny,omitempty"`
	BytesIn           int64    `json:"bytes_in_per_run"`
	BytesOut          int64    `json:"bytes_out_per_run"`
	Connections       int      `json:"connections_per_run"`
	ConnectionSeconds int64    `json:"connection_seconds"`
}

// PoolInfo describes the warm pool now (what it preloads changes as it
// learns), or nil without one.
func (e *Engine) PoolInfo() *sandbox.PoolInfo {
	if pb, ok := e.cfg.Backend.(pooled); ok {
		info := pb.Info()
		return &info
	}
	return nil
}

// pooled is implemented by a warm-pool backend.
type pooled interface {
	Info() sandbox.PoolInfo
}

// Usable reports whether the requested backend works here as promised.
func (p *Posture) Usable() bool {
	if p.Backend == string(sandbox.KindNone) {
		return p.Python != nil
	}
	return p.Posture == "sandboxed"
}

var (
	postureMu   sync.Mutex
	hostNSCache map[string]string
)

// hostNamespaces are the server's own namespaces; a sandbox's differ.
func hostNamespaces() map[string]string {
	postureMu.Lock()
	defer postureMu.Unlock()
	if hostNSCache == nil {
		hostNSCache = map[string]string{}
		entries, _ := os.ReadDir("/proc/self/ns")
		for _, e := range entries {
			if l, err := os.Readlink(filepath.Join("/proc/self/ns", e.Name())); err == nil {
				hostNSCache[e.Name()] = l
			}
		}
	}
	return hostNSCache
}

// Measure starts a sandbox, asks the worker inside what it sees, and
// compares that with the host. It reports what is true, not what was
// configured.
func (e *Engine) Measure(ctx context.Context, interpreters []*interp.Interpreter) *Posture {
	p := &Posture{
		Backend:      string(e.cfg.Backend.Kind()),
		Posture:      "unsandboxed",
		Python:       e.cfg.Python,
		Interpreters: interpreters,
		MeasuredAt:   time.Now().UTC(),
		Network:      "unknown",
		Problems:     []string{},
		Server:       serverContext(),
	}
	p.Limits = Limits{
		MemoryBytes:           e.cfg.Limits.MemoryBytes,
		MaxProcs:              e.cfg.Limits.MaxProcs,
		TmpBytes:              e.cfg.Limits.TmpBytes,
		MaxOutputBytes:        e.cfg.MaxOutput,
		DefaultTimeoutSeconds: int(e.cfg.DefaultTimeout / time.Second),
		MaxTimeoutSeconds:     int(e.cfg.MaxTimeout / time.Second),
		MaxConcurrent:         e.cfg.MaxConcurrent,
		MaxQueue:              e.cfg.MaxQueue,
		MemoryEnforcedBy:      "none",
	}
	p.Pool = e.PoolInfo()
	pr, err := e.probe(ctx)
	if err != nil {
		p.Problems = append(p.Problems, fmt.Sprintf("the %s sandbox could not start here: %v", p.Backend, err))
		return p
	}
	host := hostNamespaces()
	ns := func(name string) Layer {
		in, ok := pr.Namespaces[name]
		if !ok {
			return Layer{Detail: "not reported"}
		}
		if in != host[name] {
			return Layer{Active: true, Detail: in}
		}
		return Layer{Detail: "shared with the host"}
	}
	L := &p.Layers
	L.UserNamespace, L.MountNamespace, L.PIDNamespace = ns("user"), ns("mnt"), ns("pid")
	L.NetNamespace, L.IPCNamespace, L.UTSNamespace = ns("net"), ns("ipc"), ns("uts")
	L.CgroupNamespace = ns("cgroup")
	L.Seccomp = Layer{Active: pr.Status["Seccomp"] == "2", Detail: "Seccomp: " + pr.Status["Seccomp"]}
	L.NoNewPrivs = Layer{Active: pr.Status["NoNewPrivs"] == "1"}
	capsZero := true
	var capDetail []string
	for _, k := range []string{"CapEff", "CapPrm", "CapInh", "CapAmb", "CapBnd"} {
		v := pr.Status[k]
		capDetail = append(capDetail, k+"="+v)
		if strings.Trim(v, "0") != "" || v == "" {
			capsZero = false
		}
	}
	L.CapabilitiesDropped = Layer{Active: capsZero, Detail: strings.Join(capDetail, " ")}
	L.ReadOnlyRoot = Layer{Active: !pr.RootWritable}
	L.UnprivilegedUser = Layer{Active: pr.UID != 0, Detail: fmt.Sprintf("uid %d gid %d inside", pr.UID, pr.GID)}
	L.NoHostRoot = noHostRoot(pr.UIDMap)
	if f := strings.Fields(pr.UIDMap); p.Backend == string(sandbox.KindBwrap) && !L.NoHostRoot.Active && len(f) == 3 && f[1] == "0" {
		// bwrap nests a user namespace: its "0" is the namespace bwrap set
		// up as its own host uid (the shim's, a uid of the sandbox's own
		// for a root server), which cannot be seen from inside.
		L.NoHostRoot = Layer{Active: true, Detail: "nested user namespace (uid_map " + strings.Join(f, " ") + "); bwrap itself runs as an unprivileged host uid"}
	}
	if len(pr.Exposed) == 0 {
		L.ProcMasked = Layer{Active: true, Detail: "OCI masked and read-only paths, plus cmdline, kallsyms, modules, partitions, diskstats, boot_id, pressure"}
	} else {
		L.ProcMasked = Layer{Detail: "visible: " + strings.Join(pr.Exposed, ", ")}
	}
	L.InotifyDenied = Layer{Active: pr.Inotify == "denied", Detail: "inotify_init1: " + pr.Inotify}
	switch {
	case len(pr.UsrLocal) == 0:
		L.UsrLocalHidden = Layer{Active: true, Detail: "empty"}
	case slices.Equal(pr.UsrLocal, []string{"lib"}):
		L.UsrLocalHidden = Layer{Active: true, Detail: "only lib/python3.*"}
	default:
		// The interpreter itself lives there (its prefix is /usr/local).
		L.UsrLocalHidden = Layer{Detail: "shows " + strings.Join(pr.UsrLocal, ", ")}
	}
	switch {
	case pr.LandlockABI == 0:
		L.Landlock = Layer{Detail: "the kernel has no Landlock"}
	case p.Backend == string(sandbox.KindBwrap):
		L.Landlock = Layer{Detail: fmt.Sprintf("kernel ABI %d; not applied by the bwrap backend", pr.LandlockABI)}
	case pr.LandlockABI >= 6:
		L.Landlock = Layer{Active: true, Detail: fmt.Sprintf("ABI %d: writes only beneath /tmp, /work, /dev/shm; abstract sockets and signals scoped", pr.LandlockABI)}
	default:
		L.Landlock = Layer{Active: true, Detail: fmt.Sprintf("ABI %d: writes only beneath /tmp, /work, /dev/shm", pr.LandlockABI)}
	}
	var rl []string
	for _, k := range []string{"AS", "NOFILE", "NPROC", "FSIZE", "CORE", "CPU"} {
		if v, ok := pr.Rlimits[k]; ok && v[0] >= 0 {
			rl = append(rl, fmt.Sprintf("%s=%d", k, v[0]))
		}
	}
	L.Rlimits = Layer{Active: len(rl) > 0 && pr.Rlimits["CORE"][0] == 0, Detail: strings.Join(rl, " ")}
	if nb, ok := e.cfg.Backend.(interface {
		CgroupSupport() (mem, pids bool, mode, reason string)
	}); ok {
		mem, pids, mode, reason := nb.CgroupSupport()
		L.CgroupMemory = Layer{Active: mem, Detail: cgDetail(mem, mode, reason)}
		L.CgroupPids = Layer{Active: pids, Detail: cgDetail(pids, mode, reason)}
		if !mem && !pids && reason != "" {
			// One cause for both: said once, on the memory row.
			L.CgroupPids.Detail = "not available, for the reason the memory group is not (cgroup memory)"
		}
		if mem {
			p.Limits.MemoryEnforcedBy = "cgroup " + mode
		}
	}
	if cb, ok := e.cfg.Backend.(interface{ CPUSupport() bool }); ok {
		cpu := cb.CPUSupport()
		switch {
		case cpu && e.cfg.Limits.CPUMilli > 0:
			L.CgroupCPU = Layer{Active: true, Detail: fmt.Sprintf("%.2g CPU per run", float64(e.cfg.Limits.CPUMilli)/1000)}
			p.Limits.CPUs = float64(e.cfg.Limits.CPUMilli) / 1000
		case cpu:
			L.CgroupCPU = Layer{Detail: "no quota (--cpus 0)"}
		default:
			L.CgroupCPU = Layer{Detail: "no cgroup CPU controller here: runs share the CPU, bounded by RLIMIT_CPU and the timeout"}
		}
		switch {
		case !cpu:
			L.SessionIdle = Layer{Detail: "no CPU cgroup: a session's background work runs between runs, bounded by RLIMIT_CPU"}
		case p.Backend == string(sandbox.KindBwrap):
			L.SessionIdle = Layer{Detail: "bwrap sessions keep their run quota between runs"}
		default:
			L.SessionIdle = Layer{Active: true, Detail: "a session's processes get a thousandth of a CPU between runs"}
		}
	}
	if !L.CgroupMemory.Active && pr.Rlimits["AS"][0] > 0 {
		p.Limits.MemoryEnforcedBy = "RLIMIT_AS"
	}
	switch {
	case len(pr.Interfaces) == 1 && pr.Interfaces[0] == "lo" && L.NetNamespace.Active && e.cfg.Network:
		p.Network = "loopback only, in its own network namespace; the one way out is the server's proxy, to the hosts the network policy allows"
	case len(pr.Interfaces) == 1 && pr.Interfaces[0] == "lo" && L.NetNamespace.Active:
		p.Network = "none (loopback only, in its own network namespace)"
	case L.NetNamespace.Active:
		p.Network = "isolated namespace with interfaces " + strings.Join(pr.Interfaces, ", ")
	default:
		p.Network = "host network"
	}
	if p.Backend == string(sandbox.KindNone) {
		p.Problems = append(p.Problems, "--sandbox none: code runs directly on this machine with the server's privileges; nothing is isolated")
		return p
	}
	essential := map[string]Layer{
		"user namespace": L.UserNamespace, "mount namespace": L.MountNamespace, "pid namespace": L.PIDNamespace,
		"network namespace": L.NetNamespace, "ipc namespace": L.IPCNamespace, "uts namespace": L.UTSNamespace,
		"seccomp": L.Seccomp, "no_new_privs": L.NoNewPrivs, "capability drop": L.CapabilitiesDropped,
		"read-only root": L.ReadOnlyRoot, "unprivileged uid": L.UnprivilegedUser,
		"no host root in the uid map": L.NoHostRoot, "masked /proc": L.ProcMasked,
		"inotify refused": L.InotifyDenied,
	}
	ok := true
	for _, name := range slices.Sorted(maps.Keys(essential)) {
		if !essential[name].Active {
			ok = false
			p.Problems = append(p.Problems, name+" is not in force")
		}
	}
	if !L.CgroupMemory.Active {
		p.Problems = append(p.Problems, "no memory cgroup: "+L.CgroupMemory.Detail+"; memory is limited by RLIMIT_AS instead (address space, less precise)")
	}
	if !L.CgroupPids.Active {
		p.Problems = append(p.Problems, "no pids cgroup: the process count is limited by RLIMIT_NPROC instead")
	}
	if ok {
		p.Posture = "sandboxed"
	}
	return p
}

// noHostRoot reads a uid_map (inside, outside, count per line): no line
// may map anything to uid 0 of the namespace above.
func noHostRoot(uidMap string) Layer {
	var maps []string
	for _, line := range strings.Split(strings.TrimSpace(uidMap), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		maps = append(maps, strings.Join(f, " "))
		var in, out, n uint64
		if _, err := fmt.Sscan(f[0], &in); err != nil {
			return Layer{Detail: "unreadable uid_map"}
		}
		fmt.Sscan(f[1], &out)
		fmt.Sscan(f[2], &n)
		if out == 0 && n > 0 {
			return Layer{Detail: "uid_map maps uid 0 above: " + strings.Join(f, " ")}
		}
	}
	if len(maps) == 0 {
		return Layer{Detail: "no uid_map"}
	}
	return Layer{Active: true, Detail: "uid_map " + strings.Join(maps, ", ")}
}

func cgDetail(active bool, mode, reason string) string {
	if active {
		return "cgroup " + mode
	}
	if reason == "" {
		return "unavailable"
	}
	return reason
}
