package cli

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/pysandbox/pysandbox/internal/audit"
	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/snapshot"
)

// stateFlags are serve's flags for sessions that outlive the server:
// where their snapshots are kept, for how long, and how big they may be.
type stateFlags struct {
	dir           string
	pausedTTL     duration
	checkpoint    string
	maxBytes      size
	identityBytes size
	maxPaused     int
}

func (f *stateFlags) add(fs *flag.FlagSet) {
	f.pausedTTL = duration(7 * 24 * time.Hour)
	f.maxBytes = 1 << 30
	f.identityBytes = 4 << 30
	fs.StringVar(&f.dir, "state-dir", "", "where paused sessions are kept, so that they survive a restart: pause_session, and every session on SIGTERM (or when a stdio client goes away), write their snapshot here, and the next server started with the same directory resumes them when first called; \"none\" keeps nothing (default: $XDG_STATE_HOME/pysandbox, else /var/lib/pysandbox for root, else ~/.local/state/pysandbox)")
	fs.Var(&f.pausedTTL, "paused-ttl", "how long a paused session is kept without being resumed")
	fs.StringVar(&f.checkpoint, "checkpoint", "off", "\"every-run\": also snapshot each session after every run, so that a crash or SIGKILL loses at most the run in flight (it costs the snapshot's time after each run); \"off\": snapshots are taken on pause_session and SIGTERM")
	fs.Var(&f.maxBytes, "max-snapshot", "largest snapshot of one session (its variables and files); a bigger session is not paused and keeps running")
	fs.Var(&f.identityBytes, "max-snapshots-per-caller", "disk all of one caller's snapshots may take together")
	fs.IntVar(&f.maxPaused, "max-paused-per-caller", 16, "paused sessions one caller may have; they hold no memory, only disk, so they count apart from --max-sessions-per-caller")
}

func (f *stateFlags) check() error {
	if f.checkpoint != "off" && f.checkpoint != "every-run" {
		return usageError{fmt.Errorf("--checkpoint %q: want off or every-run", f.checkpoint)}
	}
	if f.pausedTTL <= 0 || f.maxBytes < 1<<20 || f.identityBytes < f.maxBytes || f.maxPaused < 1 {
		return usageError{errors.New("--paused-ttl must be positive, --max-snapshot at least 1MiB, --max-snapshots-per-caller at least --max-snapshot, --max-paused-per-caller at least 1")}
	}
	if f.dir != "" && f.dir != "none" && !filepath.IsAbs(f.dir) {
		return usageError{fmt.Errorf("--state-dir %q: want an absolute path (or none)", f.dir)}
	}
	return nil
}

// stateDir is the state directory in use: the flag's, else the default
// for this user; "" for none.
func (f *stateFlags) stateDir() string {
	switch f.dir {
	case "none":
		return ""
	case "":
		return defaultStateDir()
	}
	return f.dir
}

// defaultStateDir follows the XDG base directories: $XDG_STATE_HOME when
// set (and absolute, as the specification requires), else the system's
// place for root and the user's otherwise.
func defaultStateDir() string {
	if x := os.Getenv("XDG_STATE_HOME"); filepath.IsAbs(x) {
		return filepath.Join(x, "pysandbox")
	}
	if os.Geteuid() == 0 {
		return "/var/lib/pysandbox"
	}
	if home, err := os.UserHomeDir(); err == nil && filepath.IsAbs(home) {
		return filepath.Join(home, ".local", "state", "pysandbox")
	}
	return ""
}

