package setup

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// MaxFileBytes bounds the config file setup reads. A larger one is
// refused, not cut: it is not a config file setup should rewrite. It is
// larger than a hand-written file needs because ~/.claude.json also holds
// Claude Code's per-project state, which grows to several MiB.
const MaxFileBytes = 16 << 20

// ErrUnsafe: the path is not a regular file setup can rewrite in place
// (a symbolic link to nothing or to something else, a FIFO, a device, a
// file over MaxFileBytes, one that changed while setup ran); nothing was
// written.
var ErrUnsafe = errors.New("setup: the file cannot be rewritten safely")

// Result says what Write did.
type Result struct {
	Path, Backup string
	Changed      bool
}

// Write merges the entry into the file at path, leaving path+".bak" with
// the old content when it changes anything. A missing file is created
// (with its directories), mode 0600. An existing one is rewritten in
// place, once its backup is on disk: its inode, and so its owner, mode,
// hard links and extended attributes, stay as they were. A symbolic link
// is followed to the regular file it names, and stays a link. Anything
// else is refused and left alone, with the entry to paste by hand: a file
// that does not parse exactly, a link to nothing or to what is not a
// regular file, a FIFO or device, a file over MaxFileBytes.
func (c Client) Write(path string, e Entry) (Result, error) {
	r := Result{Path: path}
	refuse := func(base error, why string) (Result, error) {
		return r, fmt.Errorf("%w: %s: %s; add the entry by hand:\n%s", base, r.Path, why, c.Snippet(e))
	}
	f, st, err := openConfig(path)
	if errors.Is(err, fs.ErrNotExist) {
		merged, err := c.Merge(nil, e)
		if err != nil {
			return refuse(ErrUnparsable, err.Error())
		}
		if err := createNew(path, merged); err != nil {
			return r, fmt.Errorf("setup: %w", err)
		}
		r.Changed = true
		return r, nil
	}
	var ue unsafeError
	if errors.As(err, &ue) {
		r.Path = ue.path
		return refuse(ErrUnsafe, ue.why)
	}
	if err != nil {
		return r, fmt.Errorf("setup: %w", err)
	}
	defer f.Close()
	r.Path = f.Name()
	old, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return r, fmt.Errorf("setup: read %s: %w", r.Path, err)
	}
	if len(old) > MaxFileBytes {
		return refuse(ErrUnsafe, fmt.Sprintf("larger than %d MiB, which is no config file setup rewrites", MaxFileBytes>>20))
	}
	merged, err := c.Merge(old, e)
	if err != nil {
		return refuse(ErrUnparsable, err.Error())
	}
	if bytes.Equal(old, merged) {
		return r, nil
	}
	// A backup never replaces another file: FILE.bak, else FILE.bak.1,
	// FILE.bak.2, ... (the first keeps the file as it was before setup
	// ever touched it; an earlier backup may be someone's own).
	r.Backup = r.Path + ".bak"
	for i := 1; ; i++ {
		if _, err := os.Lstat(r.Backup); errors.Is(err, os.ErrNotExist) {
			break
		}
		if i > 100 {
			return refuse(ErrUnsafe, "there are already 100 backups of it ("+r.Path+".bak.N); remove old ones")
		}
		r.Backup = fmt.Sprintf("%s.bak.%d", r.Path, i)
	}
	if err := writeNew(filepath.Dir(r.Path), r.Backup, old, st); err != nil {
		return r, fmt.Errorf("setup: backup: %w", err)
	}
	if err := rewrite(r.Path, st, old, merged); err != nil {
		return r, fmt.Errorf("setup: %w (the old file is %s)", err, r.Backup)
	}
	r.Changed = true
	return r, nil
}

// unsafeError is a path Write will not touch, and why.
type unsafeError struct{ path, why string }

func (u unsafeError) Error() string { return u.path + ": " + u.why }

