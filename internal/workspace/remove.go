package workspace

import (
	"fmt"
	"os"
	"path"

	"golang.org/x/sys/unix"
)

// Remove deletes the regular file at path, if there is one. It follows no
// symbolic link on the way (a link in the path is an error) and removes
// only a regular file or a link itself, never a directory; a path that
// does not exist is not an error. The server uses it for files of its own
// in a workspace (the kept output of a session's runs), which the
// sandbox can also change: nothing it plants there is followed.
func (d *Dir) Remove(p string) error {
	c, err := CleanPath(p)
	if err != nil {
		return fmt.Errorf("workspace: remove %q: %w", p, err)
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.fd < 0 {
		return closed("remove")
	}
	dir, name := path.Split(c)
	parent := d.fd
	if dir != "" {
		fd, err := openat2(d.fd, path.Clean(dir), unix.O_PATH|unix.O_DIRECTORY, 0, resolveNoLinks)
		switch {
		case err == unix.ENOENT:
			return nil
		case err != nil:
			return lookupError("remove", c, os.NewSyscallError("openat2", err))
		}
		defer unix.Close(fd)
		parent = fd
	}
	var st unix.Stat_t
	switch err := unix.Fstatat(parent, name, &st, unix.AT_SYMLINK_NOFOLLOW); {
	case err == unix.ENOENT:
		return nil
	case err != nil:
		return lookupError("remove", c, os.NewSyscallError("fstatat", err))
	case st.Mode&unix.S_IFMT == unix.S_IFDIR:
		return fmt.Errorf("workspace: remove %s: %w: it is a directory", c, ErrNotRegular)
	}
	// unlinkat never follows the last name: a link is removed itself.
	if err := unix.Unlinkat(parent, name, 0); err != nil && err != unix.ENOENT {
		return lookupError("remove", c, os.NewSyscallError("unlinkat", err))
	}
	return nil
}
