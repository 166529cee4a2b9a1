// Package sandbox starts a process (the Python worker) inside an isolated
// environment and tears it down again without leaving anything behind.
//
// There are three backends:
//   - native: the default. Our own re-executed init sets up user, mount, pid,
//     net, ipc, uts and cgroup namespaces, pivot_root into a fresh read-only
//     root, seccomp, no_new_privs, dropped capabilities, rlimits and cgroup
//     limits, the way nsjail does.
//   - bwrap: the same layout built by bubblewrap, with limits applied from
//     outside, for hosts that only allow user namespaces to bwrap.
//   - none: no isolation at all. It must be asked for explicitly, and every
//     result says it is unsandboxed.
//
// A backend never falls back to a weaker one: when a layer cannot be set up,
// Start fails and Posture says why.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Kind names a backend on the command line.
type Kind string

const (
	KindNative Kind = "native"
	KindBwrap  Kind = "bwrap"
	KindNone   Kind = "none"
)

// ParseKind checks a --sandbox value.
func ParseKind(s string) (Kind, error) {
	switch k := Kind(s); k {
	case KindNative, KindBwrap, KindNone:
		return k, nil
	}
	return "", fmt.Errorf("sandbox: unknown backend %q (want native, bwrap or none)", s)
}

// Limits are the resource limits of one sandbox.
type Limits struct {
	MemoryBytes int64 // cgroup memory+swap; RLIMIT_AS when no memory cgroup can be used
	MaxProcs    int64 // cgroup pids.max and RLIMIT_NPROC (tasks, threads included)
	TmpBytes    int64 // size of the writable tmpfs shared by /tmp, /work and /dev/shm
	MaxOpenFile uint64
	CPUSeconds  uint64 // RLIMIT_CPU, a backstop behind the wall-clock timeout
	// CPUMilli is the sandbox's CPU quota in thousandths of a CPU (cgroup
	// cpu.cfs_quota_us / cpu.max), so no run can take more than its share
	// of the machine however many processes it starts; 0: none.
	CPUMilli int64
}

// File is a read-only file placed inside the sandbox (the worker program).
type File struct {
	Path    string // absolute path inside the sandbox, under /.pysandbox
	Content []byte
}

// Spec describes what to start.
type Spec struct {
	// Python is the interpreter's absolute path on the host. Its prefix is
	// made visible read-only at the same path inside.
	Python string
	// Prefix is the interpreter's installation prefix (sys.base_prefix).
	Prefix string
	// Args are the interpreter's arguments (argv[1:]).
	Args []string
	// Env is the complete environment; nothing of the server's is added.
	Env   []string
	Files []File
	// Limits apply to the whole sandbox.
	Limits Limits
	// Binds are extra host paths made visible inside (a dependency
	// environment, read-only; an installer's output directory, writable).
	Binds []Bind
	// Proxy gives the sandbox a way out through the server's network
	// proxy: it listens on 127.0.0.1:ProxyPort in its own network
	// namespace and hands the socket over (see Proxied). The sandbox's
	// processes get no other network.
	Proxy bool
	// Imports are the top-level modules the code imports, as a hint for the
	// warm pool's choice of zygote; backends may ignore it.
	Imports []string
	// Zygote starts a warm-pool zygote: the seccomp filter lets it create
	// namespaces and mounts for its children (internal/pool).
	Zygote bool
	// Stdout and Stderr receive the sandbox's output as it is written.
	Stdout, Stderr io.Writer
}

// Bind makes a host path visible inside the sandbox.
type Bind struct {
	Source   string // absolute host path
	Target   string // absolute path inside
	Writable bool
}

// validBind checks a bind: both paths absolute and clean, and the target
// not on top of what the sandbox itself needs.
func validBind(b Bind) error {
	for _, p := range []string{b.Source, b.Target} {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" {
			return fmt.Errorf("sandbox: bind path %q is not a clean absolute path", p)
		}
	}
	for _, reserved := range []string{"/proc", "/dev", "/tmp", "/work", "/etc", "/usr", "/.pysandbox"} {
		if b.Target == reserved || strings.HasPrefix(b.Target, reserved+"/") && reserved != "/.pysandbox" {
			return fmt.Errorf("sandbox: bind target %q would cover %s", b.Target, reserved)
		}
	}
	return nil
}

