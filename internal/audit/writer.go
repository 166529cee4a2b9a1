package audit

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Options configure a Writer.
type Options struct {
	// MaxSize rotates the file before a record would take it past this
	// many bytes. 0 never rotates. A single record larger than MaxSize
	// still goes in, alone after the rotate record of a fresh file.
	MaxSize int64
	// Now is the clock; nil means time.Now. For tests.
	Now func() time.Time
	// SyncEach makes Append return only once its record is on disk
	// (fdatasync). Otherwise Append returns once the record is written to
	// the file, and a background sync follows at once, shared by every
	// record written meanwhile: a server crash loses nothing, a machine
	// crash may lose the last millisecond or so of records. Either way a
	// failed write or sync breaks the Writer (see Append).
	SyncEach bool
}

// Writer appends records to a log file. It is safe for concurrent use.
//
// Only one Writer may have a file open at a time, across processes: two
// would each extend the chain from their own head and fork it. Open takes
// an exclusive flock(2) on the file and refuses one that is already held.
type Writer struct {
	path string
	opts Options

	mu sync.Mutex
	// fileMu keeps f open through a background sync, which holds it
	// shared; rotate and Close hold it to close f (after mu). The sync
	// then never holds mu: appends go on while the disk syncs.
	fileMu sync.RWMutex
	f      *os.File
	size   int64  // bytes in f
	seq    int64  // seq of the last record written, 0 if none
	hash   string // hash of the last record written
	err    error  // set once a write failed or Close was called: no more appends

	// The background sync (without Options.SyncEach): a record written
	// asks for one on syncReq; quit stops the goroutine, done says it has.
	syncReq    chan struct{}
	quit, done chan struct{}
}

var errClosed = errors.New("audit: writer closed")

