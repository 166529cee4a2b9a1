package pydist

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/pysandbox/pysandbox/internal/deps"
)

// An archive is hostile until it has been unpacked and checked, even one
// whose digest matched: the metadata may be wrong, or a mirror's. So the
// unpacker creates every entry itself, beneath a directory it holds open,
// resolving each parent with openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS)
// so that nothing it wrote (a symlink) can ever be written through; takes
// only directories, regular files, hard links to files already unpacked
// and symlinks that stay inside the tree; and gives every entry a mode of
// its own choosing (0755 or 0644, never set-id), owned by the server.

// Limits of one unpacked tree (a python-build-standalone install_only
// archive holds about 5 000 entries and 100 MB).
const (
	maxEntries  = 200_000
	maxDepth    = 64
	maxNameLen  = 4096
	maxFileSize = 2 << 30
	maxElement  = 255 // bytes in one path element, as Linux file systems allow
	maxTrailer  = 1 << 20
)

// ArchiveError is an archive that cannot be unpacked as an interpreter:
// what is wrong with it, in a sentence.
type ArchiveError struct{ Msg string }

func (e *ArchiveError) Error() string { return "the archive " + e.Msg }

func badArchive(format string, args ...any) error {
	return &ArchiveError{Msg: fmt.Sprintf(format, args...)}
}

// unpacker writes one archive beneath root.
type unpacker struct {
	root     int // O_PATH|O_DIRECTORY of the tree's top (the archive's python/)
	charge   func(int64) error
	maxBytes int64
	written  int64
	links    []string // symlinks created, checked once everything is in
	entries  int
	// hasBin: the tree has a python/bin directory. Names are not kept:
	// a name given twice is caught by O_EXCL, or is a directory again,
	// which is harmless, and an archive of long names must not cost
	// the server memory.
	hasBin bool
	ctx    context.Context
}

// unpack reads a gzip-compressed tar from r and unpacks its python/
// directory into dir (which exists and is empty).
func unpack(ctx context.Context, r io.Reader, dir string, maxBytes int64, charge func(int64) error) error {
	zr, err := gzip.NewReader(r)
	if err != nil {
		return badArchive("is not gzip-compressed (%s)", err)
	}
	zr.Multistream(false)
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return os.NewSyscallError("open", err)
	}
	defer unix.Close(fd)
	u := &unpacker{root: fd, charge: charge, maxBytes: maxBytes, ctx: ctx}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return truncated(err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := u.entry(h, tr); err != nil {
			return err
		}
	}
	// The rest of the gzip stream, whose checksum is only checked at its
	// end: the tar's padding, a few KiB. Anything longer is not a tar's.
	n, err := io.Copy(io.Discard, io.LimitReader(zr, maxTrailer+1))
	if err != nil {
		return truncated(err)
	}
	if n > maxTrailer {
		return badArchive("has more than %d KiB of data after its end", maxTrailer>>10)
	}
	if u.entries == 0 {
		return badArchive("is empty")
	}
	if !u.hasBin {
		return badArchive("has no python/bin directory: it is not an install_only build")
	}
	for _, l := range u.links {
		if err := u.checkLink(l); err != nil {
			return err
		}
	}
	return nil
}

func truncated(err error) error {
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return badArchive("is truncated")
	}
	var ae *ArchiveError
	if errors.As(err, &ae) {
		return err
	}
	return badArchive("is damaged: %s", err)
}

// rel checks an entry's name and returns it relative to python/ ("" for
// python/ itself).
func rel(name string) (string, error) {
	if len(name) > maxNameLen || strings.ContainsRune(name, 0) {
		return "", badArchive("has an entry with an unusable name (%.80q)", name)
	}
	if strings.HasPrefix(name, "/") {
		return "", badArchive("has an entry with an absolute path (%.200q)", name)
	}
	for _, el := range strings.Split(name, "/") {
		if el == ".." {
			return "", badArchive("has an entry whose path leaves its directory (%.200q)", name)
		}
		if len(el) > maxElement {
			return "", badArchive("has a name longer than %d bytes (%.80q...)", maxElement, el)
		}
	}
	clean := path.Clean(strings.TrimPrefix(name, "./"))
	if clean == "python" {
		return "", nil
	}
	r, ok := strings.CutPrefix(clean, "python/")
	if !ok {
		return "", badArchive("has an entry outside python/ (%.200q): it is not an install_only build", name)
	}
	if strings.Count(r, "/") >= maxDepth {
		return "", badArchive("nests directories more than %d deep", maxDepth)
	}
	return r, nil
}

