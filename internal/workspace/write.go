package workspace

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// Modes of what Write creates, set explicitly so the server's umask does
// not matter.
const (
	dirMode  = 0o755
	fileMode = 0o644
)

// Write creates or replaces the regular file at path with content.
//
// Missing parent directories are created (mode 0755); the file gets mode
// 0644. Everything Write creates is given to the owner (uid and gid) of the
// workspace root, so the sandbox user owns uploaded files even when the
// server is root. (A server that is not root cannot give files away; it
// then leaves them as its own, which in the usual user-namespace setup is
// the sandbox user anyway.)
//
// Write follows no symbolic link: a symlink anywhere in the path, parents
// or final name, gives ErrSymlink; an existing parent that is not a
// directory gives ErrNotDir, and an existing final name that is a
// directory or special file gives ErrNotRegular. The content is written to
// a new temporary file in the target directory and renamed over the name,
// so readers see the old or the new file, never half of one, and no
// existing inode is ever written to (a hard link at the name is replaced,
// not written through). If the sandbox puts a symlink at the name after
// our check, the rename replaces the link itself, never its target.
// The data is not fsynced: workspaces do not outlive their sandbox.
//
// Content longer than maxBytes gives ErrTooLarge. Running out of space or
// quota gives ErrFull, which also wraps the errno.
func (d *Dir) Write(path string, content []byte, maxBytes int64) error {
	c, err := CleanPath(path)
	if err != nil {
		return fmt.Errorf("workspace: write %q: %w", path, err)
	}
	if int64(len(content)) > maxBytes {
		return fmt.Errorf("workspace: write %s: %w: the content is %d bytes; the limit is %d", c, ErrTooLarge, len(content), maxBytes)
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.fd < 0 {
		return closed("write")
	}
	var rst unix.Stat_t
	if err := unix.Fstat(d.fd, &rst); err != nil {
		return d.writeError(c, os.NewSyscallError("fstat", err))
	}
	own := owner{uid: int(rst.Uid), gid: int(rst.Gid)}
	if os.Geteuid() == 0 && own.uid != 0 {
		// A root server creates as the workspace's owner: a sandbox's
		// filesystem may not map root at all (a warm-pool child's maps only
		// its own user), and then creating as root fails with EOVERFLOW.
		// It also drops root's override of file permissions for the work.
		return asOwner(own, func() error { return d.write(c, content, own) })
	}
	return d.write(c, content, own)
}

// asOwner runs f with the filesystem identity of o. setfsuid and setfsgid
// (the raw system calls) change only the calling thread, which is locked
// for the duration and is not returned to the scheduler's pool if the old
// identity cannot be restored.
func asOwner(o owner, f func() error) error {
	runtime.LockOSThread()
	prevGID, _ := unix.SetfsgidRetGid(o.gid)
	prevUID, _ := unix.SetfsuidRetUid(o.uid)
	err := f()
	unix.SetfsuidRetUid(prevUID)
	unix.SetfsgidRetGid(prevGID)
	if uid, _ := unix.SetfsuidRetUid(-1); uid == prevUID {
		runtime.UnlockOSThread()
	}
	return err
}

func (d *Dir) write(c string, content []byte, own owner) error {
	elems := strings.Split(c, "/")
	name := elems[len(elems)-1]
	parent, err := d.parents(c, elems[:len(elems)-1], own)
	if err != nil {
		return err
	}
	if parent != d.fd {
		defer unix.Close(parent)
	}

	// Refuse to replace what is not a regular file. This check can race
	// with the sandbox; it is there for clear errors, not for safety:
	// renameat below never follows anything.
	var st unix.Stat_t
	switch err := unix.Fstatat(parent, name, &st, unix.AT_SYMLINK_NOFOLLOW); {
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK:
		return fmt.Errorf("workspace: write %s: %w: it is a symbolic link and writes never follow or replace links; delete it first, or write to the path it points to", c, ErrSymlink)
	case err == nil && st.Mode&unix.S_IFMT != unix.S_IFREG:
		return fmt.Errorf("workspace: write %s: %w: it is %s; choose another name", c, ErrNotRegular, describe(st.Mode))
	case err != nil && err != unix.ENOENT:
		return d.writeError(c, os.NewSyscallError("fstatat", err))
	}

	tmp, fd, err := createTemp(parent)
	if err != nil {
		return d.writeError(c, err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	err = own.apply(fd, fileMode)
	if err == nil {
		if _, werr := f.Write(content); werr != nil {
			// Name the system call, not our temporary file.
			err = werr
			if pe, ok := werr.(*os.PathError); ok {
				err = os.NewSyscallError(pe.Op, pe.Err)
			}
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.NewSyscallError("renameat", unix.Renameat(parent, tmp, parent, name))
	}
	if err != nil {
		// Best effort: unlinkat never follows links, and the name is in
		// the directory we hold, so at worst it removes something the
		// sandbox put there under our random name.
		unix.Unlinkat(parent, tmp, 0)
		return d.writeError(c, err)
	}
	return nil
}

// parents opens the directories of elems one at a time below the root,
// creating missing ones, refusing symlinks and non-directories. It returns
// a descriptor of the last one (the root itself when elems is empty; the
// caller must not close that).
func (d *Dir) parents(c string, elems []string, own owner) (int, error) {
	cur := d.fd
	for i, e := range elems {
		next, err := openOrMkdir(cur, e, own)
		if err != nil {
			sub := strings.Join(elems[:i+1], "/")
			// Say what is in the way (this second look can race, so it
			// only picks the message).
			var st unix.Stat_t
			serr := unix.Fstatat(cur, e, &st, unix.AT_SYMLINK_NOFOLLOW)
			switch typ := st.Mode & unix.S_IFMT; {
			case serr == nil && typ == unix.S_IFLNK:
				err = fmt.Errorf("workspace: write %s: %w: %s is a symbolic link and writes never follow links; write to the real path inside the workspace (%w)", c, ErrSymlink, sub, err)
			case serr == nil && typ != unix.S_IFDIR:
				err = fmt.Errorf("workspace: write %s: %w: %s exists and is %s (%w)", c, ErrNotDir, sub, describe(st.Mode), err)
			default:
				err = d.writeError(c, err)
			}
			if cur != d.fd {
				unix.Close(cur)
			}
			return -1, err
		}
		if cur != d.fd {
			unix.Close(cur)
		}
		cur = next
	}
	return cur, nil
}

// openOrMkdir opens the directory name in parent without following a
// symlink, creating it first when it does not exist. Errors are
// *os.SyscallError.
func openOrMkdir(parent int, name string, own owner) (int, error) {
	var err error
	// Loop because the sandbox can create or remove the name between our
	// calls; a few rounds are plenty for anything but deliberate racing,
	// which then just gets an error.
	for range 8 {
		var fd int
		fd, err = openat2(parent, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0, resolveNoLinks)
		if err == nil {
			return fd, nil
		}
		if err != unix.ENOENT {
			return -1, os.NewSyscallError("openat2", err)
		}
		if err = unix.Mkdirat(parent, name, dirMode); err == unix.EEXIST {
			continue
		} else if err != nil {
			return -1, os.NewSyscallError("mkdirat", err)
		}
		// Open what we made readable (fchown and fchmod do not work on
		// O_PATH descriptors). Should the sandbox have swapped it already,
		// O_NOFOLLOW|O_DIRECTORY and RESOLVE_NO_SYMLINKS mean we get
		// either an error or a directory beneath the root, which it may
		// as well own.
		fd, err = openat2(parent, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0, resolveNoLinks)
		if err == unix.ENOENT {
			continue
		}
		if err != nil {
			return -1, os.NewSyscallError("openat2", err)
		}
		if err := own.apply(fd, dirMode); err != nil {
			unix.Close(fd)
			return -1, err
		}
		return fd, nil
	}
	return -1, os.NewSyscallError("mkdirat", err)
}

// createTemp creates a new, empty file with a random name in dir, with
// O_EXCL so it is certainly new and ours.
func createTemp(dir int) (string, int, error) {
	var err error
	for range 8 {
		var b [8]byte
		rand.Read(b[:])
		name := ".pysandbox-upload-" + hex.EncodeToString(b[:]) + ".tmp"
		var fd int
		fd, err = openat2(dir, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW, 0o600, resolveNoLinks)
		if err != unix.EEXIST {
			return name, fd, os.NewSyscallError("openat2", err)
		}
	}
	return "", -1, os.NewSyscallError("openat2", err)
}

// owner is who should own what Write creates.
type owner struct{ uid, gid int }

// apply gives fd to the owner and sets its mode. Ownership first, so the
// mode is not changed by chown's clearing of set-id bits.
func (o owner) apply(fd int, mode uint32) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return os.NewSyscallError("fstat", err)
	}
	if int(st.Uid) != o.uid || int(st.Gid) != o.gid {
		// Only root can give files away. An unprivileged server keeps
		// them (see Write); root failing is a real error.
		if err := unix.Fchown(fd, o.uid, o.gid); err != nil && os.Geteuid() == 0 {
			return os.NewSyscallError("fchown", err)
		}
	}
	return os.NewSyscallError("fchmod", unix.Fchmod(fd, mode))
}

// writeError classifies an error from Write; it is lookupError, plus the
// file system's size for ErrFull.
func (d *Dir) writeError(c string, err error) error {
	var errno unix.Errno
	if errors.As(err, &errno) && (errno == unix.ENOSPC || errno == unix.EDQUOT || errno == unix.EFBIG) {
		return fmt.Errorf("workspace: write %s: %w%s; delete files you no longer need or write less (%w)", c, ErrFull, d.capacity(), err)
	}
	return lookupError("write", c, err)
}

// capacity describes the size of the workspace's file system, e.g.
// " (limit 64.0 MiB, 12.0 KiB free)", or "" when unknown. For the
// size-capped tmpfs workspaces live on, this is the cap.
func (d *Dir) capacity() string {
	var s unix.Statfs_t
	if err := unix.Fstatfs(d.fd, &s); err != nil || s.Blocks == 0 {
		return ""
	}
	bs := uint64(s.Bsize)
	return fmt.Sprintf(" (limit %s, %s free)", human(s.Blocks*bs), human(s.Bavail*bs))
}

// human formats a byte count with binary units.
func human(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d bytes", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