// openConfig opens the regular file at path (through a symbolic link,
// when path is one that names a regular file) for reading, without
// blocking on a FIFO or following a link swapped in meanwhile. It returns
// fs.ErrNotExist when nothing is at path (not even a dangling link).
func openConfig(path string) (*os.File, os.FileInfo, error) {
	lst, err := os.Lstat(path)
	if err != nil {
		return nil, nil, err
	}
	real, via := path, ""
	if lst.Mode()&fs.ModeSymlink != 0 {
		target, _ := os.Readlink(path)
		resolved, err := filepath.EvalSymlinks(path)
		if err != nil {
			// A dangling link: writing through it would create a file
			// where it points, wherever that is.
			return nil, nil, unsafeError{path, fmt.Sprintf("a symbolic link to %s, which cannot be followed (%v); setup does not create files through links", target, pathErr(err))}
		}
		if lst, err = os.Lstat(resolved); err != nil {
			return nil, nil, err
		}
		real, via = resolved, fmt.Sprintf("a symbolic link to %s, which is ", target)
	}
	if !lst.Mode().IsRegular() {
		// Reading a FIFO would block, a device never end; writing either
		// would write into something that is no config file.
		return nil, nil, unsafeError{path, fmt.Sprintf("%snot a regular file but %s", via, kind(lst.Mode()))}
	}
	if lst.Size() > MaxFileBytes {
		return nil, nil, unsafeError{real, fmt.Sprintf("larger than %d MiB, which is no config file setup rewrites", MaxFileBytes>>20)}
	}
	f, err := os.OpenFile(real, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, nil, unsafeError{real, "became a symbolic link while setup ran"}
		}
		return nil, nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	if !st.Mode().IsRegular() || !os.SameFile(st, lst) {
		f.Close()
		return nil, nil, unsafeError{real, "changed while setup ran"}
	}
	return f, st, nil
}

func kind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m&fs.ModeSocket != 0:
		return "a socket"
	}
	return m.Type().String()
}

// rewrite puts data into the file at path in place: the inode st
// describes, whose content is old. It writes over the old bytes from the
// start and then cuts the file to its new length, so the file never
// holds less than a whole version plus, at worst, a tail of the old one;
// a failed write puts the old content back. A file that changed since it
// was read is refused.
func rewrite(path string, st os.FileInfo, old, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	now, err := f.Stat()
	if err != nil {
		return err
	}
	if !os.SameFile(now, st) || now.Size() != int64(len(old)) || !now.ModTime().Equal(st.ModTime()) {
		return fmt.Errorf("%w: %s changed while setup ran; run it again", ErrUnsafe, path)
	}
	put := func(b []byte) error {
		if _, err := f.WriteAt(b, 0); err != nil {
			return err
		}
		if err := f.Truncate(int64(len(b))); err != nil {
			return err
		}
		return f.Sync()
	}
	if err := put(data); err != nil {
		if rerr := put(old); rerr != nil {
			return fmt.Errorf("%s: %v, and restoring the old content failed: %v", path, err, rerr)
		}
		return fmt.Errorf("%s: %w (the old content is back)", path, err)
	}
	return nil
}

// createNew creates the file at path (and its directories) with data,
// mode 0600, through a temporary file linked into place: the file appears
// whole or not at all, and nothing that appeared at path meanwhile is
// replaced or written through.
func createNew(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return placeTemp(dir, data, nil, func(tmp string) error {
		if err := os.Link(tmp, path); err != nil {
			if errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("%s appeared while setup ran; run it again", path)
			}
			return err
		}
		return nil
	})
}

// writeNew puts data at path through a file of its own (created
// exclusively in dir, with like's mode and, as far as this process may,
// its owner) renamed into place: nothing already lying there (a stray
// temporary file, a symbolic link where the backup goes) is written
// through or lends its mode.
func writeNew(dir, path string, data []byte, like os.FileInfo) error {
	return placeTemp(dir, data, like, func(tmp string) error { return os.Rename(tmp, path) })
}

// placeTemp writes data to a new temporary file in dir, durably, and
// hands it to place; the temporary file is gone afterwards either way.
func placeTemp(dir string, data []byte, like os.FileInfo, place func(tmp string) error) error {
	f, err := os.CreateTemp(dir, ".pysandbox-setup-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	mode := os.FileMode(0o600)
	if like != nil {
		mode = like.Mode().Perm()
		if sys, ok := like.Sys().(*syscall.Stat_t); ok && (int(sys.Uid) != os.Geteuid() || int(sys.Gid) != os.Getegid()) {
			// Root writing another user's file: the backup is theirs too.
			// Anyone else cannot give a file away, and keeps it.
			_ = f.Chown(int(sys.Uid), int(sys.Gid))
		}
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return place(tmp)
}

// pathErr is err without the operation and path a *fs.PathError repeats.
func pathErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
