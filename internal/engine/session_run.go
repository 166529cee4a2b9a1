package engine

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/pysandbox/pysandbox/internal/sandbox"
	"github.com/pysandbox/pysandbox/internal/tracing"
)

// Run runs code in a session: globals, imports and files persist. Calls on
// one session are serialised.
func (s *Sessions) Run(ctx context.Context, id string, req RunRequest) (*Result, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	if req.Gate != nil {
		// A session's worker has run the caller's code, which can change
		// the facts it reports: a gated call's facts must come from a
		// sandbox no code ran in. Its caller should have had the facts
		// derived apart (as a session's run has) and passed no gate.
		return nil, errors.New("engine: a run gated on its code's facts cannot run in a session: its worker has run the caller's code, so its facts cannot be trusted")
	}
	sess, err := s.get(id)
	if err != nil {
		return nil, err
	}
	// A session keeps the interpreter it was created with: a run that
	// names another is told so rather than quietly run on it.
	if v := req.PythonVersion; v != "" && sess.renv != nil && sess.renv.py != nil {
		if py := sess.renv.py; py.MajorMinor() != v && py.Version != v {
			return nil, &RequestError{Msg: fmt.Sprintf("session %s runs Python %s; python_version %.40q applies to a new session (create_session) or a run without session_id", id, py.Version, v)}
		}
	}
	if err := sess.runMu.LockCtx(ctx); err != nil {
		// Cancelled while another run had the session: nothing ran.
		return &Result{Status: StatusCancelled, ExitCode: -1, Sandbox: string(s.e.cfg.Backend.Kind()),
			Message: "the call was cancelled while it waited for the session's previous run to end; nothing ran, and the session and its state are kept"}, nil
	}
	defer sess.runMu.Unlock()
	sess.mu.Lock()
	dead := sess.dead
	sess.mu.Unlock()
	if dead == pausedWhy {
		// Paused while this call waited for its turn: nothing is lost,
		// and the caller resumes it.
		return nil, &PausedError{ID: id, owner: sess.Owner}
	}
	if dead != "" {
		return nil, &SessionGoneError{ID: id, Why: dead}
	}
	sess.touch()
	defer sess.touch()
	cpuBefore := sessionCPU(sess)
	observeUsage(ctx, sess.sb, cpuBefore)
	_, rspan := tracing.Tracer().Start(ctx, "run", trace.WithAttributes(attribute.String("pysandbox.session", id)))
	defer rspan.End()
	// Between runs the session's processes get a thousandth of a CPU:
	// background threads and processes it started do next to nothing until
	// its next run (and, unlike frozen ones, still die at once if killed).
	s.idle(sess, false)

	rs := s.e.newRun(req)
	timeout := rs.timeout
	sess.out.begin(rs.stdout)
	sess.errs.begin(rs.stderr)
	defer sess.out.begin(nil)
	defer sess.errs.begin(nil)

	// At the deadline (or on cancellation) the run is interrupted with
	// SIGINT, which keeps the session and its state; a worker that does not
	// answer within the grace period is killed, and the session with it.
	const grace = 3 * time.Second
	interrupted := make(chan string, 1)
	// Every interrupt of this run goes through interrupt, which sends
	// nothing once the run is over: a SIGINT meant for this run must not
	// reach the worker after its answer, where code of the caller's own
	// (a SIGINT handler, a stream's flush) could take it, nor the next
	// run.
	var intMu sync.Mutex
	runOver := false
	interrupt := func() {
		intMu.Lock()
		defer intMu.Unlock()
		if !runOver {
			sess.sb.(sandbox.Sessioner).Interrupt()
		}
	}
	defer func() {
		intMu.Lock()
		runOver = true
		intMu.Unlock()
	}()
	handedAt := time.Now() // as near as this side knows, when the worker has the run
	// The run's tool calls end when the run is interrupted, not when the
	// worker finally answers: an upstream call is cancelled at the
	// timeout (its cause says so).
	toolsCtx, stopTools := context.WithCancelCause(ctx)
	defer stopTools(context.Canceled)
	callCtx, cancel := context.WithTimeout(context.Background(), timeout+grace)
	defer cancel()
	timer := time.AfterFunc(timeout, func() {
		select {
		case interrupted <- "timeout":
		default:
		}
		stopTools(context.DeadlineExceeded)
		interrupt()
	})
	defer timer.Stop()
	// A cancellation that comes as the run is handed to the worker finds
	// it not yet interruptible, and the worker ignores the signal (as it
	// must one meant for a run that has just ended); the grace period then
	// killed the session. So while the run is young the interrupt is sent
	// again; only then, since a run that has long started took the first
	// one, and more would cut short the code's own cleanup (a finally, an
	// except KeyboardInterrupt), as a timeout's single interrupt does not.
	reinterrupted := make(chan struct{})
	stopCancel := context.AfterFunc(ctx, func() {
		defer close(reinterrupted)
		select {
		case interrupted <- "cancelled":
		default:
		}
		interrupt()
		t := time.NewTicker(reinterruptEvery)
		defer t.Stop()
		for time.Since(handedAt) < reinterruptFor {
			select {
			case <-callCtx.Done():
				return
			case <-t.C:
				interrupt()
			}
		}
	})
	defer func() {
		if !stopCancel() {
			cancel()
			<-reinterrupted
		}
	}()
	// An output flood is interrupted, as a one-shot run's is stopped. Code
	// that ignores the interrupt is killed after the grace period, and the
	// session with it.
	rs.onFlood(func() {
		select {
		case interrupted <- "output":
		default:
		}
		stopTools(context.Canceled)
		interrupt()
		time.AfterFunc(grace, cancel)
	})
	go func() {
		select {
		case <-ctx.Done():
			// After a cancellation the worker gets the same grace period.
			select {
			case <-time.After(grace):
				cancel()
			case <-callCtx.Done():
			}
		case <-callCtx.Done():
		}
	}()

	// Each run has its own name, so a traceback through a function defined
	// in an earlier run shows that run's lines.
	filename := req.Filename
	if filename == "" {
		sess.mu.Lock()
		filename = fmt.Sprintf("<cell %d>", sess.runs+1)
		sess.mu.Unlock()
	}
	wreq := rs.workerRequest(filename)
	wreq.ToolsCtx = toolsCtx
	res, runErr := sess.conn.Run(callCtx, wreq)
	var why string
	select {
	case why = <-interrupted:
	default:
	}
	if runErr == nil {
		s.syncOutput(sess)
		s.idle(sess, true)
	}
	sess.mu.Lock()
	sess.runs++
	sess.mu.Unlock()

	var exit sandbox.Exit
	if runErr != nil {
		// The worker died, or would not stop: the session ends here.
		sess.sb.Kill()
		exit = sess.sb.Wait()
	}
	// A SIGINT that raced with the run's normal end interrupted nothing.
	interruptedRun := res != nil && res.Error != nil && res.Error.Type == "KeyboardInterrupt"
	// Cancelled, but the code ran to its end (it finished first, or caught
	// the interrupt): its result is what happened, not a kill.
	completed := why == "cancelled" && runErr == nil && res != nil && !interruptedRun
	fctx := ctx
	if completed {
		fctx = context.WithoutCancel(ctx)
	}
	r := rs.finish(fctx, callCtx, res, runErr, exit)
	if completed {
		r.Message = JoinMessage(r.Message, "the call was cancelled, but the run had already gone to its end (or caught the interrupt): this is its result, and what it did in the session is kept")
	}
	if d := sessionCPU(sess) - cpuBefore; d > 0 {
		// The session's cgroup outlives the run: its CPU time is the
		// difference (including what its background work did meanwhile).
		r.CPUTimeMS = d.Milliseconds()
	}
	switch {
	case why == "timeout" && interruptedRun:
		r.Status, r.ExitCode = StatusTimeout, -1
		r.Message = fmt.Sprintf("the run exceeded its %s timeout and was interrupted (KeyboardInterrupt); the session and its state are kept", timeout)
	case why == "cancelled" && interruptedRun:
		r.Status, r.ExitCode = StatusCancelled, -1
		r.Message = "the run was cancelled and interrupted (KeyboardInterrupt); the session and its state are kept"
	case why == "output" && runErr == nil:
		r.Status, r.Flooded = StatusOutputLimit, true
		r.Message = fmt.Sprintf("the run printed more than %d bytes and was interrupted (KeyboardInterrupt); the session and its state are kept. Print less, or write large results to a file", rs.flood)
	case runErr != nil:
		whyDead := describeExit(exit, s.e.cfg.Limits.MemoryBytes)
		switch {
		case why == "timeout":
			r.Status, r.ExitCode = StatusTimeout, -1
			whyDead = fmt.Sprintf("it did not stop within %s of its %s timeout and was killed", grace, timeout)
		case why == "cancelled":
			r.Status, r.ExitCode = StatusCancelled, -1
			whyDead = "the run was cancelled and the worker did not stop, so it was killed"
		case why == "output":
			r.Status, r.ExitCode, r.Flooded = StatusOutputLimit, -1, true
			whyDead = fmt.Sprintf("the run printed more than %d bytes and did not stop when interrupted, so it was killed", rs.flood)
		}
		r.Message = "the session has ended: " + whyDead + "; its state is lost. Create a new session with create_session"
		sess.mu.Lock()
		sess.dead = whyDead
		sess.mu.Unlock()
		// Ended before the caller has the answer: a call that follows it
		// (close_session) must find the session ended, not close it as a
		// live one (CI saw that on a busy machine). The teardown stays
		// off the caller's path.
		s.unlist(sess, whyDead)
		go s.release(sess)
	}
	// Flooded after another stop came first (a timeout whose interrupt
	// the code caught): stopped all the same, whatever else it says.
	if rs.flooded.Load() && !r.Flooded && (r.Status == StatusSuccess || r.Status == StatusOutputLimit || r.Status == StatusError) {
		r.Status, r.Flooded = StatusOutputLimit, true
		r.Message = JoinMessage(r.Message, fmt.Sprintf("the run printed more than %d bytes and was interrupted; the session and its state are kept. Print less, or write large results to a file", rs.flood))
	}
	if runErr == nil && s.cfg.Snapshots.EveryRun && s.cfg.Snapshots.Store != nil {
		// --checkpoint every-run: a crash from now on loses nothing of
		// this run. The run's own context may be ending: the checkpoint
		// has a deadline of its own.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.e.cfg.MaxTimeout+time.Minute)
		if _, err := s.save(cctx, sess, false, true, false); err != nil {
			s.e.log.Warn("session checkpoint failed; the previous one is kept", "session", id, "err", err)
			s.event(SnapshotEvent{Kind: "fail", ID: id, Owner: sess.Owner, Detail: "checkpoint: " + err.Error()})
		}
		cancel()
	}
	return r, nil
}

