// Package snapshot keeps paused sessions at rest: one file per session in
// the server's state directory, holding what the session's worker saved of
// its globals (an opaque stream only the worker reads back), its workspace
// files as a tar, and a description (Meta), all bound by an HMAC under the
// server's key.
//
// It sits beside the engine in the flow MCP tool → policy → engine →
// sandbox: the engine decides when a session is paused and resumed, this
// package decides what a snapshot looks like on disk and whether one read
// back is genuine. The bytes of a snapshot come from a sandbox and are
// hostile; the state directory may be written by whoever can reach the
// disk (a volume moved between pods, an operator's mistake): nothing read
// from it is used before its HMAC is checked, and the HMAC covers the
// session's id and owner, so a snapshot edited, truncated, copied under
// another id or written by a server without the key is refused.
//
// The file is written in one pass, so that a 100 MB session is never held
// twice: the sections first, their lengths and the MACs at the end.
//
//	magic "PYSBSNAP1\n"
//	globals section (the worker's stream)
//	files section (a tar of the workspace)
//	meta section (JSON)
//	trailer: globals length, files length, meta length (8 bytes each, big
//	endian), the HMAC of the meta alone (32), the HMAC of everything
//	before it (32)
//
// The meta's own HMAC lets a server list its paused sessions at start
// without reading every snapshot through; the whole-file HMAC is checked
// before a snapshot is restored.
package snapshot

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const (
	magic      = "PYSBSNAP1\n"
	trailerLen = 3*8 + 2*sha256.Size
	// maxMeta bounds the meta section read back.
	maxMeta = 4 << 20
	// suffix names snapshot files; tmpPrefix the ones being written.
	suffix    = ".snap"
	tmpPrefix = ".tmp-"
)

// Domains separate what the key signs: no MAC of one kind can pass for
// another (the replicas' token, from which a cluster's key is derived,
// signs directory entries and gone markers too).
const (
	metaDomain = "pysandbox snapshot meta v1\n"
	fileDomain = "pysandbox snapshot file v1\n"
)

// Unsaveable is a global the worker could not save, and why.
type Unsaveable struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// Meta describes a snapshot.
type Meta struct {
	ID    string `json:"session_id"`
	Owner string `json:"owner"`
	// Created is when the session was created, PausedAt when this
	// snapshot was taken.
	Created  time.Time `json:"created"`
	PausedAt time.Time `json:"paused_at"`
	// TTL is the session's idle time to live once it runs again.
	TTL time.Duration `json:"ttl"`
	// Python is the interpreter's version ("3.11.2"); the session resumes
	// on the same minor version, whose pickles and code objects it reads.
	Python string `json:"python"`
	// Requirements are the session's dependencies, install_package's
	// included: the environment is found in the cache (or built) again,
	// not copied into the snapshot.
	Requirements []string `json:"requirements,omitempty"`
	// Base are the requirements the session was created with (its
	// environment); Requirements add what install_package installed.
	Base []string `json:"base,omitempty"`
	// Installed is set when install_package put packages in the session.
	Installed bool `json:"installed,omitempty"`
	Runs      int  `json:"runs"`
	// Saved and Unsaveable are the globals the worker saved, and those it
	// could not.
	Saved      []string     `json:"saved"`
	Unsaveable []Unsaveable `json:"unsaveable,omitempty"`
	// Files counts the workspace files saved; Skipped describes what of
	// the workspace was left out (symlinks, special files).
	Files   int      `json:"files"`
	Skipped []string `json:"skipped,omitempty"`
	// Replica names the server that wrote it, when it is one of several.
	Replica string `json:"replica,omitempty"`
	// Checkpoint is set for a snapshot taken after a run while the
	// session went on running (--checkpoint every-run, or a drain).
	Checkpoint bool `json:"checkpoint,omitempty"`
}

// Info is a snapshot on disk, its meta verified.
type Info struct {
	Meta
	Size int64
	// Modified is when the file was written.
	Modified time.Time
}

// Errors of snapshots read back.
var (
	ErrNotFound = errors.New("no snapshot")
	// ErrTampered: the file is not what this server (or one with its key)
	// wrote for that session and owner.
	ErrTampered = errors.New("the snapshot was altered or was not written by this server")
)

