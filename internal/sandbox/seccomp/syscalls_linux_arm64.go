package seccomp

import "golang.org/x/sys/unix"

// Numbers come from x/sys/unix so they cannot drift from the kernel's
// include/uapi/asm-generic/unistd.h.
var native = archInfo{
	audit: unix.AUDIT_ARCH_AARCH64,

	clone:       unix.SYS_CLONE,
	clone3:      unix.SYS_CLONE3,
	ioctl:       unix.SYS_IOCTL,
	fcntl:       unix.SYS_FCNTL,
	personality: unix.SYS_PERSONALITY,
	socket:      unix.SYS_SOCKET,

	denied: map[string]uint32{
		// Looking into or controlling other processes.
		"ptrace":            unix.SYS_PTRACE,
		"process_vm_readv":  unix.SYS_PROCESS_VM_READV,
		"process_vm_writev": unix.SYS_PROCESS_VM_WRITEV,
		"process_madvise":   unix.SYS_PROCESS_MADVISE,
		"kcmp":              unix.SYS_KCMP,
		"pidfd_getfd":       unix.SYS_PIDFD_GETFD,

		// Mounts and the root directory.
		"mount":          unix.SYS_MOUNT,
		"umount2":        unix.SYS_UMOUNT2,
		"pivot_root":     unix.SYS_PIVOT_ROOT,
		"chroot":         unix.SYS_CHROOT,
		"move_mount":     unix.SYS_MOVE_MOUNT,
		"open_tree":      unix.SYS_OPEN_TREE,
		"open_tree_attr": unix.SYS_OPEN_TREE_ATTR,
		"fsopen":         unix.SYS_FSOPEN,
		"fsconfig":       unix.SYS_FSCONFIG,
		"fsmount":        unix.SYS_FSMOUNT,
		"fspick":         unix.SYS_FSPICK,
		"mount_setattr":  unix.SYS_MOUNT_SETATTR,

		// Namespaces (clone is filtered by flags instead).
		"unshare": unix.SYS_UNSHARE,
		"setns":   unix.SYS_SETNS,

		// Keyrings are not namespaced: they are shared with the host.
		"keyctl":      unix.SYS_KEYCTL,
		"add_key":     unix.SYS_ADD_KEY,
		"request_key": unix.SYS_REQUEST_KEY,

		// Large kernel attack surface that Python code does not need.
		"bpf":               unix.SYS_BPF,
		"perf_event_open":   unix.SYS_PERF_EVENT_OPEN,
		"userfaultfd":       unix.SYS_USERFAULTFD,
		"io_uring_setup":    unix.SYS_IO_URING_SETUP,
		"io_uring_enter":    unix.SYS_IO_URING_ENTER,
		"io_uring_register": unix.SYS_IO_URING_REGISTER,
		"fanotify_init":     unix.SYS_FANOTIFY_INIT,
		"lookup_dcookie":    unix.SYS_LOOKUP_DCOOKIE,

		// Watching the shared read-only trees (/usr, the interpreter, the
		// dependency cache) would show, as it happens, which files the
		// runs of other tenants open: a channel between sandboxes.
		// Watchdog-style libraries fall back to polling, or fail.
		"inotify_init1": unix.SYS_INOTIFY_INIT1,
		// Page-cache residency of shared files: which ones other runs read.
		"cachestat": unix.SYS_CACHESTAT,

		// Kernel and machine administration.
		"kexec_load":      unix.SYS_KEXEC_LOAD,
		"kexec_file_load": unix.SYS_KEXEC_FILE_LOAD,
		"init_module":     unix.SYS_INIT_MODULE,
		"finit_module":    unix.SYS_FINIT_MODULE,
		"delete_module":   unix.SYS_DELETE_MODULE,
		"reboot":          unix.SYS_REBOOT,
		"swapon":          unix.SYS_SWAPON,
		"swapoff":         unix.SYS_SWAPOFF,
		"acct":            unix.SYS_ACCT,
		"quotactl":        unix.SYS_QUOTACTL,
		"quotactl_fd":     unix.SYS_QUOTACTL_FD,
		"syslog":          unix.SYS_SYSLOG,
		"vhangup":         unix.SYS_VHANGUP,
		"sethostname":     unix.SYS_SETHOSTNAME,
		"setdomainname":   unix.SYS_SETDOMAINNAME,
		"nfsservctl":      unix.SYS_NFSSERVCTL,

		// The clock is shared with the host.
		"settimeofday":  unix.SYS_SETTIMEOFDAY,
		"clock_settime": unix.SYS_CLOCK_SETTIME,
		"clock_adjtime": unix.SYS_CLOCK_ADJTIME,
		"adjtimex":      unix.SYS_ADJTIMEX,

		// File handles bypass path-based checks (the "shocker" escape).
		"open_by_handle_at": unix.SYS_OPEN_BY_HANDLE_AT,
		"name_to_handle_at": unix.SYS_NAME_TO_HANDLE_AT,

		// NUMA memory policy: can degrade other tenants; CAP_SYS_NICE in Docker.
		"get_mempolicy":           unix.SYS_GET_MEMPOLICY,
		"set_mempolicy":           unix.SYS_SET_MEMPOLICY,
		"set_mempolicy_home_node": unix.SYS_SET_MEMPOLICY_HOME_NODE,
		"mbind":                   unix.SYS_MBIND,
		"move_pages":              unix.SYS_MOVE_PAGES,
		"migrate_pages":           unix.SYS_MIGRATE_PAGES,

		// Changing the process's own LSM attributes.
		"lsm_get_self_attr": unix.SYS_LSM_GET_SELF_ATTR,
		"lsm_set_self_attr": unix.SYS_LSM_SET_SELF_ATTR,
		"lsm_list_modules":  unix.SYS_LSM_LIST_MODULES,
	},
}
