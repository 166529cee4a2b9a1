package sandbox

// What /proc may not show or change inside a sandbox. It follows the OCI
// runtime spec's defaults (runc's and Docker's maskedPaths and
// readonlyPaths) and adds what tells about the host that they leave:
// the kernel command line, kernel symbol names, loaded modules, disks and
// their statistics, the boot id, and pressure stall information.
//
// Every sandbox applies it to the /proc it mounts: the native init in Go
// (maskProc), each warm-pool child in Python (the zygote receives these
// lists), the bwrap backend with bwrap's own options.
var (
	// procMaskedFiles read as empty: /dev/null is bound over them.
	procMaskedFiles = []string{
		"/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
		"/proc/timer_stats", "/proc/sched_debug", "/proc/interrupts",
		"/proc/cmdline", "/proc/kallsyms", "/proc/modules", "/proc/diskstats",
		"/proc/config.gz", "/proc/sysrq-trigger", "/proc/partitions",
		// The host's boot id would let tenants recognise the same machine.
		"/proc/sys/kernel/random/boot_id",
	}
	// procMaskedDirs are covered by an empty read-only tmpfs.
	// /proc/pressure shows the whole machine's load as it happens.
	procMaskedDirs = []string{"/proc/acpi", "/proc/asound", "/proc/scsi", "/proc/driver", "/proc/pressure"}
	// procReadOnly stay visible, read-only.
	procReadOnly = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys"}
)

// ProcMasks lists what a sandbox masks in its /proc, for a warm-pool
// zygote whose children mount and mask a /proc of their own.
type ProcMasks struct {
	Files    []string `json:"files"`
	Dirs     []string `json:"dirs"`
	ReadOnly []string `json:"readonly"`
}

// DefaultProcMasks returns the masks every sandbox applies.
func DefaultProcMasks() ProcMasks {
	return ProcMasks{Files: procMaskedFiles, Dirs: procMaskedDirs, ReadOnly: procReadOnly}
}