// idPattern is what a session id may look like to name a file.
var idPattern = regexp.MustCompile(`^s-[0-9a-f]{32}(\.[a-z0-9-]{1,63}\.[0-9a-f]{1,32})?$`)

// ValidID reports whether id can name a snapshot.
func ValidID(id string) bool { return idPattern.MatchString(id) }

// Store is a directory of snapshots.
type Store struct {
	dir string
	key []byte
}

// Open opens the store in dir (created 0700 if missing) with key, at least
// 32 bytes. Like the state directory, dir must be the server's own: one
// that belongs to another uid, or that its group or others can write, is
// refused: whoever else can write it can remove genuine snapshots, put
// back older ones or plant links (snapshots forged without the key are
// refused anyway). A symbolic link to such a directory is fine; see
// openDir.
func Open(dir string, key []byte) (*Store, error) {
	if len(key) < 32 {
		return nil, errors.New("snapshot: the key must be at least 32 bytes")
	}
	d, err := openDir(dir, "snapshot directory")
	if err != nil {
		return nil, err
	}
	d.Close()
	s := &Store{dir: dir, key: bytes.Clone(key)}
	s.sweepTemp()
	return s, nil
}

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

// sweepTemp removes files a server that was killed while writing left.
func (s *Store) sweepTemp() {
	ents, _ := os.ReadDir(s.dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), tmpPrefix) {
			os.Remove(filepath.Join(s.dir, e.Name()))
		}
	}
}

func (s *Store) path(id string) string { return filepath.Join(s.dir, id+suffix) }

func (s *Store) metaMAC(meta []byte) []byte {
	h := hmac.New(sha256.New, s.key)
	h.Write([]byte(metaDomain))
	h.Write(meta)
	return h.Sum(nil)
}

// Writer writes one snapshot: Globals, then Files, then Commit (or
// Abort). Nothing is visible under the session's name before Commit.
type Writer struct {
	s     *Store
	f     *os.File
	mac   hash.Hash
	w     io.Writer
	n     int64 // bytes written so far, magic included
	limit int64
	// lengths of the sections closed so far
	globals, files int64
	section        int // 0: globals, 1: files, 2: done
	start          int64
	checked        int64 // w.n when the disk's free space was last checked
}

// The disk a state directory is on also holds, as a rule, the audit log
// and the dependency cache: a snapshot never takes its last free space,
// which would leave the audit log unable to record calls (and the server
// refusing every call). It stops short of a reserve: a tenth of the file
// system, at most reserveMax; the free space is checked every
// reserveCheckEvery bytes written.
const (
	reserveMax        = 512 << 20
	reserveCheckEvery = 4 << 20
)

// room fails with ErrDiskFull when writing n more bytes would leave the
// state directory's file system less than its reserve.
func (s *Store) room(n int64) error {
	var st syscall.Statfs_t
	if err := syscall.Statfs(s.dir, &st); err != nil {
		return nil // the write itself will say what is wrong
	}
	total, free := int64(st.Blocks)*int64(st.Bsize), int64(st.Bavail)*int64(st.Bsize)
	reserve := min(total/10, reserveMax)
	if free-n < reserve {
		return fmt.Errorf("%w (a snapshot leaves %d MiB of it free, for the audit log and the cache)", ErrDiskFull, reserve>>20)
	}
	return nil
}

// ErrTooBig is returned by a Writer's writes past its limit.
var ErrTooBig = errors.New("snapshot: over the size limit")

// Create begins a snapshot for id of at most limit bytes (0: no limit).
func (s *Store) Create(id string, limit int64) (*Writer, error) {
	if !ValidID(id) {
		return nil, fmt.Errorf("snapshot: %q is not a session id", id)
	}
	f, err := os.CreateTemp(s.dir, tmpPrefix+id+"-*")
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	mac := hmac.New(sha256.New, s.key)
	mac.Write([]byte(fileDomain))
	if err := s.room(0); err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, err
	}
	w := &Writer{s: s, f: f, mac: mac, w: io.MultiWriter(f, mac), limit: limit}
	if _, err := w.w.Write([]byte(magic)); err != nil {
		w.Abort()
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	w.n = int64(len(magic))
	w.start = w.n
	return w, nil
}