// syncOutput waits until every byte the run wrote to stdout and stderr has
// been read: the worker writes a marker after flushing, and the routers
// stop at it.
func (s *Sessions) syncOutput(sess *Session) {
	var b [16]byte
	rand.Read(b[:])
	marker := "pysandbox-sync-" + hex.EncodeToString(b[:])
	o, e := sess.out.expect(marker), sess.errs.expect(marker)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := sess.conn.Sync(ctx, marker); err != nil {
		return
	}
	for _, c := range []<-chan struct{}{o, e} {
		select {
		case <-c:
		case <-ctx.Done():
			return
		}
	}
}

// router sends a session's output stream to the current run's capture and,
// once asked, stops at a marker the worker writes after the run's output.
// Output between runs (from threads or processes the code left running)
// is dropped.
type router struct {
	mu      sync.Mutex
	dst     io.Writer
	marker  []byte
	pending []byte
	seen    chan struct{}
}

func newRouter() *router { return &router{} }

func (r *router) begin(dst io.Writer) {
	r.mu.Lock()
	r.dst, r.marker, r.pending, r.seen = dst, nil, nil, nil
	r.mu.Unlock()
}

func (r *router) expect(marker string) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.marker, r.pending = []byte(marker), nil
	r.seen = make(chan struct{})
	return r.seen
}

