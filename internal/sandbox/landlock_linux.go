package sandbox

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Write access rights Landlock handles from ABI 1 (REFER and TRUNCATE
// join them from ABI 2 and 3).
const (
	llWriteV1 = unix.LANDLOCK_ACCESS_FS_WRITE_FILE | unix.LANDLOCK_ACCESS_FS_REMOVE_DIR | unix.LANDLOCK_ACCESS_FS_REMOVE_FILE |
		unix.LANDLOCK_ACCESS_FS_MAKE_CHAR | unix.LANDLOCK_ACCESS_FS_MAKE_DIR | unix.LANDLOCK_ACCESS_FS_MAKE_REG |
		unix.LANDLOCK_ACCESS_FS_MAKE_SOCK | unix.LANDLOCK_ACCESS_FS_MAKE_FIFO | unix.LANDLOCK_ACCESS_FS_MAKE_BLOCK |
		unix.LANDLOCK_ACCESS_FS_MAKE_SYM
)

// landlockABI is the kernel's Landlock ABI version, 0 without Landlock.
func landlockABI() int {
	v, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if errno != 0 {
		return 0
	}
	return int(v)
}

// restrictWrites puts the calling thread (which then execs the worker) in
// a Landlock domain where only paths beneath writable may be written, and
// scopes abstract Unix sockets and signals. Without Landlock it does
// nothing. It needs no_new_privs or CAP_SYS_ADMIN (the init has the
// latter in its namespace).
//
// x/sys/unix rather than go-landlock: that library applies a domain to
// every thread of the process through psx, which a single-threaded exec
// path does not need; the calls below are the whole of it.
func restrictWrites(writable []string) error {
	abi := landlockABI()
	if abi == 0 {
		return nil
	}
	handled := uint64(llWriteV1)
	file := uint64(unix.LANDLOCK_ACCESS_FS_WRITE_FILE)
	if abi >= 2 {
		handled |= unix.LANDLOCK_ACCESS_FS_REFER
	}
	if abi >= 3 {
		handled |= unix.LANDLOCK_ACCESS_FS_TRUNCATE
		file |= unix.LANDLOCK_ACCESS_FS_TRUNCATE
	}
	attr := unix.LandlockRulesetAttr{Handled_access_fs: handled}
	size := unsafe.Offsetof(attr.Handled_access_net) + unsafe.Sizeof(attr.Handled_access_net)
	if abi >= 6 {
		attr.Scoped = unix.LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | unix.LANDLOCK_SCOPE_SIGNAL
		size = unsafe.Offsetof(attr.Scoped) + unsafe.Sizeof(attr.Scoped)
	}
	rfd, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&attr)), size, 0)
	if errno != 0 {
		return fmt.Errorf("sandbox init: %w", os.NewSyscallError("landlock_create_ruleset", errno))
	}
	defer unix.Close(int(rfd))
	for _, p := range writable {
		fd, err := unix.Open(p, unix.O_PATH|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return fmt.Errorf("sandbox init: landlock rule for %s: %w", p, os.NewSyscallError("open", err))
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return fmt.Errorf("sandbox init: landlock rule for %s: %w", p, os.NewSyscallError("fstat", err))
		}
		rule := unix.LandlockPathBeneathAttr{Allowed_access: handled, Parent_fd: int32(fd)}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			rule.Allowed_access = file
		}
		_, _, errno := unix.Syscall6(unix.SYS_LANDLOCK_ADD_RULE, rfd, unix.LANDLOCK_RULE_PATH_BENEATH, uintptr(unsafe.Pointer(&rule)), 0, 0, 0)
		unix.Close(fd)
		if errno != 0 {
			return fmt.Errorf("sandbox init: landlock rule for %s: %w", p, os.NewSyscallError("landlock_add_rule", errno))
		}
	}
	if _, _, errno := unix.Syscall(unix.SYS_LANDLOCK_RESTRICT_SELF, rfd, 0, 0); errno != 0 {
		return fmt.Errorf("sandbox init: %w", os.NewSyscallError("landlock_restrict_self", errno))
	}
	return nil
}
