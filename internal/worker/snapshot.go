package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	_ "embed"
)

// SnapshotSource is snapshot.py, the worker's side of OpSnapshot and
// OpRestore: place it next to worker.py, named SnapshotFile. A session
// worker loads it on its first snapshot or restore.
//
//go:embed snapshot.py
var SnapshotSource []byte

// SnapshotFile is the name SnapshotSource must have in worker.py's
// directory.
const SnapshotFile = "snapshot.py"

// Session snapshots. Only a session worker (not --oneshot) takes them; a
// one-shot worker answers both requests with OpError (a restore's bytes
// consumed first).
//
// OpSnapshot, {"op":"snapshot","id":ID,"max_bytes":N}: the worker sends
// zero or more OpSnapshotData lines, {"op":"snapshot_data","id":ID,
// "bytes":n}, each followed at once by exactly n raw bytes (1 to
// MaxSnapshotFrameBytes), then one OpSnapshotted line (Snapshotted). The
// raw bytes, concatenated, are the snapshot: a stream only the worker
// reads (snapshot.py describes it), at most max_bytes long. A state that
// does not fit ends with an OpSnapshotted whose too_big is set, and what
// came before it is useless. The worker may also end the exchange with an
// OpError line after some data (an interrupted snapshot, or one that
// failed as a whole): that data is useless too.
//
// OpRestore, {"op":"restore","id":ID,"bytes":N}, followed at once by
// exactly N raw bytes, a stream an OpSnapshot produced: the worker reads
// all N whatever they hold, restores the globals they hold into the
// session's __main__, and answers one OpRestored line (Restored), or an
// OpError when the stream is not a snapshot at all. The workspace's files
// and the session's packages must be in place before (modules written
// there are imported again).
//
// What comes back: every global but those Python and the worker put in
// every session (__name__, __builtins__, __spec__, ...); a user's own
// __version__ or __annotations__ is kept. Modules are imported again by
// name (a workspace module too). Functions and classes defined in the
// session come back by value (code by marshal, with the source of their
// cell, so that tracebacks show it and another Python version compiles it
// again), instances of them refer to the same class, and a global bound
// to the session's globals() is that dict again. Objects shared between
// globals stay shared, except across a global that could not be saved,
// or one larger than 16 MiB: then they become copies. Everything else is
// pickled (protocol 5: an array's memory is sent from where it is, and
// read into place, without a second copy on either side). What cannot be
// saved (open files, sockets, locks, threads, generators, objects whose
// pickling fails or recurses too deeply) is listed with why, and nothing
// of it is restored. Not kept: caches (an lru_cache comes back empty),
// enum members' own attributes, registrations __init_subclass__ made
// (they are made again), ABC virtual subclasses.
//
// SIGINT interrupts either, as it does a run: a snapshot ends with an
// OpError, a restore with the names left listed as failed. Neither leaves
// the stream out of step.
//
// User code runs during both (__reduce__, __setstate__, imports) and can
// write on the control channel: the Go side bounds every message
// (MaxSnapshotFrameBytes, max_bytes, MaxSnapshotNames,
// MaxSnapshotNameBytes, MaxSnapshotReasonBytes) and ends the exchange as
// a protocol violation past them. Tool messages during either are refused
// (ToolFailCancelled), as during any exchange but a run's.
const (
	OpSnapshot     = "snapshot"      // Go → worker: save the globals (Request.MaxBytes)
	OpSnapshotData = "snapshot_data" // worker → Go: raw bytes of the stream follow the line
	OpSnapshotted  = "snapshotted"   // worker → Go: the snapshot's end (Snapshotted)
	OpRestore      = "restore"       // Go → worker: Request.Bytes raw bytes follow the line
	OpRestored     = "restored"      // worker → Go: the restore's outcome (Restored)
)

// Bounds on the snapshot messages from the worker.
const (
	// MaxSnapshotFrameBytes bounds the raw bytes of one OpSnapshotData.
	MaxSnapshotFrameBytes = 1 << 20
	// MaxSnapshotNames bounds the names of one reply, listed and failed
	// together.
	MaxSnapshotNames = 100_000
	// MaxSnapshotNameBytes bounds one name; the worker does not save a
	// global with a longer one (it is listed unsaveable, shortened).
	MaxSnapshotNameBytes = 1024
	// MaxSnapshotReasonBytes bounds one reason.
	MaxSnapshotReasonBytes = 2048
)

// Unsaveable is a global that a snapshot could not save, or a restore
// could not restore, and why (e.g. "TextIOWrapper: cannot pickle
// '_io.TextIOWrapper' object"). A failed restore with an empty Name means
// the stream could not be read from that point on.
type Unsaveable struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// Snapshotted is what a snapshot saved.
type Snapshotted struct {
	// Saved are the globals in the stream, Unsaveable those left out.
	// When the namespace has more names than MaxSnapshotNames, the last
	// Unsaveable, named "…", counts the names beyond it.
	Saved      []string
	Unsaveable []Unsaveable
	// TooBig is set when the state did not fit in maxBytes: the stream
	// written is then useless.
	TooBig bool
	// Bytes is the stream's length.
	Bytes int64
}

// Restored is what a restore restored.
type Restored struct {
	Restored []string
	Failed   []Unsaveable
}

// snapshotReply is the worker's OpSnapshotted and OpRestored.
type snapshotReply struct {
	Op         string       `json:"op"`
	ID         string       `json:"id"`
	Saved      []string     `json:"saved"`
	Unsaveable []Unsaveable `json:"unsaveable"`
	TooBig     bool         `json:"too_big"`
	Restored   []string     `json:"restored"`
	Failed     []Unsaveable `json:"failed"`
}