func (r *router) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dst == nil {
		return len(p), nil
	}
	if r.marker == nil {
		r.dst.Write(p)
		return len(p), nil
	}
	r.pending = append(r.pending, p...)
	if i := bytes.Index(r.pending, r.marker); i >= 0 {
		r.dst.Write(r.pending[:i])
		r.dst, r.marker, r.pending = nil, nil, nil
		close(r.seen)
		return len(p), nil
	}
	// Keep only what could still be the start of the marker.
	if keep := len(r.marker) - 1; len(r.pending) > keep {
		r.dst.Write(r.pending[:len(r.pending)-keep])
		r.pending = append(r.pending[:0], r.pending[len(r.pending)-keep:]...)
	}
	return len(p), nil
}

// reinterruptEvery and reinterruptFor: a cancelled run's interrupt is
// sent again every reinterruptEvery until the run is reinterruptFor old
// (see Run).
const (
	reinterruptEvery = 20 * time.Millisecond
	reinterruptFor   = 250 * time.Millisecond
)

// idle holds a session's processes to a thousandth of a CPU, or gives
// them back their quota (see sandbox.Sessioner). Without a CPU cgroup (an
// unprivileged server without delegation) nothing happens: a session's
// background work then runs between runs, bounded by RLIMIT_CPU.
func (s *Sessions) idle(sess *Session, idle bool) {
	ssr, ok := sess.sb.(sandbox.Sessioner)
	if !ok {
		return
	}
	if err := ssr.Idle(idle); err != nil && !errors.Is(err, sandbox.ErrNoCPUControl) {
		s.e.log.Warn("session: idle quota", "session", sess.ID, "idle", idle, "err", err)
	}
}

// sessionCPU is the CPU time a session's cgroup has used so far.
func sessionCPU(sess *Session) time.Duration {
	if c, ok := sess.sb.(interface{ CPUUsage() time.Duration }); ok {
		return c.CPUUsage()
	}
	return 0
}
