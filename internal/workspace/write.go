package workspace

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
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
	_, err = d.writeFile(c, func(f *os.File) (int64, error) {
		n, err := f.Write(content)
		if err != nil {
			return int64(n), d.writeError(c, sysError(err))
		}
		return int64(n), nil
	})
	return err
}

// WriteFrom is Write with the content streamed from r: it creates or
// replaces the regular file at path with what r gives until io.EOF, and
// returns the number of bytes written. Everything Write promises holds
// (no symlink followed, a new file renamed over the name, ownership,
// ErrFull), and the content is never held in memory, only a 64 KiB buffer
// at a time. Unlike Write, every whole 64 KiB chunk of zero bytes is left
// as a hole rather than written, so a sparse file copied in (a snapshot's)
// stays sparse and takes no room for its holes; it reads the same.
//
// WriteFrom reads at most maxBytes+1 bytes from r: when r has more than
// maxBytes, it gives ErrTooLarge and leaves nothing behind (the name keeps
// what it had). An error from r (other than io.EOF) is returned wrapped,
// as is, and likewise leaves nothing behind; errors.Is finds it. r is read
// with the server's own identity, not the workspace owner's.
func (d *Dir) WriteFrom(path string, r io.Reader, maxBytes int64) (int64, error) {
	c, err := CleanPath(path)
	if err != nil {
		return 0, fmt.Errorf("workspace: write %q: %w", path, err)
	}
	maxBytes = max(maxBytes, 0)
	return d.writeFile(c, func(f *os.File) (int64, error) {
		s := sparseFile{f: f}
		buf := make([]byte, sparseChunk)
		for empty := 0; ; {
			// One byte past the limit is enough to know it is too large.
			want := int64(len(buf))
			if left := maxBytes - s.n; left < want {
				want = left + 1
			}
			m, rerr := r.Read(buf[:want])
			if m > 0 {
				empty = 0
				if s.n+int64(m) > maxBytes {
					return s.n, fmt.Errorf("workspace: write %s: %w: the content is more than the limit of %d bytes", c, ErrTooLarge, maxBytes)
				}
				if err := s.write(buf[:m]); err != nil {
					return s.n, d.writeError(c, err)
				}
			} else if rerr == nil {
				if empty++; empty >= 100 {
					rerr = io.ErrNoProgress
				}
			}
			if rerr == io.EOF {
				return s.n, d.finish(c, &s)
			}
			if rerr != nil {
				return s.n, fmt.Errorf("workspace: write %s: reading the content: %w", c, rerr)
			}
		}
	})
}