// Open opens the log at path for appending, creating it (mode 0600) if
// needed. A file that already holds records is continued: its last line
// must be complete and intact, and the next record chains to it. If path
// is empty or missing but rotated siblings path.N exist, the chain
// continues from the newest of them, after a rotate record.
//
// Open never starts a new chain in place of a damaged one: if the last
// line is partial or fails its hash, it returns an error asking for the
// file to be verified and moved aside.
func Open(path string, opts Options) (*Writer, error) {
	if opts.MaxSize < 0 {
		return nil, fmt.Errorf("audit: open %s: negative MaxSize", path)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	f, err := openLocked(path)
	if err != nil {
		return nil, fmt.Errorf("audit: open: %w", err)
	}
	w := &Writer{path: path, opts: opts, f: f}
	if err := w.resume(); err != nil {
		f.Close()
		return nil, err
	}
	if !opts.SyncEach {
		w.syncReq, w.quit, w.done = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
		go w.syncLoop()
	}
	return w, nil
}

// backgroundSync is the background sync's call (a test holds it up).
var backgroundSync = datasync

// syncLoop makes written records durable off the callers' path. One sync
// covers every record written before it starts.
func (w *Writer) syncLoop() {
	defer close(w.done)
	for {
		select {
		case <-w.quit:
			return
		case <-w.syncReq:
		}
		w.mu.Lock()
		broken := w.err != nil
		w.mu.Unlock()
		if broken {
			continue
		}
		w.fileMu.RLock()
		var err error
		if w.f != nil {
			err = backgroundSync(w.f)
		}
		w.fileMu.RUnlock()
		if err != nil {
			w.mu.Lock()
			if w.err == nil {
				w.fail(fmt.Errorf("audit: sync: %w", err))
			}
			w.mu.Unlock()
		}
	}
}

// openLocked opens path for appending and locks it, refusing anything but
// a regular file. The directory is synced so a new file survives a crash.
func openLocked(path string) (*os.File, error) {
	// Not through a symbolic link (a link planted where the log will be
	// would have a root server append to any file), and without blocking
	// on a FIFO; a regular file is checked below.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0o600)
	if errors.Is(err, syscall.ELOOP) {
		return nil, fmt.Errorf("%s is a symbolic link; give the real path of the audit log", path)
	}
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s is in use by another writer (another pysandbox server?); give each server its own audit log", path)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := syncDir(path); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// resume takes the head of the chain from the end of the file, or of its
// newest rotated sibling when the file is empty.
func (w *Writer) resume() error {
	st, err := w.f.Stat()
	if err != nil {
		return fmt.Errorf("audit: open: %w", err)
	}
	w.size = st.Size()
	if w.size > 0 {
		w.seq, w.hash, err = lastRecord(w.path, w.path)
		return err
	}
	nums, err := siblings(w.path)
	if err != nil || len(nums) == 0 {
		return err
	}
	// A rotation was cut short between its rename and its rotate record,
	// or the file was moved away by hand: the chain goes on from the
	// newest sibling, starting with the rotate record that names it.
	prev := w.path + "." + strconv.FormatInt(nums[len(nums)-1], 10)
	if w.seq, w.hash, err = lastRecord(prev, w.path); err != nil {
		return err
	}
	return w.appendRotate(prev, w.opts.Now())
}

// lastRecord returns the seq and hash of the last line of path, which must
// be complete and intact; chain is the log path is part of.
func lastRecord(path, chain string) (int64, string, error) {
	damaged := func(what string) error {
		return fmt.Errorf("audit: open: %s: %s; the chain cannot be continued safely: run 'pysandbox audit verify %s', then move %s aside to start a new log", path, what, chain, path)
	}
	f, err := os.Open(path)
	if err != nil {
		return 0, "", fmt.Errorf("audit: open: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, "", fmt.Errorf("audit: open: %w", err)
	}
	lines, partial, err := readLastLines(f, st.Size(), 1)
	switch {
	case err != nil:
		return 0, "", damaged(err.Error())
	case partial > 0:
		return 0, "", damaged("the last line is incomplete (a write was cut short)")
	case len(lines) == 0:
		return 0, "", damaged("no complete record")
	}
	r, hash, err := parseLine(lines[0])
	if err != nil {
		return 0, "", damaged("last line: " + err.Error())
	}
	return r.Seq, hash, nil
}

// Append writes r as the next record of the chain, filling in r.Seq,
// r.Prev and, when zero, r.Time, and capping r.Error. It returns once the
// line is in the file (one write), and with Options.SyncEach once it is on
// disk; otherwise the sync follows in the background.
//
// If a write or sync fails the Writer is broken: this (or, for a
// background sync, the next) and every later Append return an error, and
// the caller should refuse further calls rather than run them unaudited.
func (w *Writer) Append(r *Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	if r.Time.IsZero() {
		r.Time = w.opts.Now()
	}
	line, err := w.encode(r)
	if err != nil {
		// Nothing was written: the writer is still sound.
		return fmt.Errorf("audit: append: %w", err)
	}
	if w.opts.MaxSize > 0 && w.size > 0 && w.size+int64(len(line)) > w.opts.MaxSize {
		// The rotate record takes the time of the record that caused it,
		// keeping the times in order.
		if err := w.rotate(r.Time); err != nil {
			return w.fail(fmt.Errorf("audit: rotate: %w", err))
		}
		if line, err = w.encode(r); err != nil {
			return fmt.Errorf("audit: append: %w", err)
		}
	}
	return w.write(line, r.Seq)
}

// encode fills in r as the next record and returns its line.
func (w *Writer) encode(r *Record) ([]byte, error) {
	r.Seq, r.Prev = w.seq+1, w.hash
	if r.Time.IsZero() {
		r.Time = w.opts.Now()
	}
	r.Time = r.Time.UTC()
	r.Error = capError(r.Error)
	line, _, err := encodeLine(r)
	return line, err
}

// write writes one line with one write call and syncs it, or has it
// synced (see Options.SyncEach).
func (w *Writer) write(line []byte, seq int64) error {
	if _, err := w.f.Write(line); err != nil {
		return w.fail(fmt.Errorf("audit: write: %w", err))
	}
	// fdatasync, not fsync: it flushes the line and what reading it back
	// needs (the file's new size), and skips the timestamps, which cost a
	// third of the sync on every call.
	if w.syncReq == nil {
		if err := datasync(w.f); err != nil {
			return w.fail(fmt.Errorf("audit: sync: %w", err))
		}
	} else {
		select {
		case w.syncReq <- struct{}{}:
		default: // one is due already, and will cover this line
		}
	}
	w.size += int64(len(line))
	w.seq = seq
	// The hash is the part of the line before the closing `"}\n`.
	w.hash = string(line[len(line)-3-hashLen : len(line)-3])
	return nil
}

// fail breaks the writer: after a failed write the file may end in part
// of a line, and after a failed sync we no longer know what is on disk.
func (w *Writer) fail(err error) error {
	w.err = fmt.Errorf("%w (the audit log is broken: no more records are accepted)", err)
	return w.err
}

// rotate renames the file to the next free path.N and continues the chain
// in a new file, starting with a rotate record.
func (w *Writer) rotate(now time.Time) error {
	nums, err := siblings(w.path)
	if err != nil {
		return err
	}
	next := int64(1)
	if len(nums) > 0 {
		next = nums[len(nums)-1] + 1
	}
	old := w.path + "." + strconv.FormatInt(next, 10)
	// os.Rename replaces silently; we hold the lock, so nobody should be
	// creating rotated files, but never overwrite history.
	if _, err := os.Lstat(old); err == nil {
		return fmt.Errorf("%s already exists", old)
	}
	if err := os.Rename(w.path, old); err != nil {
		return err
	}
	if err := syncDir(w.path); err != nil {
		return err
	}
	// The old file's last records may not be synced yet.
	if err := datasync(w.f); err != nil {
		return err
	}
	w.fileMu.Lock()
	w.f.Close()
	w.f = nil
	w.fileMu.Unlock()
	f, err := openLocked(w.path)
	if err != nil {
		return err
	}
	w.fileMu.Lock()
	w.f, w.size = f, 0
	w.fileMu.Unlock()
	return w.appendRotate(old, now)
}

// appendRotate writes the rotate record that starts a file after prev.
func (w *Writer) appendRotate(prev string, now time.Time) error {
	r := &Record{Event: EventRotate, Time: now, Detail: map[string]string{"previous_file": filepath.Base(prev)}}
	line, err := w.encode(r)
	if err != nil {
		return err
	}
	return w.write(line, r.Seq)
}

// Head returns the seq and hash of the last record written, or of the
// record the chain continues from; 0 and "" before the first.
func (w *Writer) Head() (seq int64, hash string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seq, w.hash
}

// Close syncs and closes the file. Later Appends fail.
func (w *Writer) Close() error {
	if w.quit != nil {
		w.mu.Lock()
		select {
		case <-w.quit:
		default:
			close(w.quit)
		}
		w.mu.Unlock()
		<-w.done
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return nil
	}
	serr := datasync(w.f)
	if serr != nil && w.err == nil {
		w.fail(fmt.Errorf("audit: sync: %w", serr))
	}
	w.fileMu.Lock()
	err := w.f.Close()
	w.f = nil
	w.fileMu.Unlock()
	if err == nil {
		err = serr
	}
	if w.err == nil {
		w.err = errClosed
	}
	if err != nil {
		return fmt.Errorf("audit: close: %w", err)
	}
	return nil
}

// syncDir fsyncs the directory holding path, making a create or rename in
// it durable.
func syncDir(path string) error {
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", filepath.Dir(path), err)
	}
	return nil
}
