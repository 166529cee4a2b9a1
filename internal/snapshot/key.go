package snapshot

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// KeyFile is the name of the server's snapshot key in its state directory.
const KeyFile = "server.key"

// lockFile is the name of the state directory's lock.
const lockFile = "lock"

// maxKeyFile bounds the key file read: the key is 64 hex digits.
const maxKeyFile = 4096

// openDir: the state directory is trusted: the key in it signs the snapshots the
// server restores, and the server (often root) truncates and writes its
// lock. So whoever else could write it could have the server restore
// snapshots of their making, or (a lock that is a link to a file of
// root's) overwrite any file. It, and each file the server trusts in it,
// must therefore be the server's own, written by nobody else:
//
//   - the state directory (and the snapshot directory, Open's) is made
//     0700 when missing; one that exists must belong to the server's
//     effective uid and be writable by neither its group nor others. The
//     directory may be reached through a symbolic link (/var/lib/pysandbox
//     -> /srv/pysandbox): what is checked is the directory reached, and
//     the lock and the key are then opened in that very directory (by its
//     descriptor), not by name again. The directories above it are not
//     checked: whoever can write them can put another directory in its
//     place, which must then pass the same checks.
//   - the lock and the key are opened without following a symbolic link
//     (O_NOFOLLOW) and checked on the descriptor opened (fstat): a
//     regular file with one link (no hard link to a file elsewhere),
//     owned by the effective uid, the key readable and writable by nobody
//     else, the lock writable by nobody else. New ones are made with
//     O_EXCL, mode 0600.
//
// A check that fails is an error saying what to change (chown, chmod, or
// another --state-dir); nothing is repaired silently.
//
// openDir makes dir when it is missing (mode 0700, and its missing
// parents) and opens it, checked as above; what names it in errors
// ("state directory").
func openDir(dir, what string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("snapshot: %s: %w", what, err)
	}
	fd, err := openat(unix.AT_FDCWD, dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("snapshot: %s %s: %w", what, dir, os.NewSyscallError("open", err))
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("snapshot: %s %s: %w", what, dir, os.NewSyscallError("fstat", err))
	}
	euid := os.Geteuid()
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		err = fmt.Errorf("snapshot: %s %s is not a directory", what, dir)
	case int(st.Uid) != euid:
		err = fmt.Errorf("snapshot: %s %s belongs to uid %d, not to this server's uid %d, so its owner could plant snapshots, a key or a lock the server trusts: chown %d it (chown -R, when its content is yours), or use another --state-dir", what, dir, st.Uid, euid, euid)
	case st.Mode&0o022 != 0:
		err = fmt.Errorf("snapshot: %s %s can be written by its group or others (mode %04o), who could plant snapshots, a key or a lock the server trusts: chmod 700 it, or use another --state-dir", what, dir, st.Mode&0o7777)
	}
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), dir), nil
}

