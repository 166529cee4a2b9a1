package engine

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/pysandbox/pysandbox/internal/sandbox"
	"github.com/pysandbox/pysandbox/internal/worker"
	"golang.org/x/sys/unix"
)

// maxReturnBytes bounds the JSON of a run's return value.
const maxReturnBytes = 64 << 10

// runState is one run of code in progress, in a fresh sandbox (Run) or in
// a session (Sessions.Run): what the two share. It holds the run's output
// as it streams (head and tail kept, a flood stopped), asks the worker
// for the run, and makes the Result of how it ended.
type runState struct {
	e       *Engine
	req     RunRequest
	start   time.Time
	timeout time.Duration
	stdout  *capture
	stderr  *capture
	// flood is the output past which the run is stopped, far beyond what
	// is kept; flooded says it was.
	flood   int64
	flooded atomic.Bool
}

// newRun starts the clock of a run of req, which has been validated.
func (e *Engine) newRun(req RunRequest) *runState {
	return &runState{
		e:       e,
		req:     req,
		start:   time.Now(),
		timeout: e.timeout(req.Timeout),
		stdout:  newCapture(e.cfg.MaxOutput, req.Stdout),
		stderr:  newCapture(e.cfg.MaxOutput, req.Stderr),
		flood:   int64(e.cfg.MaxOutput) * 16,
	}
}

// onFlood calls stop when the run's output goes past rs.flood: the server
// copies every byte, so a flood would otherwise cost it CPU until the
// timeout, and the head and tail are kept already.
func (rs *runState) onFlood(stop func()) {
	for _, c := range []*capture{rs.stdout, rs.stderr} {
		c.mu.Lock()
		c.limit, c.onOverflow = rs.flood, func() { rs.flooded.Store(true); stop() }
		c.mu.Unlock()
	}
}

// workerRequest is what the worker is asked to run.
func (rs *runState) workerRequest(filename string) worker.Request {
	return worker.Request{
		Code:           rs.req.Code,
		Inputs:         rs.req.Inputs,
		Filename:       filename,
		Args:           rs.req.Args,
		MaxReturnBytes: maxReturnBytes,
		MaxFigureBytes: rs.e.cfg.MaxFigureBytes,
		Tools:          rs.req.Tools,
		Gate:           rs.req.Gate,
	}
}

// finish makes the run's Result from how its worker and its sandbox
// ended, and its output. It classifies the run: The order matters: a cancelled or timed-out
// run is reported as such even though its worker then died of SIGKILL.
func (rs *runState) finish(ctx, runCtx context.Context, res *worker.Result, runErr error, exit sandbox.Exit) *Result {
	e := rs.e
	r := &Result{
		Sandbox:         string(e.cfg.Backend.Kind()),
		DurationMS:      time.Since(rs.start).Milliseconds(),
		PeakMemoryBytes: exit.PeakMemoryBytes,
		CPUTimeMS:       exit.CPUTime.Milliseconds(),
	}
	r.Stdout, r.StdoutTruncated = rs.stdout.String()
	r.Stderr, r.StderrTruncated = rs.stderr.String()
	r.StdoutBytes, r.StderrBytes = rs.stdout.Total(), rs.stderr.Total()
	switch {
	case ctx.Err() != nil:
		r.Status, r.ExitCode = StatusCancelled, -1
		r.Message = "the run was cancelled and every process it started was killed"
	case res == nil && runCtx.Err() != nil:
		r.Status, r.ExitCode = StatusTimeout, -1
		// In seconds, as timeout_seconds takes it (and as a refusal of too
		// large a value says the maximum).
		r.Message = fmt.Sprintf("the run exceeded its %s timeout and every process it started was killed; make the code faster or pass a larger timeout_seconds (at most %g seconds on this server)", rs.timeout, e.cfg.MaxTimeout.Seconds())
	case exit.OOMKilled || (res != nil && res.Error != nil && res.Error.Type == "MemoryError" && e.nearMemoryLimit(exit)):
		r.Status, r.ExitCode = StatusMemoryLimit, exitCode(res, exit)
		r.Message = fmt.Sprintf("the run exceeded the %d MiB memory limit (files in /tmp and /work count towards it: they are held in memory); use less memory (process data in chunks, delete files you no longer need)", e.cfg.Limits.MemoryBytes>>20)
		if res != nil {
			r.Error = res.Error
		}
	case res == nil && errors.Is(runErr, worker.ErrProtocol):
		// User code wrote to the worker's control channel: whatever it
		// said there was not used.
		r.Status, r.ExitCode = StatusError, exitCode(nil, exit)
		r.Message = fmt.Sprintf("the run wrote something other than its result on the worker's control channel (file descriptor 3), which ended it; nothing it wrote there was used (%v). Do not write to file descriptor 3", clipErr(runErr))
	case res == nil && exit.Signal == 0 && exit.Code > 0:
		// os._exit() or a crash inside the interpreter that still exited.
		r.Status, r.ExitCode = StatusError, exit.Code
		r.Message = fmt.Sprintf("the Python process exited with code %d before the code finished (os._exit?)", exit.Code)
	case res == nil:
		r.Status, r.ExitCode = StatusKilled, exitCode(nil, exit)
		r.Message = "the Python process died before finishing"
		if exit.Signal != 0 {
			r.Message += " (killed by " + signalWords(exit.Signal) + ")"
		}
		if runErr != nil {
			e.log.Debug("worker ended without a result", "err", runErr)
		}
	default:
		r.ExitCode = res.ExitCode
		r.Error = res.Error
		r.ReturnValue = decodeReturn(res.ReturnValue)
		if res.Status == "success" && res.ExitCode == 0 {
			r.Status = StatusSuccess
		} else {
			r.Status = StatusError
		}
	}
	if res != nil {
		r.ReturnText = res.ReturnText
		for _, f := range res.Figures {
			r.Figures = append(r.Figures, Figure{Width: f.Width, Height: f.Height, Bytes: len(f.PNG), TooLarge: f.TooLarge, PNG: f.PNG})
		}
		r.Displays, r.DisplaysOmitted = displaysOf(res.Displays), res.DisplaysOmitted
		r.FiguresOmitted = res.FiguresOmitted
	}
	if r.Status == StatusSuccess && (r.StdoutTruncated || r.StderrTruncated) {
		r.Status = StatusOutputLimit
		r.Message = fmt.Sprintf("the output exceeded %d bytes per stream; its head and tail are kept", e.cfg.MaxOutput)
	}
	return r
}

// signalWords names a signal as people look it up, with what it means:
// "SIGSEGV (signal 11: segmentation fault)". (syscall.Signal's String is
// the description alone, which read as "killed by signal killed".)
func signalWords(sig syscall.Signal) string {
	if name := unix.SignalName(sig); name != "" {
		return fmt.Sprintf("%s (signal %d: %s)", name, int(sig), sig)
	}
	return fmt.Sprintf("signal %d (%s)", int(sig), sig)
}