func (u *unpacker) entry(h *tar.Header, r io.Reader) error {
	if h.Typeflag == tar.TypeXGlobalHeader {
		return nil
	}
	if u.entries++; u.entries > maxEntries {
		return badArchive("has more than %d entries", maxEntries)
	}
	name, err := rel(h.Name)
	if err != nil {
		return err
	}
	if name == "" {
		if h.Typeflag != tar.TypeDir {
			return badArchive("has python/ as something else than a directory")
		}
		return nil
	}
	if top, _, _ := strings.Cut(name, "/"); top == "bin" {
		u.hasBin = true
	}
	switch h.Typeflag {
	case tar.TypeDir:
		return u.mkdirAll(name)
	case tar.TypeReg: // archive/tar reads the old TypeRegA as this
		return u.file(name, h, r)
	case tar.TypeSymlink:
		return u.symlink(name, h.Linkname)
	case tar.TypeLink:
		return u.hardlink(name, h.Linkname)
	case tar.TypeChar, tar.TypeBlock:
		return badArchive("holds a device file (python/%s)", name)
	case tar.TypeFifo:
		return badArchive("holds a named pipe (python/%s)", name)
	}
	return badArchive("holds an entry of a type it may not (%q, python/%s)", h.Typeflag, name)
}

// parent opens the directory an entry goes in, creating what is missing,
// and returns it with the entry's last element.
func (u *unpacker) parent(name string) (int, string, error) {
	dir, base := path.Split(name)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		fd, err := unix.Dup(u.root)
		return fd, base, os.NewSyscallError("dup", err)
	}
	if err := u.mkdirAll(dir); err != nil {
		return -1, "", err
	}
	fd, err := deps.OpenBeneath(u.root, dir, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return -1, "", u.under(dir, err)
	}
	return fd, base, nil
}

// under explains a failed resolution: a symlink in the way means the
// archive tried to write through one.
func (u *unpacker) under(name string, err error) error {
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOTDIR) {
		return badArchive("writes python/%s through a symlink or a file", name)
	}
	return fmt.Errorf("pydist: unpack python/%s: %w", name, err)
}

// mkdirAll creates name and its missing parents, one element at a time,
// beneath root.
func (u *unpacker) mkdirAll(name string) error {
	cur := u.root
	owned := false
	defer func() {
		if owned {
			unix.Close(cur)
		}
	}()
	for _, el := range strings.Split(name, "/") {
		if el == "" || el == "." {
			continue
		}
		fd, err := deps.OpenBeneath(cur, el, unix.O_PATH|unix.O_DIRECTORY)
		if errors.Is(err, unix.ENOENT) {
			if err := u.charge(deps.EntryCharge(0)); err != nil {
				return err
			}
			if err := unix.Mkdirat(cur, el, 0o755); err != nil && err != unix.EEXIST {
				return diskError("unpack python/"+name, os.NewSyscallError("mkdirat", err))
			}
			// Whatever the umask: the sandboxes' uid reads the tree.
			if err := unix.Fchmodat(cur, el, 0o755, 0); err != nil {
				return fmt.Errorf("pydist: %w", os.NewSyscallError("fchmodat", err))
			}
			fd, err = deps.OpenBeneath(cur, el, unix.O_PATH|unix.O_DIRECTORY)
		}
		if err != nil {
			return u.under(name, err)
		}
		if owned {
			unix.Close(cur)
		}
		cur, owned = fd, true
	}
	return nil
}