// writeFile creates or replaces c (a CleanPath) with a new file that fill
// writes. The directories and the temporary file are made, and the file
// renamed over the name, with the workspace owner's identity (see
// asOwner); fill runs with the server's own, so whatever it reads from is
// read as the server would. fill returns the bytes written and an error
// already in the form Write returns; on any error the temporary file is
// removed.
func (d *Dir) writeFile(c string, fill func(*os.File) (int64, error)) (int64, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.fd < 0 {
		return 0, closed("write")
	}
	var rst unix.Stat_t
	if err := unix.Fstat(d.fd, &rst); err != nil {
		return 0, d.writeError(c, os.NewSyscallError("fstat", err))
	}
	own := owner{uid: int(rst.Uid), gid: int(rst.Gid)}
	as := func(f func() error) error { return f() }
	if os.Geteuid() == 0 && own.uid != 0 {
		// A root server creates as the workspace's owner: a sandbox's
		// filesystem may not map root at all (a warm-pool child's maps only
		// its own user), and then creating as root fails with EOVERFLOW.
		// It also drops root's override of file permissions for the work.
		as = func(f func() error) error { return asOwner(own, f) }
	}
	var t *tempFile
	if err := as(func() (err error) { t, err = d.create(c, own); return err }); err != nil {
		return 0, err
	}
	defer t.closeParent()
	n, err := fill(t.f)
	if cerr := t.f.Close(); err == nil && cerr != nil {
		err = d.writeError(c, sysError(cerr))
	}
	if err == nil {
		err = as(func() error { return os.NewSyscallError("renameat", unix.Renameat(t.parent, t.tmp, t.parent, t.name)) })
		if err != nil {
			err = d.writeError(c, err)
		}
	}
	if err != nil {
		// Best effort: unlinkat never follows links, and the name is in
		// the directory we hold, so at worst it removes something the
		// sandbox put there under our random name.
		unix.Unlinkat(t.parent, t.tmp, 0)
		return n, err
	}
	return n, nil
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

// tempFile is a new file being written: the directory it is in, its
// random name there, the name it is to get, and the open file.
type tempFile struct {
	d         *Dir
	parent    int
	tmp, name string
	f         *os.File
}

// closeParent closes the directory descriptor unless it is the root's.
func (t *tempFile) closeParent() {
	if t.parent != t.d.fd {
		unix.Close(t.parent)
	}
}

// create opens the parent directories of c (making missing ones), checks
// that the name may be replaced, and creates a new temporary file next to
// it, given to own. Errors are in the form Write returns.
func (d *Dir) create(c string, own owner) (*tempFile, error) {
	elems := strings.Split(c, "/")
	name := elems[len(elems)-1]
	parent, err := d.parents(c, elems[:len(elems)-1], own)
	if err != nil {
		return nil, err
	}
	t := &tempFile{d: d, parent: parent, name: name}

	// Refuse to replace what is not a regular file. This check can race
	// with the sandbox; it is there for clear errors, not for safety:
	// renameat never follows anything.
	var st unix.Stat_t
	switch err := unix.Fstatat(parent, name, &st, unix.AT_SYMLINK_NOFOLLOW); {
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK:
		err = fmt.Errorf("workspace: write %s: %w: it is a symbolic link and writes never follow or replace links; delete it first, or write to the path it points to", c, ErrSymlink)
		t.closeParent()
		return nil, err
	case err == nil && st.Mode&unix.S_IFMT != unix.S_IFREG:
		err = fmt.Errorf("workspace: write %s: %w: it is %s; choose another name", c, ErrNotRegular, describe(st.Mode))
		t.closeParent()
		return nil, err
	case err != nil && err != unix.ENOENT:
		t.closeParent()
		return nil, d.writeError(c, os.NewSyscallError("fstatat", err))
	}

	tmp, fd, err := createTemp(parent)
	if err != nil {
		t.closeParent()
		return nil, d.writeError(c, err)
	}
	if err := own.apply(fd, fileMode); err != nil {
		unix.Close(fd)
		unix.Unlinkat(parent, tmp, 0)
		t.closeParent()
		return nil, d.writeError(c, err)
	}
	t.tmp, t.f = tmp, os.NewFile(uintptr(fd), tmp)
	return t, nil
}

// sparseChunk is the unit of WriteFrom's reads and of the holes that
// sparseFile leaves.
const sparseChunk = 64 << 10

var zeroChunk [sparseChunk]byte

// sparseFile writes a new file sequentially, leaving a hole (seeking on)
// in place of every whole chunk of zero bytes.
type sparseFile struct {
	f    *os.File
	n    int64 // bytes written (holes included)
	hole bool  // the last chunk was left as a hole
}

// write appends p. Errors are *os.SyscallError.
func (s *sparseFile) write(p []byte) error {
	for len(p) > 0 {
		k := min(len(p), sparseChunk)
		if k == sparseChunk && bytes.Equal(p[:k], zeroChunk[:]) {
			if _, err := s.f.Seek(int64(k), io.SeekCurrent); err != nil {
				return sysError(err)
			}
			s.hole = true
		} else {
			if _, err := s.f.Write(p[:k]); err != nil {
				return sysError(err)
			}
			s.hole = false
		}
		s.n += int64(k)
		p = p[k:]
	}
	return nil
}

// finish gives the file its full length when it ends in a hole.
func (d *Dir) finish(c string, s *sparseFile) error {
	if !s.hole {
		return nil
	}
	if err := s.f.Truncate(s.n); err != nil {
		return d.writeError(c, sysError(err))
	}
	return nil
}

// sysError names the system call of an *os.PathError, not our temporary
// file.
func sysError(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return os.NewSyscallError(pe.Op, pe.Err)
	}
	return err
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
