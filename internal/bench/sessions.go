package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/snapshot"
)

// sessionState is what the snapshot measurement's session holds: a
// 100 MB pandas DataFrame and 1 000 small objects.
const sessionState = `
import numpy as np, pandas as pd
rows = 3_276_800  # 4 float64 columns: 100 MiB
df = pd.DataFrame({c: np.random.default_rng(1).random(rows) for c in "abcd"})
small = [{"i": i, "name": "item%d" % i, "tags": ["x", "y"]} for i in range(1000)]
`

// pickleDirect times what the snapshot does, done by hand in the same
// session: pickle.dump of the DataFrame and the small objects to a file in
// its workspace, then pickle.load of it.
const pickleDirect = `
import pickle, time, os
t0 = time.perf_counter()
with open("/work/direct.pkl", "wb") as f:
    pickle.dump((df, small), f, protocol=5)
t1 = time.perf_counter()
with open("/work/direct.pkl", "rb") as f:
    pickle.load(f)
t2 = time.perf_counter()
size = os.path.getsize("/work/direct.pkl")
os.remove("/work/direct.pkl")
print("%d %d %d" % ((t1 - t0) * 1e6, (t2 - t1) * 1e6, size))
`

// hostDump is pickle.dump of the same objects by a python3 on the host,
// to a file on the state directory's disk, fsynced as a snapshot is.
const hostDump = sessionState + `
import pickle, time, os, sys
t0 = time.perf_counter()
with open(sys.argv[1], "wb") as f:
    pickle.dump((df, small), f, protocol=5)
    f.flush()
    os.fsync(f.fileno())
print(int((time.perf_counter() - t0) * 1e6))
`

// hostLoad is a fresh python3 loading that file: the interpreter's start
// and the imports pickle.load makes (numpy, pandas) included, as a resume
// starts a new interpreter.
const hostLoad = `
import pickle, sys
with open(sys.argv[1], "rb") as f:
    pickle.load(f)
`

