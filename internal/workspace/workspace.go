// Package workspace does file operations for the server inside a session's
// workspace directory: upload (Write, or WriteFrom streaming), download
// (Read, or Open to stream), Stat and List.
//
// # Threat model
//
// The workspace is writable by hostile code running in the sandbox, and it
// keeps running while we work: it can create symlinks pointing anywhere
// (absolute, relative, into /proc), hard links, FIFOs and sockets, deep or
// wide trees and huge files, and it can swap any directory for a symlink
// between two of our system calls. The paths in tool arguments are hostile
// too. The server is often root. Nothing here may read or write anything
// outside the workspace directory.
//
// # How
//
// Every lookup starts at one directory file descriptor for the workspace
// root and goes through openat2(2) with RESOLVE_BENEATH (no absolute
// symlinks, no ".." above the root, checked by the kernel for every step
// including symlink targets, race-free), RESOLVE_NO_MAGICLINKS (no
// /proc/<pid>/root or /proc/self/fd/N style jumps) and RESOLVE_NO_XDEV (no
// stepping onto another mount, such as one the sandbox might have made).
// Nothing is ever done by path string from "/". Kernels without openat2
// (before Linux 5.6) are refused: there is no weaker fallback.
//
// The policy for symbolic links:
//   - Read, Open, Stat and the starting directory of List follow
//     symlinks whose whole resolution stays beneath the workspace root
//     ("latest -> run3/out.csv" works); any link that leaves it
//     (absolute, or ".." above the root) or goes through /proc magic
//     links is refused with ErrSymlink. Stat does not follow a final symlink: it reports it.
//   - Write and WriteFrom follow no symlink at all, anywhere in the
//     path. They walk the parent directories one name at a time, holding
//     a descriptor for each, so a directory swapped for a link after we
//     looked is not followed: we keep working in the directory we
//     already hold.
//   - List never follows a symlink it meets while walking; it reports the
//     link and its target text.
//
// Hard links: the sandbox can only hard-link files it can already see on
// the same mount, and the kernel's protected_hardlinks rule stops it from
// linking files it does not own, so a hard link in the workspace exposes
// nothing new. Read and Open read such a file like any other; Write and
// WriteFrom never write into an existing inode (they rename a new file
// over the name), so they can never modify the other names of a hard
// link.
//
// A directory we hold a descriptor for can be renamed away by the sandbox
// while we use it. rename(2) needs write access to both places and works
// only within one mount, so the directory can only end up somewhere the
// sandbox could write to anyway: that is no new exposure.
package workspace

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// Sentinel errors, wrapped by the errors the methods return, so callers
// can tell the agent what to do next. The underlying *os.SyscallError (and
// so the errno) is wrapped too where there is one: errors.Is(err,
// fs.ErrNotExist) and errors.Is(err, syscall.ENOSPC) keep working.
var (
	// ErrInvalidPath: the path argument itself is unacceptable (CleanPath).
	ErrInvalidPath = errors.New("invalid path")
	// ErrNotFound: the file or a parent directory does not exist.
	ErrNotFound = errors.New("no such file or directory")
	// ErrTooLarge: the file or content is over the byte limit. Read
	// still returns the file's FileInfo so the caller can offer another
	// way to fetch it.
	ErrTooLarge = errors.New("file too large")
	// ErrNotRegular: the path names a directory, FIFO, socket or device
	// where a regular file is needed.
	ErrNotRegular = errors.New("not a regular file")
	// ErrNotDir: a path element that must be a directory is something
	// else.
	ErrNotDir = errors.New("not a directory")
	// ErrSymlink: the path goes through a symbolic link that is not
	// allowed here (see the package comment for the policy).
	ErrSymlink = errors.New("symbolic link refused")
	// ErrFull: the workspace's file system is out of space or quota.
	ErrFull = errors.New("workspace is full")
)

// FileInfo describes one workspace entry.
type FileInfo struct {
	// Path is relative to the workspace root, in CleanPath form ("." for
	// the root itself).
	Path string `json:"path"`
	// Type is "file", "dir", "symlink" or "other" (FIFO, socket, device).
	Type string `json:"type"`
	// Size is in bytes for files, the target's length for symlinks, and 0
	// for directories and other types.
	Size    int64     `json:"size"`
	ModTime time.Time `json:"mod_time"`
	// Target is a symlink's target text, cut to MaxTargetLen bytes.
	Target string `json:"target,omitempty"`
}

// Dir is an open workspace directory. Its methods may be called from
// several goroutines at once; Close waits for calls in progress.
type Dir struct {
	mu sync.RWMutex
	fd int // O_PATH|O_DIRECTORY descriptor of the root; -1 once closed
}

// Resolution flags. resolveBeneath is for lookups that may follow symlinks
// that stay inside; resolveNoLinks additionally refuses every symlink.
const (
	resolveBeneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV
	resolveNoLinks = resolveBeneath | unix.RESOLVE_NO_SYMLINKS
)

