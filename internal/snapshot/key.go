package snapshot

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// KeyFile is the name of the server's snapshot key in its state directory.
const KeyFile = "server.key"

// LoadKey returns the key snapshots in dir are signed with: the one in
// dir/server.key, made (32 random bytes, mode 0600) on first use. A key
// file others can read or write is refused: whoever holds the key can
// write snapshots this server restores.
func LoadKey(dir string) ([]byte, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("snapshot: state directory: %w", err)
	}
	path := filepath.Join(dir, KeyFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		var k [32]byte
		if _, err := rand.Read(k[:]); err != nil {
			return nil, err
		}
		enc := []byte(hex.EncodeToString(k[:]) + "\n")
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, os.ErrExist) {
			return LoadKey(dir) // another server made it first
		}
		if err != nil {
			return nil, fmt.Errorf("snapshot: make the key: %w", err)
		}
		_, werr := f.Write(enc)
		serr := f.Sync()
		if cerr := f.Close(); werr == nil && serr == nil && cerr == nil {
			return k[:], nil
		}
		os.Remove(path)
		return nil, fmt.Errorf("snapshot: write the key %s: %v", path, errors.Join(werr, serr))
	}
	if err != nil {
		return nil, fmt.Errorf("snapshot: read the key: %w", err)
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("snapshot: read the key: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("snapshot: the key %s can be read or written by others (mode %v); chmod 600 it", path, st.Mode().Perm())
	}
	k, err := hex.DecodeString(string(bytes.TrimSpace(data)))
	if err != nil || len(k) < 32 {
		return nil, fmt.Errorf("snapshot: the key %s is not 32 or more hex-encoded bytes", path)
	}
	return k, nil
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
// ErrLocked and holder says which process, as " (pid N)" when known.
func Lock(dir string) (unlock func(), holder string, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, "", fmt.Errorf("snapshot: state directory: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, "", fmt.Errorf("snapshot: state directory: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		var b [32]byte
		n, _ := f.ReadAt(b[:], 0)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
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
