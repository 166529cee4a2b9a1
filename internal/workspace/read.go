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
	c, err := CleanPath(path)
	if err != nil {
		return nil, FileInfo{}, fmt.Errorf("workspace: read %q: %w", path, err)
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.fd < 0 {
		return nil, FileInfo{}, closed("read")
	}
	fd, err := openat2(d.fd, c, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0, resolveBeneath)
	if err != nil {
		return nil, FileInfo{}, lookupError("read", c, os.NewSyscallError("openat2", err))
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, FileInfo{}, lookupError("read", c, os.NewSyscallError("fstat", err))
	}
	info := newFileInfo(c, &st, "")
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		hint := "only regular files can be read"
		if info.Type == "dir" {
			hint = "use the list tool to see what it contains"
		}
		return nil, info, fmt.Errorf("workspace: read %s: %w: it is %s; %s", c, ErrNotRegular, describe(st.Mode), hint)
	}
	if st.Size > maxBytes {
		return nil, info, fmt.Errorf("workspace: read %s: %w: it is %d bytes; the limit is %d", c, ErrTooLarge, st.Size, maxBytes)
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
	buf := make([]byte, 0, min(st.Size+1, limit))
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