// openat is openat(2), retried when interrupted.
func openat(dirfd int, name string, flags int, mode uint32) (int, error) {
	for {
		fd, err := unix.Openat(dirfd, name, flags, mode)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// openOwn opens the file name in the directory d (its path dir) without
// following a symbolic link, checked as the package's comment says: perm
// are the mode bits group and others must not have; what names it in
// errors ("the key"). With create, a missing file is made (O_EXCL, mode
// 0600) and created says so; without, a missing one is an error
// satisfying errors.Is(err, os.ErrNotExist).
func openOwn(d *os.File, dir, name string, flags int, create bool, perm uint32, what string) (f *os.File, created bool, err error) {
	path := filepath.Join(dir, name)
	dirfd := int(d.Fd())
	var fd int
	var st unix.Stat_t
	for try := 0; ; try++ {
		fd, st, err = openRegular(dirfd, name, flags)
		if err != unix.ENOENT || !create || try == 3 {
			break
		}
		fd, err = openat(dirfd, name, flags|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err == nil {
			return os.NewFile(uintptr(fd), path), true, nil
		}
		if err != unix.EEXIST { // EEXIST: another server made it first
			break
		}
	}
	var nr *notRegularError
	switch {
	case err == unix.ELOOP || err == unix.EMLINK:
		// O_NOFOLLOW's refusal of a symbolic link (EMLINK on the BSDs).
		return nil, false, fmt.Errorf("snapshot: %s %s is a symbolic link, which the server does not follow (it would read or write the file it points to): remove the link", what, path)
	case errors.As(err, &nr) && !nr.regular:
		return nil, false, fmt.Errorf("snapshot: %s %s is not a regular file: remove it", what, path)
	case errors.As(err, &nr):
		return nil, false, fmt.Errorf("snapshot: %s %s has %d hard links (it is also a file elsewhere, which the server would read or write): remove it", what, path, nr.nlink)
	case errors.As(err, new(*os.SyscallError)):
		return nil, false, fmt.Errorf("snapshot: %s %s: %w", what, path, err)
	case err != nil:
		return nil, false, fmt.Errorf("snapshot: %s %s: %w", what, path, os.NewSyscallError("openat", err))
	}
	euid := os.Geteuid()
	switch {
	case int(st.Uid) != euid:
		err = fmt.Errorf("snapshot: %s %s belongs to uid %d, not to this server's uid %d: chown %d it if you made it, else remove it", what, path, st.Uid, euid, euid)
	case st.Mode&perm != 0:
		err = fmt.Errorf("snapshot: %s %s can be read or written by others (mode %04o); chmod 600 it", what, path, st.Mode&0o7777)
	}
	if err != nil {
		unix.Close(fd)
		return nil, false, err
	}
	return os.NewFile(uintptr(fd), path), false, nil
}

// notRegularError is openRegular's refusal of a name that is not a
// regular file with one name.
type notRegularError struct {
	regular bool
	nlink   uint64
}

func (e *notRegularError) Error() string {
	if !e.regular {
		return "not a regular file"
	}
	return fmt.Sprintf("a regular file with %d names", e.nlink)
}

// openRegular opens name below dirfd (unix.AT_FDCWD for a path) without
// following a symbolic link and without blocking on a FIFO in its place,
// and keeps the descriptor only for a regular file with one name: a
// second name is the same file elsewhere, which the server would then
// read or write. The descriptor it returns blocks again; st is its
// stat. A failed open is openat's bare errno, so that callers can tell
// ENOENT (a file removed as it was opened is one too); a refusal is a
// *notRegularError.
func openRegular(dirfd int, name string, flags int) (fd int, st unix.Stat_t, err error) {
	fd, err = openat(dirfd, name, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NOCTTY|unix.O_NONBLOCK, 0)
	switch err {
	case nil:
	case unix.ENXIO, unix.ENODEV, unix.EISDIR:
		// A socket, a device without a driver, a directory opened for
		// writing: something else is at the name.
		return -1, st, &notRegularError{}
	default:
		return -1, st, err
	}
	switch err = unix.Fstat(fd, &st); {
	case err != nil:
		err = os.NewSyscallError("fstat", err)
	case st.Nlink == 0:
		// Removed between the open and the fstat: gone, as if never
		// opened (openOwn then makes it again when asked to).
		err = unix.ENOENT
	case st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink != 1:
		err = &notRegularError{regular: st.Mode&unix.S_IFMT == unix.S_IFREG, nlink: uint64(st.Nlink)}
	default:
		if err = unix.SetNonblock(fd, false); err != nil {
			err = os.NewSyscallError("fcntl", err)
		}
	}
	if err != nil {
		unix.Close(fd)
		return -1, st, err
	}
	return fd, st, nil
}

// LoadKey returns the key snapshots in dir are signed with: the one in
// dir/server.key, made (32 random bytes, mode 0600) on first use. Whoever
// holds the key can write snapshots this server restores, so dir must be
// the server's own and the key file too: a key file that is a symbolic
// link, belongs to another uid, or that others can read or write is
// refused (see openDir and openOwn).
func LoadKey(dir string) ([]byte, error) {
	d, err := openDir(dir, "state directory")
	if err != nil {
		return nil, err
	}
	defer d.Close()
	for {
		f, created, err := openOwn(d, dir, KeyFile, unix.O_RDONLY, false, 0o077, "the key")
		if err == nil && !created {
			defer f.Close()
			data, err := io.ReadAll(io.LimitReader(f, maxKeyFile+1))
			if err != nil {
				return nil, fmt.Errorf("snapshot: read the key: %w", err)
			}
			k, err := hex.DecodeString(string(bytes.TrimSpace(data)))
			if err != nil || len(k) < 32 {
				return nil, fmt.Errorf("snapshot: the key %s is not 32 or more hex-encoded bytes", f.Name())
			}
			return k, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		k, err := makeKey(d, dir)
		if errors.Is(err, os.ErrExist) {
			continue // another server made it first: read theirs
		}
		return k, err
	}
}

// makeKey writes a new key to dir/server.key (d), which must not exist.
func makeKey(d *os.File, dir string) ([]byte, error) {
	var k [32]byte
	if _, err := rand.Read(k[:]); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, KeyFile)
	dirfd := int(d.Fd())
	// Written whole under a name of its own, then renamed into place
	// unless a key is there already: a server starting beside this one
	// never reads a key half-written (it read an empty one and stopped).
	var n [4]byte
	if _, err := rand.Read(n[:]); err != nil {
		return nil, err
	}
	tmp := fmt.Sprintf(".%s.tmp-%x", KeyFile, n) // nothing of the key in a name
	fd, err := openat(dirfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("snapshot: make the key %s: %w", path, os.NewSyscallError("openat", err))
	}
	f := os.NewFile(uintptr(fd), filepath.Join(dir, tmp))
	_, werr := f.Write([]byte(hex.EncodeToString(k[:]) + "\n"))
	serr := f.Sync()
	cerr := f.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		unix.Unlinkat(dirfd, tmp, 0)
		return nil, fmt.Errorf("snapshot: write the key %s: %w", path, err)
	}
	err = unix.Renameat2(dirfd, tmp, dirfd, KeyFile, unix.RENAME_NOREPLACE)
	if err == unix.EINVAL || err == unix.ENOSYS {
		// A file system without RENAME_NOREPLACE: a hard link fails as
		// the rename would when the key exists, and the temporary name
		// goes right after (a server that opens the key in between sees
		// two names and refuses to start; its next start works).
		if err = unix.Linkat(dirfd, tmp, dirfd, KeyFile, 0); err == nil {
			unix.Unlinkat(dirfd, tmp, 0)
		}
	}
	if err != nil {
		unix.Unlinkat(dirfd, tmp, 0)
		if err == unix.EEXIST {
			return nil, os.ErrExist
		}
		return nil, fmt.Errorf("snapshot: make the key %s: %w", path, os.NewSyscallError("renameat2", err))
	}
	d.Sync() // the key's name too
	return k[:], nil
}

// DeriveKey is the snapshot key of replicas that share secret (the
// replicas' token): every replica signs and verifies with it, so one can
// take over another's snapshots. The domain keeps it apart from the
// token's other uses.
func DeriveKey(secret []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte("pysandbox snapshot key v1"))
	return h.Sum(nil)
}

// ErrLocked: another server holds the state directory.
var ErrLocked = errors.New("snapshot: the state directory is in use by another server")

// Lock takes the state directory dir for this server (an exclusive flock
// on dir/lock, released when the process ends, however it ends) and
// returns its release. When another server holds it, the error is
// ErrLocked and holder says which process, as " (pid N)" when known. dir
// is made (0700) when missing, and refused when it, or its lock, is not
// the server's own (see openDir and openOwn).
func Lock(dir string) (unlock func(), holder string, err error) {
	d, err := openDir(dir, "state directory")
	if err != nil {
		return nil, "", err
	}
	defer d.Close()
	f, _, err := openOwn(d, dir, lockFile, unix.O_RDWR, true, 0o022, "the lock")
	if err != nil {
		return nil, "", err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		var b [32]byte
		n, _ := f.ReadAt(b[:], 0)
		f.Close()
		if err == unix.EWOULDBLOCK {
			if pid := strings.TrimSpace(string(b[:n])); pid != "" && isDigits(pid) {
				holder = " (pid " + pid + ")"
			}
			return nil, holder, ErrLocked
		}
		return nil, "", fmt.Errorf("snapshot: lock the state directory: %w", os.NewSyscallError("flock", err))
	}
	f.Truncate(0)
	f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return func() { f.Close() }, "", nil
}

func isDigits(s string) bool {
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return len(s) > 0 && len(s) < 12
}