// Sandbox is a started sandbox.
type Sandbox interface {
	// Control is the Go end of the worker's control socket (fd 3 inside).
	Control() net.Conn
	// Wait blocks until every process of the sandbox has exited and its
	// output has been copied out, then reports how it ended.
	Wait() Exit
	// Kill kills every process of the sandbox. It is safe to call at any time
	// and more than once.
	Kill()
	// Close kills what is left and releases everything held on the host
	// (cgroups, file descriptors). It is idempotent.
	Close() error
}

// Ender is implemented by sandboxes that can tell that every process has
// ended, and give the resource figures, before they know the exit status.
// A caller that already has its result from the worker needs no more.
type Ender interface {
	// WaitEnded blocks until every process of the sandbox is gone and its
	// output copied, and returns Exit without Code and Signal.
	WaitEnded() Exit
}

// Finisher is implemented by sandboxes whose run can be over before their
// processes are gone. A one-shot worker lets go of its output before it
// replies; once it has replied, OutputDone closes when every byte of the
// output has been copied (at once, unless a process the run started still
// holds the streams). The caller may then answer with Figures (the cgroup's
// figures so far), Stop it, and tear it down off its path: Close still
// waits for every process to be gone.
type Finisher interface {
	OutputDone() <-chan struct{}
	Figures() Exit
	// Stop SIGKILLs pid 1 of the sandbox's namespace, which takes every
	// process in it, and returns at once: a run that has answered gets
	// no more time, since it no longer counts against any limit.
	Stop()
}

// Proxied is implemented by sandboxes that can be started with
// Spec.Proxy.
type Proxied interface {
	// ProxyListener is the socket listening on 127.0.0.1:ProxyPort inside
	// the sandbox; nil when it was started without Spec.Proxy. The caller
	// serves it (internal/egress) or closes it; Close closes it too.
	ProxyListener() net.Listener
}

// Sessioner is implemented by sandboxes that can host a session: the
// server can reach their /work, and can interrupt a run without killing
// the worker.
type Sessioner interface {
	// OpenWorkspace opens the sandbox's /work for the server
	// (O_RDONLY|O_DIRECTORY). The descriptor keeps the workspace reachable
	// only for as long as it is open; the caller closes it.
	OpenWorkspace() (*os.File, error)
	// Interrupt sends SIGINT to the worker: Python raises
	// KeyboardInterrupt in the running code, and the worker lives on.
	Interrupt() error
	// Idle holds every process of the sandbox to a thousandth of a CPU
	// (true), so a session burns next to no CPU between runs, or gives it
	// back its quota (false). ErrNoCPUControl when the sandbox has no CPU
	// cgroup.
	Idle(idle bool) error
}

// ErrNoCPUControl means a sandbox has no CPU cgroup: an unprivileged
// server without delegation, or no CPU controller.
var ErrNoCPUControl = errors.New("sandbox: no CPU cgroup")

// Exit says how a sandbox ended.
type Exit struct {
	Code            int            // exit code, or -1 when killed by a signal
	Signal          syscall.Signal // the signal that killed the worker, or 0
	OOMKilled       bool           // the kernel killed something for exceeding the memory limit
	PidsLimit       bool           // the pids limit refused a fork at least once
	PeakMemoryBytes int64
	CPUTime         time.Duration
}

// Backend starts sandboxes of one kind.
type Backend interface {
	Kind() Kind
	Start(ctx context.Context, spec *Spec) (Sandbox, error)
}

// ErrUnavailable is wrapped by errors that mean the backend cannot work on
// this machine at all (as opposed to one start failing).
var ErrUnavailable = errors.New("sandbox backend unavailable")

// PoolInfo describes a warm pool (internal/pool), a backend that serves
// runs from sandboxes it prepared ahead of demand.
type PoolInfo struct {
	Size      int               `json:"size"`
	Preloaded []string          `json:"preloaded"`
	Failed    map[string]string `json:"preload_failed,omitempty"`
	// Learned are the preloaded modules the pool added on its own, having
	// seen recent runs import them.
	Learned []string `json:"learned,omitempty"`
}