// Open takes ownership of f, an O_PATH or O_RDONLY|O_DIRECTORY descriptor
// of the workspace root (for example opened on /proc/<pid>/root/work), and
// closes it in every case; the Dir keeps its own descriptor. It fails when
// f is not a directory or the kernel lacks openat2.
func Open(f *os.File) (*Dir, error) {
	defer f.Close()
	sc, err := f.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("workspace: open: %w", err)
	}
	fd := -1
	var oerr error
	if err := sc.Control(func(raw uintptr) {
		// Re-open "." through openat2 itself: it gives us a descriptor
		// we own and proves openat2 works before any request relies on it.
		fd, oerr = openat2(int(raw), ".", unix.O_PATH|unix.O_DIRECTORY, 0, resolveNoLinks)
	}); err != nil {
		return nil, fmt.Errorf("workspace: open: %w", err)
	}
	switch {
	case oerr == unix.ENOSYS:
		return nil, fmt.Errorf("workspace: open: this kernel has no openat2 (Linux 5.6 or later is needed to access workspaces safely): %w", os.NewSyscallError("openat2", oerr))
	case oerr == unix.ENOTDIR:
		return nil, fmt.Errorf("workspace: open %s: %w", f.Name(), ErrNotDir)
	case oerr != nil:
		return nil, fmt.Errorf("workspace: open %s: %w", f.Name(), os.NewSyscallError("openat2", oerr))
	}
	return &Dir{fd: fd}, nil
}

// Close releases the workspace descriptor. It waits for calls in progress;
// later calls fail with fs.ErrClosed.
func (d *Dir) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fd < 0 {
		return fs.ErrClosed
	}
	err := unix.Close(d.fd)
	d.fd = -1
	return os.NewSyscallError("close", err)
}

// closed is the error for calls after Close.
func closed(op string) error {
	return fmt.Errorf("workspace: %s: %w", op, fs.ErrClosed)
}

// openat2 wraps unix.Openat2, adding O_CLOEXEC and retrying EINTR and
// EAGAIN (RESOLVE_BENEATH returns EAGAIN when a concurrent rename might
// have let ".." escape; the kernel asks us to try again). It returns the
// bare errno so callers can classify it.
func openat2(dirfd int, name string, flags, mode uint64, resolve uint64) (int, error) {
	how := unix.OpenHow{Flags: flags | unix.O_CLOEXEC, Mode: mode, Resolve: resolve}
	for i := 0; ; i++ {
		fd, err := unix.Openat2(dirfd, name, &how)
		if (err == unix.EINTR || err == unix.EAGAIN) && i < 32 {
			continue
		}
		return fd, err
	}
}

// lookupError turns an error from resolving or using p into an error for
// the agent: the sentinel that says what happened, a hint on what to do,
// and err itself (an *os.SyscallError, so the errno stays visible to
// errors.Is).
func lookupError(op, p string, err error) error {
	var errno unix.Errno
	errors.As(err, &errno)
	var kind error
	var hint string
	switch errno {
	case unix.ENOENT:
		kind, hint = ErrNotFound, "check the path with the list tool"
	case unix.ENOTDIR:
		kind, hint = ErrNotDir, "an element of the path is a file, not a directory"
	case unix.EXDEV:
		kind, hint = ErrSymlink, "the path goes through a symbolic link that leads outside the workspace (or onto another mount); use the real path inside the workspace"
	case unix.ELOOP:
		kind, hint = ErrSymlink, "the path goes through a symbolic link that is not allowed here (too many levels, or a /proc link); use the real path inside the workspace"
	case unix.ENXIO:
		kind, hint = ErrNotRegular, "it is a socket or device; only regular files can be read"
	case unix.ENOSPC, unix.EDQUOT, unix.EFBIG:
		kind, hint = ErrFull, "delete files you no longer need or write less"
	case unix.EISDIR:
		kind, hint = ErrNotRegular, "it is a directory; choose another name"
	case unix.ENOSYS:
		return fmt.Errorf("workspace: %s %s: this kernel has no openat2 (Linux 5.6 or later is needed): %w", op, p, err)
	default:
		return fmt.Errorf("workspace: %s %s: %w", op, p, err)
	}
	return fmt.Errorf("workspace: %s %s: %w: %s (%w)", op, p, kind, hint, err)
}

// fileType names the type in a stat mode.
func fileType(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "file"
	case unix.S_IFDIR:
		return "dir"
	case unix.S_IFLNK:
		return "symlink"
	}
	return "other"
}

// describe says what a non-regular file is, for error messages.
func describe(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return "a directory"
	case unix.S_IFLNK:
		return "a symbolic link"
	case unix.S_IFIFO:
		return "a FIFO (named pipe)"
	case unix.S_IFSOCK:
		return "a socket"
	case unix.S_IFCHR, unix.S_IFBLK:
		return "a device"
	}
	return "a regular file"
}

func newFileInfo(p string, st *unix.Stat_t, target string) FileInfo {
	fi := FileInfo{
		Path:    p,
		Type:    fileType(st.Mode),
		ModTime: time.Unix(st.Mtim.Unix()),
		Target:  target,
	}
	if fi.Type == "file" || fi.Type == "symlink" {
		fi.Size = st.Size
	}
	return fi
}

// MaxTargetLen is how much of a symlink's target FileInfo.Target shows.
const MaxTargetLen = 256

// readlink reads a symlink's target (name relative to dirfd, or "" for an
// O_PATH descriptor of the link itself), cut to MaxTargetLen bytes with
// "..." appended when longer. Errors give "".
func readlink(dirfd int, name string) string {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(dirfd, name, buf)
	if err != nil || n < 0 {
		return ""
	}
	if n > MaxTargetLen {
		cut := MaxTargetLen
		for cut > 0 && !utf8.RuneStart(buf[cut]) {
			cut-- // do not split a character
		}
		return string(buf[:cut]) + "..."
	}
	return string(buf[:n])
}