// Write appends to the current section.
func (w *Writer) Write(p []byte) (int, error) {
	if w.section > 1 {
		return 0, errors.New("snapshot: write after the sections were closed")
	}
	if w.limit > 0 && w.n-int64(len(magic))+int64(len(p)) > w.limit {
		return 0, ErrTooBig
	}
	if w.n+int64(len(p)) >= w.checked+reserveCheckEvery {
		if err := w.s.room(int64(len(p))); err != nil {
			return 0, err
		}
		w.checked = w.n
	}
	n, err := w.w.Write(p)
	w.n += int64(n)
	if err != nil {
		return n, diskError(err)
	}
	return n, nil
}

// Size is what the sections hold so far.
func (w *Writer) Size() int64 { return w.n - int64(len(magic)) }

// Room is how much more the limit allows (-1: no limit).
func (w *Writer) Room() int64 {
	if w.limit <= 0 {
		return -1
	}
	return max(w.limit-w.Size(), 0)
}

// EndGlobals closes the globals section; what is written next is the
// files section.
func (w *Writer) EndGlobals() {
	if w.section == 0 {
		w.globals = w.n - w.start
		w.start = w.n
		w.section = 1
	}
}

// Commit writes meta and the trailer, syncs, and puts the snapshot in
// place of the session's previous one. It reports the file's size.
func (w *Writer) Commit(meta Meta) (int64, error) {
	w.EndGlobals()
	if w.section != 1 {
		return 0, errors.New("snapshot: committed twice")
	}
	w.files = w.n - w.start
	w.section = 2
	if !ValidID(meta.ID) {
		w.Abort()
		return 0, fmt.Errorf("snapshot: %q is not a session id", meta.ID)
	}
	mj, err := json.Marshal(meta)
	if err != nil {
		w.Abort()
		return 0, fmt.Errorf("snapshot: %w", err)
	}
	var tr [3 * 8]byte
	binary.BigEndian.PutUint64(tr[0:], uint64(w.globals))
	binary.BigEndian.PutUint64(tr[8:], uint64(w.files))
	binary.BigEndian.PutUint64(tr[16:], uint64(len(mj)))
	for _, b := range [][]byte{mj, tr[:], w.s.metaMAC(mj)} {
		if _, err := w.w.Write(b); err != nil {
			w.Abort()
			return 0, fmt.Errorf("snapshot: %w", diskError(err))
		}
	}
	if _, err := w.f.Write(w.mac.Sum(nil)); err != nil {
		w.Abort()
		return 0, fmt.Errorf("snapshot: %w", diskError(err))
	}
	size := w.n + int64(len(mj)) + trailerLen
	if err := w.f.Sync(); err != nil {
		w.Abort()
		return 0, fmt.Errorf("snapshot: %w", diskError(err))
	}
	name := w.f.Name()
	if err := w.f.Close(); err != nil {
		os.Remove(name)
		return 0, fmt.Errorf("snapshot: %w", diskError(err))
	}
	if err := os.Rename(name, w.s.path(meta.ID)); err != nil {
		os.Remove(name)
		return 0, fmt.Errorf("snapshot: %w", err)
	}
	syncDir(w.s.dir)
	return size, nil
}

// Abort discards the snapshot being written.
func (w *Writer) Abort() {
	if w.f != nil {
		w.f.Close()
		os.Remove(w.f.Name())
		w.f = nil
	}
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}

// ErrDiskFull is a write that found the state directory's disk full.
var ErrDiskFull = errors.New("the disk holding the state directory is full")

func diskError(err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		// Not the error's text: it names the host's path, which the
		// agent that reads this need not learn.
		return ErrDiskFull
	}
	return err
}

// Snapshot is a verified snapshot open for reading.
type Snapshot struct {
	Meta Meta
	Size int64
	f    *os.File
	// offsets of the sections
	globals, files [2]int64
}

// Globals reads the globals section.
func (s *Snapshot) Globals() *io.SectionReader {
	return io.NewSectionReader(s.f, s.globals[0], s.globals[1])
}

// Files reads the files section.
func (s *Snapshot) Files() *io.SectionReader {
	return io.NewSectionReader(s.f, s.files[0], s.files[1])
}

// Close closes the file.
func (s *Snapshot) Close() error { return s.f.Close() }