// openState opens the snapshot store for the sessions. The key is the
// replicas' token's when this server is one of several (any replica can
// then take over another's snapshots), else the state directory's own.
// A directory another server holds is not shared: two servers resuming
// the same snapshot would make two sessions of one. This one then keeps
// no snapshots, and says so.
func (s *server) openState() (engine.SnapshotConfig, error) {
	f := s.cfg.State
	cfg := engine.SnapshotConfig{
		PausedTTL: time.Duration(f.pausedTTL), MaxBytes: int64(f.maxBytes), OwnerBytes: int64(f.identityBytes),
		MaxPaused: f.maxPaused, EveryRun: f.checkpoint == "every-run", Events: s.onSessionEvent,
	}
	dir := f.stateDir()
	if dir == "" {
		s.stateNote = "sessions are not kept across restarts (--state-dir none)"
		cfg.Unavailable = "it was started with --state-dir none"
		return cfg, nil
	}
	unlock, holder, err := snapshot.Lock(dir)
	// A second server on the directory (two windows of one client, each
	// with its own server): an instance directory below it, whose
	// snapshots the next server to hold the directory adopts. Replicas
	// each have a directory of their own and hand sessions over instead.
	instance := ""
	if errors.Is(err, snapshot.ErrLocked) && s.rep.cl == nil {
		if sub, unlockSub, ierr := snapshot.LockInstance(dir); ierr == nil {
			instance, unlock, err = sub, unlockSub, nil
		}
	}
	switch {
	case errors.Is(err, snapshot.ErrLocked):
		s.stateNote = fmt.Sprintf("sessions are not kept across restarts: the state directory %s is in use by another pysandbox server%s; give this one its own --state-dir", dir, holder)
		s.log.Warn("state directory in use by another server; sessions will not survive a restart", "dir", dir, "holder", strings.TrimSpace(holder))
		cfg.Unavailable = s.stateNote
		return cfg, nil
	case err != nil:
		if f.dir == "" {
			// The default could not be made (a read-only home): run, and
			// say why nothing is kept.
			s.stateNote = fmt.Sprintf("sessions are not kept across restarts: the default state directory cannot be used (%s); start the server with --state-dir DIR", strings.TrimPrefix(err.Error(), "snapshot: "))
			s.log.Warn("no state directory; sessions will not survive a restart", "err", err)
			cfg.Unavailable = s.stateNote
			return cfg, nil
		}
		return cfg, fmt.Errorf("--state-dir: %w", err)
	}
	s.closers.add(unlock)
	var key []byte
	if s.rep.cl != nil {
		key = snapshot.DeriveKey([]byte(s.rep.token))
	} else if key, err = snapshot.LoadKey(dir); err != nil {
		return cfg, fmt.Errorf("--state-dir: %w", err)
	}
	st, err := snapshot.Open(filepath.Join(cmp.Or(instance, dir), "sessions"), key)
	if err != nil {
		return cfg, fmt.Errorf("--state-dir: %w", err)
	}
	cfg.Store = st
	if s.rep.cl != nil {
		cfg.Replica = s.rep.cl.Self().Name
	}
	s.stateNote = fmt.Sprintf("paused sessions are kept in %s for %s (--checkpoint %s)", st.Dir(), time.Duration(f.pausedTTL), f.checkpoint)
	if instance != "" {
		s.stateNote += fmt.Sprintf("; the state directory %s is in use by another pysandbox server%s, so this one keeps its own below it, which the next server on %s takes over", dir, holder, dir)
		s.log.Info("state directory in use by another server: keeping this one's sessions below it", "dir", dir, "instance", instance, "holder", strings.TrimSpace(holder))
	}
	if s.rep.cl == nil {
		// What other servers on this directory paused, and left.
		if n, err := st.Adopt(dir); err != nil {
			s.log.Warn("state directory: taking over another server's sessions", "dir", dir, "adopted", n, "err", err)
		} else if n > 0 {
			s.log.Info("state directory: took over the paused sessions of other servers on it", "dir", dir, "sessions", n)
		}
	}
	s.log.Info("state directory", "dir", dir, "paused_ttl", time.Duration(f.pausedTTL), "checkpoint", f.checkpoint)
	return cfg, nil
}

// onSessionEvent records what happened to a session's snapshot in the
// audit log, once it is open.
func (s *server) onSessionEvent(e engine.SnapshotEvent) {
	w := s.pyAudit.Load()
	if w == nil {
		return
	}
	who := e.Caller
	if who == "" {
		who = e.Owner
	}
	r := &audit.Record{Event: audit.EventSession, Identity: who, Tool: toolOfEvent(e.Kind), Decision: e.Kind,
		Detail: map[string]string{"session": e.ID, "owner": e.Owner, "bytes": fmt.Sprint(e.Bytes), "saved": fmt.Sprint(e.Saved)}}
	if len(e.Unsaveable) > 0 {
		names := e.Unsaveable
		if len(names) > 50 {
			names = names[:50]
		}
		r.Detail["not_saved"] = fmt.Sprint(names)
	}
	if e.Detail != "" {
		r.Error = e.Detail
		if len(r.Error) > audit.MaxErrorBytes {
			r.Error = r.Error[:audit.MaxErrorBytes]
		}
	}
	if err := w.Append(r); err != nil {
		s.log.Error("audit log: session record", "err", err)
	}
}

func toolOfEvent(kind string) string {
	switch kind {
	case "pause":
		return "pause_session"
	case "resume", "refuse":
		return "resume_session"
	}
	return ""
}

// pauseAll pauses every session before the server stops (SIGTERM), within
// the drain's time.
func (s *server) pauseAll(deadline time.Time) {
	if s.sessions == nil {
		return
	}
	if !s.sessions.CanPause() {
		if n := len(s.sessions.List()); n > 0 {
			s.log.Warn("sessions end with the server", "sessions", n, "why", s.stateNote)
		}
		return
	}
	start := time.Now()
	paused, failed := s.sessions.PauseAll(deadline)
	if paused+failed > 0 {
		s.log.Info("sessions paused for the restart", "paused", paused, "lost", failed, "took", time.Since(start).Round(time.Millisecond))
	}
}