// sessionSnapshots measures pause and resume of a session holding a
// 100 MB DataFrame and 1 000 small objects, beside pickle.dump and
// pickle.load of the same objects in the same session; then a trivial
// session call with --checkpoint every-run, as a ratio to the call
// without.
func sessionSnapshots(ctx context.Context, cfg Config) error {
	if exec.Command(cfg.Baseline, "-c", "import pandas").Run() != nil {
		return fmt.Errorf("bench --sessions needs pandas for %s (apt-get install python3-pandas)", cfg.Baseline)
	}
	state, err := os.MkdirTemp("", "pysandbox-bench-state-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(state)
	store, err := snapshot.Open(state, make([]byte, 32))
	if err != nil {
		return err
	}
	// Room for the DataFrame, its pickle and the direct baseline's file.
	eng, err := cfg.Engine(ctx, Variant{MemoryBytes: 1 << 30, TmpBytes: 512 << 20})
	if err != nil {
		return err
	}
	defer eng.Release()
	rounds := max(cfg.N/10, 3)
	var pause, resume, dump, load, hdump, hload []time.Duration
	var snapBytes, pickleBytes int64
	{
		ss := eng.NewSessions(engine.SessionConfig{MaxSessions: 2, MemoryBudget: 2 << 30, Snapshots: engine.SnapshotConfig{Store: store, MaxBytes: 1 << 30, OwnerBytes: 1 << 30}})
		defer ss.Shutdown()
		info, err := ss.Create(ctx, 0, engine.CreateOptions{Owner: "bench"})
		if err != nil {
			return err
		}
		if err := sessionRun(ctx, ss, info.ID, sessionState, nil); err != nil {
			return err
		}
		for range rounds {
			var out string
			if err := sessionRun(ctx, ss, info.ID, pickleDirect, &out); err != nil {
				return err
			}
			var d, l, size int64
			if _, err := fmt.Sscan(out, &d, &l, &size); err != nil {
				return fmt.Errorf("pickle baseline printed %q", out)
			}
			dump, load, pickleBytes = append(dump, time.Duration(d)*time.Microsecond), append(load, time.Duration(l)*time.Microsecond), size
			t := time.Now()
			res, err := ss.Pause(ctx, info.ID)
			if err != nil {
				return fmt.Errorf("pause: %w", err)
			}
			pause, snapBytes = append(pause, time.Since(t)), res.Bytes
			t = time.Now()
			if _, err := ss.Resume(ctx, info.ID, engine.ResumeOptions{Owner: "bench"}); err != nil {
				return fmt.Errorf("resume: %w", err)
			}
			resume = append(resume, time.Since(t))
			// By hand on the host, to the same disk: dump and fsync, then
			// a fresh interpreter's load.
			file := state + "/direct.pkl"
			outb, err := exec.Command(cfg.Baseline, "-c", hostDump, file).Output()
			if err != nil {
				return fmt.Errorf("host pickle.dump: %w", err)
			}
			var us int64
			fmt.Sscan(string(outb), &us)
			hdump = append(hdump, time.Duration(us)*time.Microsecond)
			t = time.Now()
			if err := exec.Command(cfg.Baseline, "-c", hostLoad, file).Run(); err != nil {
				return fmt.Errorf("host pickle.load: %w", err)
			}
			hload = append(hload, time.Since(t))
			os.Remove(file)
		}
		var out string
		if err := sessionRun(ctx, ss, info.ID, "print(len(df), len(small))", &out); err != nil || strings.TrimSpace(out) != "3276800 1000" {
			return fmt.Errorf("after the last resume the session printed %q (%v)", out, err)
		}
	}
	// A trivial call, with and without a checkpoint after it, in turn.
	mk := func(every bool) (*engine.Sessions, string, error) {
		ss := eng.NewSessions(engine.SessionConfig{MaxSessions: 2, MemoryBudget: 2 << 30, Snapshots: engine.SnapshotConfig{Store: store, EveryRun: every, MaxBytes: 1 << 30, OwnerBytes: 1 << 30}})
		info, err := ss.Create(ctx, 0, engine.CreateOptions{Owner: "bench-" + fmt.Sprint(every)})
		if err != nil {
			ss.Shutdown()
			return nil, "", err
		}
		return ss, info.ID, nil
	}
	plain, plainID, err := mk(false)
	if err != nil {
		return err
	}
	defer plain.Shutdown()
	every, everyID, err := mk(true)
	if err != nil {
		return err
	}
	defer every.Shutdown()
	withCP, without, err := alternate(cfg.N, func() {}, func() error { return sessionRun(ctx, every, everyID, "x = 1", nil) },
		func() error { return sessionRun(ctx, plain, plainID, "x = 1", nil) })
	if err != nil {
		return err
	}
	for _, l := range [][]time.Duration{pause, resume, dump, load, hdump, hload} {
		slices.Sort(l)
	}
	writeSessions(cfg.Out, sessionFigures{pause, resume, dump, load, hdump, hload, withCP, without}, snapBytes, pickleBytes)
	return nil
}

// sessionRun runs code in a session and fails unless it succeeds; out,
// when set, gets its stdout.
func sessionRun(ctx context.Context, ss *engine.Sessions, id, code string, out *string) error {
	r, err := ss.Run(ctx, id, engine.RunRequest{Code: code, Timeout: 5 * time.Minute})
	if err != nil {
		return err
	}
	if r.Status != engine.StatusSuccess {
		return fmt.Errorf("session run ended %s: %s %s", r.Status, r.Message, r.Stderr)
	}
	if out != nil {
		*out = r.Stdout
	}
	return nil
}

// sessionFigures are the measurements, each sorted.
type sessionFigures struct {
	pause, resume, dump, load, hostDump, hostLoad, withCP, without []time.Duration
}

func writeSessions(w io.Writer, f sessionFigures, snapBytes, pickleBytes int64) {
	p50 := func(d []time.Duration) time.Duration { return pct(d, 50) }
	fmt.Fprintf(w, "session snapshots (a session holding a 100 MiB pandas DataFrame and 1 000 small objects; medians of %d):\n", len(f.pause))
	fmt.Fprintf(w, "  pause_session                      %9s  (a %d MiB snapshot, written to the state directory's disk and fsynced)\n", ms(p50(f.pause)), snapBytes>>20)
	fmt.Fprintf(w, "    pickle.dump in the session        %9s  (%d MiB to /work, a tmpfs, not synced)   pause / it = %.2fx\n", ms(p50(f.dump)), pickleBytes>>20, ratio(p50(f.pause), p50(f.dump)))
	fmt.Fprintf(w, "    pickle.dump + fsync on the host   %9s  (the same disk)                            pause / it = %.2fx\n", ms(p50(f.hostDump)), ratio(p50(f.pause), p50(f.hostDump)))
	fmt.Fprintf(w, "  resume_session                     %9s  (verify, a new sandbox and interpreter, files, variables: numpy and pandas imported again)\n", ms(p50(f.resume)))
	fmt.Fprintf(w, "    pickle.load in the session        %9s  (pandas already imported)                  resume / it = %.2fx\n", ms(p50(f.load)), ratio(p50(f.resume), p50(f.load)))
	fmt.Fprintf(w, "    a fresh python3 on the host: start, import, pickle.load %s                   resume / it = %.2fx\n", ms(p50(f.hostLoad)), ratio(p50(f.resume), p50(f.hostLoad)))
	a, b := pct(f.withCP, 50), pct(f.without, 50)
	fmt.Fprintf(w, "--checkpoint every-run, a trivial session call (medians of %d): %s with, %s without: %.2fx\n", len(f.withCP), ms(a), ms(b), ratio(a, b))
	data, _ := json.Marshal(map[string]any{"pause_ms": p50(f.pause).Milliseconds(), "resume_ms": p50(f.resume).Milliseconds(), "dump_ms": p50(f.dump).Milliseconds(),
		"load_ms": p50(f.load).Milliseconds(), "host_dump_fsync_ms": p50(f.hostDump).Milliseconds(), "host_fresh_load_ms": p50(f.hostLoad).Milliseconds(), "checkpoint_ratio": ratio(a, b)})
	fmt.Fprintf(w, "json: %s\n", data)
}