// trailer reads f's trailer and meta, checking the meta's MAC. It returns
// the meta, its raw bytes and the sections' lengths.
func (s *Store) trailer(f *os.File, id string) (Meta, int64, int64, int64, error) {
	var meta Meta
	st, err := f.Stat()
	if err != nil {
		return meta, 0, 0, 0, fmt.Errorf("snapshot: %w", err)
	}
	size := st.Size()
	if size < int64(len(magic))+trailerLen {
		return meta, 0, 0, 0, fmt.Errorf("%w (it is %d bytes, too short)", ErrTampered, size)
	}
	var tr [trailerLen]byte
	if _, err := f.ReadAt(tr[:], size-trailerLen); err != nil {
		return meta, 0, 0, 0, fmt.Errorf("snapshot: %w", err)
	}
	gl := binary.BigEndian.Uint64(tr[0:])
	fl := binary.BigEndian.Uint64(tr[8:])
	ml := binary.BigEndian.Uint64(tr[16:])
	body := uint64(size) - uint64(len(magic)) - trailerLen
	// Each bounded first, so the sum cannot wrap.
	if gl > body || fl > body || ml > body || gl+fl+ml != body || ml > maxMeta {
		return meta, 0, 0, 0, fmt.Errorf("%w (its sections do not add up)", ErrTampered)
	}
	mj := make([]byte, ml)
	if _, err := f.ReadAt(mj, int64(len(magic))+int64(gl+fl)); err != nil {
		return meta, 0, 0, 0, fmt.Errorf("snapshot: %w", err)
	}
	if !hmac.Equal(tr[24:24+sha256.Size], s.metaMAC(mj)) {
		return meta, 0, 0, 0, ErrTampered
	}
	if err := json.Unmarshal(mj, &meta); err != nil {
		return meta, 0, 0, 0, fmt.Errorf("%w (its description does not parse: %v)", ErrTampered, err)
	}
	// A genuine snapshot renamed to another session's name.
	if meta.ID != id {
		return meta, 0, 0, 0, fmt.Errorf("%w (it belongs to another session)", ErrTampered)
	}
	return meta, int64(gl), int64(fl), size, nil
}

// verify checks f, id's snapshot, whole: its description's HMAC (trailer),
// then every byte under the file's HMAC. It returns what trailer does.
func (s *Store) verify(f *os.File, id string) (Meta, int64, int64, int64, error) {
	meta, gl, fl, size, err := s.trailer(f, id)
	if err != nil {
		return meta, 0, 0, 0, err
	}
	mac := hmac.New(sha256.New, s.key)
	mac.Write([]byte(fileDomain))
	if _, err := io.Copy(mac, io.NewSectionReader(f, 0, size-sha256.Size)); err != nil {
		return meta, 0, 0, 0, fmt.Errorf("snapshot: %w", err)
	}
	var sum [sha256.Size]byte
	if _, err := f.ReadAt(sum[:], size-sha256.Size); err != nil {
		return meta, 0, 0, 0, fmt.Errorf("snapshot: %w", err)
	}
	if !hmac.Equal(sum[:], mac.Sum(nil)) {
		return meta, 0, 0, 0, ErrTampered
	}
	return meta, gl, fl, size, nil
}