func (u *unpacker) file(name string, h *tar.Header, r io.Reader) error {
	if h.Size < 0 || h.Size > maxFileSize {
		return badArchive("holds a file of %d bytes (python/%s)", h.Size, name)
	}
	if u.written+h.Size > u.maxBytes {
		return badArchive("unpacks to more than %d MiB", u.maxBytes>>20)
	}
	if err := u.charge(deps.EntryCharge(h.Size)); err != nil {
		return err
	}
	dfd, base, err := u.parent(name)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	mode := uint32(0o644)
	if h.Mode&0o111 != 0 {
		mode = 0o755
	}
	fd, err := unix.Openat(dfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
	if err != nil {
		if err == unix.EEXIST {
			return badArchive("has %q twice", "python/"+name)
		}
		return diskError("unpack python/"+name, os.NewSyscallError("openat", err))
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	n, err := io.Copy(f, io.LimitReader(r, h.Size))
	if err != nil {
		var ae *ArchiveError
		if errors.As(err, &ae) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, gzip.ErrChecksum) || errors.Is(err, gzip.ErrHeader) {
			return truncated(err)
		}
		if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
			return diskError("unpack python/"+name, err)
		}
		return truncated(err)
	}
	if n != h.Size {
		return badArchive("is truncated")
	}
	u.written += n
	// The mode again: the umask may have taken bits away.
	if err := f.Chmod(os.FileMode(mode)); err != nil {
		return fmt.Errorf("pydist: %w", err)
	}
	// The archive's time: a module's cached bytecode names its source's
	// mtime, and a newer source would make Python recompile it on every
	// import (it cannot write the cache in a read-only tree).
	if !h.ModTime.IsZero() {
		ts := []unix.Timespec{unix.NsecToTimespec(h.ModTime.UnixNano()), unix.NsecToTimespec(h.ModTime.UnixNano())}
		if err := unix.UtimesNanoAt(dfd, base, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("pydist: %w", os.NewSyscallError("utimensat", err))
		}
	}
	return nil
}

func (u *unpacker) symlink(name, target string) error {
	if target == "" || len(target) > maxNameLen || strings.ContainsRune(target, 0) {
		return badArchive("has a symlink with an unusable target (python/%s)", name)
	}
	if strings.HasPrefix(target, "/") {
		return badArchive("has a symlink out of the tree (python/%s -> %.200s)", name, target)
	}
	if full := path.Join(path.Dir(name), target); full == ".." || strings.HasPrefix(full, "../") {
		return badArchive("has a symlink out of the tree (python/%s -> %.200s)", name, target)
	}
	if err := u.charge(deps.EntryCharge(int64(len(target)))); err != nil {
		return err
	}
	dfd, base, err := u.parent(name)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	if err := unix.Symlinkat(target, dfd, base); err != nil {
		if err == unix.EEXIST {
			return badArchive("has %q twice", "python/"+name)
		}
		return diskError("unpack python/"+name, os.NewSyscallError("symlinkat", err))
	}
	u.links = append(u.links, name)
	return nil
}

func (u *unpacker) hardlink(name, target string) error {
	t, err := rel(target)
	if err != nil || t == "" {
		return badArchive("has a hard link to something outside the tree (python/%s -> %.200s)", name, target)
	}
	tfd, tbase, err := u.parent(t)
	if err != nil {
		return err
	}
	defer unix.Close(tfd)
	var st unix.Stat_t
	if err := unix.Fstatat(tfd, tbase, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return badArchive("has a hard link to something that is not a file unpacked before it (python/%s -> %.200s)", name, target)
	}
	if err := u.charge(deps.EntryCharge(0)); err != nil {
		return err
	}
	dfd, base, err := u.parent(name)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	// Without AT_SYMLINK_FOLLOW: the target is linked as it is.
	if err := unix.Linkat(tfd, tbase, dfd, base, 0); err != nil {
		if err == unix.EEXIST {
			return badArchive("has %q twice", "python/"+name)
		}
		return diskError("unpack python/"+name, os.NewSyscallError("linkat", err))
	}
	return nil
}

// checkLink resolves a symlink beneath root: one that leads out of the
// tree, whatever other links it goes through, is refused; one that leads
// nowhere (a missing name) stops there and can never lead out, since the
// tree never changes once published.
func (u *unpacker) checkLink(name string) error {
	how := &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV}
	for try := 0; ; try++ {
		fd, err := unix.Openat2(u.root, name, how)
		if (err == unix.EAGAIN || err == unix.EINTR) && try < 100 {
			continue
		}
		switch err {
		case nil:
			unix.Close(fd)
			return nil
		case unix.ENOENT, unix.ENOTDIR:
			return nil
		case unix.EXDEV:
			return badArchive("has a symlink that leads out of the tree (python/%s)", name)
		case unix.ELOOP:
			return badArchive("has symlinks that loop (python/%s)", name)
		}
		return fmt.Errorf("pydist: check python/%s: %w", name, os.NewSyscallError("openat2", err))
	}
}

// finish makes the tree's top readable by the sandboxes (its entries are
// already).
func finish(dir string) error {
	if err := os.Chmod(dir, 0o755); err != nil {
		return fmt.Errorf("pydist: %w", err)
	}
	return nil
}
