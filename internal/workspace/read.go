package workspace

import (
	"fmt"
	"math"
	"os"

	"golang.org/x/sys/unix"
)

// Read returns the content of the regular file at path, following only
// symlinks that stay inside the workspace (see the package comment).
//
// A file larger than maxBytes is not read: Read returns its FileInfo and
// ErrTooLarge, so the caller can offer another way to get it. The file may
// change while it is read: Read never returns more than maxBytes, gives
// ErrTooLarge when the file grew past maxBytes meanwhile, and reports in
// FileInfo.Size the number of bytes it actually read.
//
// Directories, FIFOs, sockets and devices give ErrNotRegular. The file is
// opened with O_NONBLOCK, so neither a FIFO nor a lease the sandbox holds
// on the file can make the open wait, and its type is checked on the open
// descriptor before anything is read from it. (The sandbox cannot create
// device nodes, so opening a special file has no side effects beyond
// that.)
func (d *Dir) Read(path string, maxBytes int64) ([]byte, FileInfo, error) {
	fd, c, info, err := d.openPath(path)
	if err != nil {
		return nil, info, err
	}
	defer unix.Close(fd)
	if info.Size > maxBytes {
		return nil, info, fmt.Errorf("workspace: read %s: %w: it is %d bytes; the limit is %d", c, ErrTooLarge, info.Size, maxBytes)
	}
	// Read at most maxBytes+1 bytes: the extra byte tells us the file grew
	// past the limit after fstat. The buffer starts at the size fstat saw
	// (already known to be within the limit) and grows only as the file
	// does, so a lying or changing size cannot make us allocate more than
	// the limit.
	limit := maxBytes
	if limit < math.MaxInt64 {
		limit++
	}
	buf := make([]byte, 0, min(info.Size+1, limit))
	for int64(len(buf)) < limit {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		end := int64(cap(buf))
		if end > limit {
			end = limit
		}
		n, err := unix.Read(fd, buf[len(buf):end])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, info, lookupError("read", c, os.NewSyscallError("read", err))
		}
		if n == 0 {
			break
		}
		buf = buf[:len(buf)+n]
	}
	info.Size = int64(len(buf))
	if info.Size > maxBytes {
		return nil, info, fmt.Errorf("workspace: read %s: %w: it grew past the limit of %d bytes while being read", c, ErrTooLarge, maxBytes)
	}
	return buf, info, nil
}

// Open opens the regular file at path for reading, with the same rules as
// Read: only symlinks that stay inside the workspace are followed, the file
// is opened with O_NONBLOCK (a FIFO or a lease cannot make the open wait)
// and its type is checked on the open descriptor, so directories, FIFOs,
// sockets and devices give ErrNotRegular before anything is read. The
// FileInfo is from that descriptor (fstat after the open).
//
// Open is for reading files too large to hold in memory: the caller
// streams from the file and must bound what it reads itself, because the
// sandbox can make the file grow (or shrink) while it is read; the size
// in FileInfo is only what it was at the open. The caller closes the
// file. The file does not depend on d: it stays usable after d.Close.
func (d *Dir) Open(path string) (*os.File, FileInfo, error) {
	fd, c, info, err := d.openPath(path)
	if err != nil {
		return nil, info, err
	}
	// O_NONBLOCK has done its work (the open did not wait); reads of a
	// regular file ignore it, and without it os.NewFile does not try to
	// register the file with the poller.
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, info, lookupError("read", c, os.NewSyscallError("fcntl", err))
	}
	return os.NewFile(uintptr(fd), c), info, nil
}

// openPath cleans path and opens it as openRegular does; the descriptor
// is the caller's to close, and outlives d.
func (d *Dir) openPath(path string) (int, string, FileInfo, error) {
	c, err := CleanPath(path)
	if err != nil {
		return -1, "", FileInfo{}, fmt.Errorf("workspace: read %q: %w", path, err)
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.fd < 0 {
		return -1, c, FileInfo{}, closed("read")
	}
	fd, info, err := d.openRegular(c)
	return fd, c, info, err
}

// openRegular opens c (a CleanPath) for reading and checks on the open
// descriptor that it is a regular file. The caller holds d.mu and closes
// the descriptor. On ErrNotRegular the FileInfo describes what was found.
func (d *Dir) openRegular(c string) (int, FileInfo, error) {
	fd, err := openat2(d.fd, c, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0, resolveBeneath)
	if err != nil {
		return -1, FileInfo{}, lookupError("read", c, os.NewSyscallError("openat2", err))
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, FileInfo{}, lookupError("read", c, os.NewSyscallError("fstat", err))
	}
	info := newFileInfo(c, &st, "")
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		hint := "only regular files can be read"
		if info.Type == "dir" {
			hint = "use the list tool to see what it contains"
		}
		return -1, info, fmt.Errorf("workspace: read %s: %w: it is %s; %s", c, ErrNotRegular, describe(st.Mode), hint)
	}
	return fd, info, nil
}

// Stat describes path without following a final symlink: a link is
// reported as Type "symlink" with its Target. Symlinks in the parent
// directories are followed only while they stay inside the workspace.
// "" and "." describe the workspace root.
func (d *Dir) Stat(path string) (FileInfo, error) {
	c, err := cleanDir(path)
	if err != nil {
		return FileInfo{}, fmt.Errorf("workspace: stat %q: %w", path, err)
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.fd < 0 {
		return FileInfo{}, closed("stat")
	}
	return d.stat(c)
}

func (d *Dir) stat(c string) (FileInfo, error) {
	// O_PATH|O_NOFOLLOW gives a descriptor of a final symlink itself;
	// O_PATH opens nothing for reading, so even a FIFO is harmless.
	fd, err := openat2(d.fd, c, unix.O_PATH|unix.O_NOFOLLOW, 0, resolveBeneath)
	if err != nil {
		return FileInfo{}, lookupError("stat", c, os.NewSyscallError("openat2", err))
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return FileInfo{}, lookupError("stat", c, os.NewSyscallError("fstat", err))
	}
	target := ""
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		target = readlink(fd, "")
	}
	return newFileInfo(c, &st, target), nil
}