// Open verifies id's snapshot whole (every byte under the HMAC) and opens
// it. The caller checks Meta.Owner.
func (s *Store) Open(id string) (*Snapshot, error) {
	if !ValidID(id) {
		return nil, ErrNotFound
	}
	f, err := openSnapshot(s.path(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	meta, gl, fl, size, err := s.verify(f, id)
	if err != nil {
		f.Close()
		return nil, err
	}
	off := int64(len(magic))
	return &Snapshot{Meta: meta, Size: size, f: f, globals: [2]int64{off, gl}, files: [2]int64{off + gl, fl}}, nil
}

// openSnapshot opens a snapshot file for reading: not through a symbolic
// link, without blocking (a FIFO planted under a snapshot's name would
// hang the open, and with it the server's start), and only a regular
// file with one name. A missing file is os.ErrNotExist.
func openSnapshot(path string) (*os.File, error) {
	fd, _, err := openRegular(unix.AT_FDCWD, path, unix.O_RDONLY)
	var nr *notRegularError
	switch {
	case err == unix.ENOENT:
		return nil, os.ErrNotExist
	case errors.As(err, &nr):
		return nil, fmt.Errorf("%w (not a regular file with one name)", ErrTampered)
	case err == unix.ELOOP || err == unix.EMLINK || err == unix.ENOTDIR:
		// A symbolic link at the name, or something other than a
		// directory on the way to it: planted.
		return nil, fmt.Errorf("%w (%s: %v)", ErrTampered, filepath.Base(path), os.NewSyscallError("open", err))
	case errors.As(err, new(*os.SyscallError)):
		return nil, fmt.Errorf("snapshot: %w", err)
	case err != nil:
		// Too many open files, a permission, the disk: an error that may
		// pass, not a planted file, so the snapshot is kept (a resume
		// deletes one it is told is tampered with).
		return nil, fmt.Errorf("snapshot: %s: %w", filepath.Base(path), os.NewSyscallError("open", err))
	}
	return os.NewFile(uintptr(fd), path), nil
}

// Stat reads id's meta, checking its HMAC but not the rest.
func (s *Store) Stat(id string) (Info, error) {
	if !ValidID(id) {
		return Info{}, ErrNotFound
	}
	f, err := openSnapshot(s.path(id))
	if errors.Is(err, os.ErrNotExist) {
		return Info{}, ErrNotFound
	}
	if err != nil {
		return Info{}, err
	}
	defer f.Close()
	meta, _, _, size, err := s.trailer(f, id)
	if err != nil {
		return Info{}, err
	}
	st, _ := f.Stat()
	return Info{Meta: meta, Size: size, Modified: st.ModTime()}, nil
}

// List reads the meta of every snapshot in the store. Files that are not
// genuine are returned in bad (name → why), never in infos.
func (s *Store) List() (infos []Info, bad map[string]error) {
	ents, _ := os.ReadDir(s.dir)
	bad = map[string]error{}
	for _, e := range ents {
		name := e.Name()
		id, ok := strings.CutSuffix(name, suffix)
		if !ok || strings.HasPrefix(name, tmpPrefix) {
			continue
		}
		info, err := s.Stat(id)
		if err != nil {
			bad[name] = err
			continue
		}
		infos = append(infos, info)
	}
	return infos, bad
}

// Remove deletes id's snapshot, if any.
func (s *Store) Remove(id string) error {
	if !ValidID(id) {
		return nil
	}
	err := os.Remove(s.path(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// Import stores a snapshot another server with the same key wrote (a
// replica leaving the cluster hands its snapshots over), reading at most
// limit bytes from r. It is verified whole before it is put in place.
func (s *Store) Import(id string, r io.Reader, limit int64) (Info, error) {
	if !ValidID(id) {
		return Info{}, fmt.Errorf("snapshot: %q is not a session id", id)
	}
	f, err := os.CreateTemp(s.dir, tmpPrefix+id+"-*")
	if err != nil {
		return Info{}, fmt.Errorf("snapshot: %w", err)
	}
	name := f.Name()
	fail := func(err error) (Info, error) {
		f.Close()
		os.Remove(name)
		return Info{}, err
	}
	n, err := io.Copy(f, io.LimitReader(r, limit+1))
	if err != nil {
		return fail(fmt.Errorf("snapshot: %w", diskError(err)))
	}
	if n > limit {
		return fail(fmt.Errorf("snapshot: over the size limit of %d bytes", limit))
	}
	if err := f.Sync(); err != nil {
		return fail(fmt.Errorf("snapshot: %w", diskError(err)))
	}
	// The whole file, as Open checks it.
	meta, _, _, size, err := s.verify(f, id)
	if err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		os.Remove(name)
		return Info{}, fmt.Errorf("snapshot: %w", err)
	}
	if err := os.Rename(name, s.path(id)); err != nil {
		os.Remove(name)
		return Info{}, fmt.Errorf("snapshot: %w", err)
	}
	syncDir(s.dir)
	return Info{Meta: meta, Size: size, Modified: time.Now()}, nil
}

// Export opens id's snapshot file for copying to another server, as it
// is (the receiver verifies it).
func (s *Store) Export(id string) (*os.File, int64, error) {
	if !ValidID(id) {
		return nil, 0, ErrNotFound
	}
	f, err := os.Open(s.path(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil, 0, ErrNotFound
	}
	if err != nil {
		return nil, 0, fmt.Errorf("snapshot: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("snapshot: %w", err)
	}
	return f, st.Size(), nil
}
