package sandbox

// initArg0 is argv[0] of a re-executed sandbox init. The binary notices it
// in InitMain before doing anything else.
const initArg0 = "pysandbox-sandbox-init"

// Inside the sandbox the worker runs as this uid and gid. Neither is 0, so
// the kernel gives the worker no capabilities on execve.
const (
	sandboxUID = 1000
	sandboxGID = 1000
)

// ChildIDBase and ChildIDCount describe the extra ids a root server maps
// into a zygote's sandbox: each warm-pool child runs as one of them, so
// concurrent runs are different users to the host kernel.
const (
	ChildIDBase  = 2000
	ChildIDCount = 65536
)

// File descriptors of the init process, in the order of exec.Cmd.ExtraFiles.
const (
	fdControl   = 3 // the worker's control socket; stays open across exec
	fdSetup     = 4 // config in, error out; close-on-exec so EOF means "exec'd"
	fdFirstBind = 5
)

// initConfig is what the server tells the init over the setup socket. It is
// written by the trusted parent, before any untrusted code runs.
type initConfig struct {
	Binds    []bindMount `json:"binds"`
	Symlinks [][2]string `json:"symlinks"` // [target, linkpath] inside the new root
	Files    []File      `json:"files"`
	Etc      []File      `json:"etc"` // generated /etc files
	TmpBytes int64       `json:"tmp_bytes"`
	Rlimits  []rlimit    `json:"rlimits"`
	Argv     []string    `json:"argv"`
	Env      []string    `json:"env"`
	Cwd      string      `json:"cwd"`
	Hostname string      `json:"hostname"`
	// NewCgroupNS asks the init to unshare a cgroup namespace once the
	// parent has moved it into its cgroups, so the worker sees "/" only.
	NewCgroupNS bool `json:"new_cgroupns"`
	// KeepSetID keeps CAP_SETUID and CAP_SETGID, in the sandbox's own user
	// namespace only, for a root server's zygote: it gives each child its
	// own uid from the extra mapped range before the child leaves for a
	// user namespace of its own (where those capabilities are gone). No
	// host uid that namespace maps is privileged (see Native.Start).
	KeepSetID bool `json:"keep_setid,omitempty"`
	// MaskProc hides what /proc tells about the host (see procmask.go).
	// Off for a zygote only: its children mount a /proc of their own and
	// mask it themselves, and the kernel refuses a new /proc where the
	// one it would cover has locked mounts hiding parts of it.
	MaskProc bool `json:"mask_proc,omitempty"`
	// Landlock restricts writes to these paths (see landlock.go); empty
	// for a zygote, whose children restrict themselves.
	Landlock []string `json:"landlock,omitempty"`
	// Proxy: listen on 127.0.0.1:ProxyPort once lo is up and send the
	// socket to the server over the setup socket (see listener_linux.go).
	Proxy bool `json:"proxy,omitempty"`
	// Zygote relaxes the seccomp filter for a warm-pool zygote (see
	// seccomp.Zygote); its children install the strict one themselves.
	Zygote bool `json:"zygote,omitempty"`
	// Seccomp installs the syscall filter; false only in tests of the
	// layers below it.
	Seccomp bool `json:"seccomp"`
}

// bindMount makes a host file or directory visible read-only inside. The
// init opens every source before it mounts anything, so no mount of ours
// can shadow a source path.
type bindMount struct {
	Source string `json:"source"`
	Target string `json:"target"`
	Dir    bool   `json:"dir"`
	// Writable keeps the bind writable (device nodes such as /dev/null,
	// an installer's output directory).
	Writable bool `json:"writable,omitempty"`
	// Device keeps device nodes usable (nodev is not set).
	Device bool `json:"device,omitempty"`
	// FD, when not 0, is a detached mount of Source (open_tree) that the
	// server made and passed in: a root server's sandbox runs as an
	// unprivileged host uid that may not be able to open Source itself
	// (a pyenv prefix in root's home, the dependency cache).
	FD int `json:"fd,omitempty"`
	// Empty mounts an empty tmpfs at Target instead of a host path, to
	// hide what lies below it in an earlier bind (/usr/local under /usr).
	// It is made read-only once everything inside it is mounted.
	Empty bool `json:"empty,omitempty"`
}

type rlimit struct {
	Resource int    `json:"resource"`
	Cur      uint64 `json:"cur"`
	Max      uint64 `json:"max"`
}