// checkNames rejects lists no well-behaved worker sends.
func checkNames(names []string, failed []Unsaveable) error {
	if len(names)+len(failed) > MaxSnapshotNames {
		return fmt.Errorf("worker: %d names (the bound is %d)", len(names)+len(failed), MaxSnapshotNames)
	}
	for _, n := range names {
		if len(n) > MaxSnapshotNameBytes {
			return fmt.Errorf("worker: a name of %d bytes (the bound is %d)", len(n), MaxSnapshotNameBytes)
		}
	}
	for _, f := range failed {
		if len(f.Name) > MaxSnapshotNameBytes || len(f.Reason) > MaxSnapshotReasonBytes {
			return fmt.Errorf("worker: a name of %d bytes with a reason of %d (the bounds are %d and %d)", len(f.Name), len(f.Reason), MaxSnapshotNameBytes, MaxSnapshotReasonBytes)
		}
	}
	return nil
}

// Snapshot streams the session's saved globals to w, at most maxBytes
// of them (see OpSnapshot). With TooBig set in the result, what was
// written to w is useless; so it is after any error.
//
// A write error from w (a full disk) does not stop the exchange: the rest
// of the stream is read and dropped, and Snapshot returns that error with
// the Conn still usable. Like every call, a cancelled ctx or a message
// out of bounds makes the Conn unusable.
func (c *Conn) Snapshot(ctx context.Context, w io.Writer, maxBytes int64) (*Snapshotted, error) {
	if maxBytes <= 0 {
		return nil, fmt.Errorf("worker: snapshot bound of %d bytes: it must be positive", maxBytes)
	}
	var total int64
	var werr error
	var buf []byte
	data := func(line []byte) error {
		var h struct {
			Bytes *int64 `json:"bytes"`
		}
		if err := json.Unmarshal(line, &h); err != nil || h.Bytes == nil {
			return violationError{fmt.Errorf("worker: bad %s message: %s", OpSnapshotData, clip(string(line)))}
		}
		n := *h.Bytes
		if n < 1 || n > MaxSnapshotFrameBytes {
			return violationError{fmt.Errorf("worker: %s of %d bytes (the bounds are 1 and %d)", OpSnapshotData, n, MaxSnapshotFrameBytes)}
		}
		if n > maxBytes-total {
			return violationError{fmt.Errorf("worker: a snapshot of more than %d bytes, its bound", maxBytes)}
		}
		total += n
		if buf == nil {
			buf = make([]byte, min(maxBytes, 64<<10))
		}
		for n > 0 {
			k := min(n, int64(len(buf)))
			if _, err := io.ReadFull(c.r, buf[:k]); err != nil {
				if errors.Is(err, io.EOF) {
					err = io.ErrUnexpectedEOF
				}
				return fmt.Errorf("worker: read snapshot data: %w", err)
			}
			if werr == nil {
				if _, err := w.Write(buf[:k]); err != nil {
					// Read on, in step: the worker cannot be told to stop.
					werr = err
				}
			}
			n -= k
		}
		return nil
	}
	var rep snapshotReply
	req := Request{Op: OpSnapshot, MaxBytes: maxBytes}
	check := func() error { return checkNames(rep.Saved, rep.Unsaveable) }
	if err := c.exchange(ctx, &req, OpSnapshotted, &rep, exchangeOpts{check: check, data: data}); err != nil {
		return nil, err
	}
	if werr != nil {
		return nil, fmt.Errorf("worker: write the snapshot: %w", werr)
	}
	return &Snapshotted{Saved: rep.Saved, Unsaveable: rep.Unsaveable, TooBig: rep.TooBig, Bytes: total}, nil
}

// Restore sends n bytes of a snapshot stream read from r and restores
// them into the session (see OpRestore).
//
// When r fails or ends before n bytes, the rest is sent as zeros, so that
// the worker reads exactly n and the stream stays in step: Restore then
// returns r's error, the Conn still usable, and the session may hold some
// of the snapshot's globals. Any other failure of the exchange makes the
// Conn unusable, as for every call.
func (c *Conn) Restore(ctx context.Context, r io.Reader, n int64) (*Restored, error) {
	if n <= 0 {
		return nil, fmt.Errorf("worker: a snapshot of %d bytes cannot be restored", n)
	}
	body := func() error {
		buf := make([]byte, min(n, 256<<10))
		var rerr error
		for left := n; left > 0; {
			k := min(left, int64(len(buf)))
			if rerr == nil {
				var got int
				got, rerr = io.ReadFull(r, buf[:k])
				clear(buf[got:k])
			} else {
				clear(buf[:k])
			}
			if _, err := c.conn.Write(buf[:k]); err != nil {
				return err
			}
			left -= k
		}
		if rerr != nil {
			if errors.Is(rerr, io.EOF) {
				rerr = io.ErrUnexpectedEOF
			}
			return bodyError{fmt.Errorf("worker: read the snapshot to restore: %w", rerr)}
		}
		return nil
	}
	var rep snapshotReply
	req := Request{Op: OpRestore, Bytes: n}
	check := func() error { return checkNames(rep.Restored, rep.Failed) }
	if err := c.exchange(ctx, &req, OpRestored, &rep, exchangeOpts{check: check, body: body}); err != nil {
		return nil, err
	}
	return &Restored{Restored: rep.Restored, Failed: rep.Failed}, nil
}
