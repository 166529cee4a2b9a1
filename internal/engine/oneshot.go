package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/pysandbox/pysandbox/internal/sandbox"
	"github.com/pysandbox/pysandbox/internal/tracing"
	"github.com/pysandbox/pysandbox/internal/worker"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// Run runs req in a fresh sandbox and reports what happened. Failures of
// the user's code are a Result; an error means the run could not be made
// at all (busy, invalid request, sandbox failure).
func (e *Engine) Run(ctx context.Context, req RunRequest) (*Result, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	_, qspan := tracing.Tracer().Start(ctx, "queue")
	err := e.acquire(ctx)
	qspan.End()
	if err != nil {
		return nil, err
	}
	// teardown, when set, takes over the rest of the cleanup off the
	// caller's path (see finishEarly). The slot is free at once all the
	// same: the run is over, and a caller's next call must not find the
	// server busy with its last one.
	var teardown []func()
	defer func() {
		e.release()
		if teardown != nil {
			go func() {
				for _, f := range teardown {
					f()
				}
			}()
		}
	}()

	// The clock starts once the run has a slot: its wait in the queue is
	// not the run's.
	rs := e.newRun(req)
	ictx, ispan := tracing.Tracer().Start(ctx, "install", trace.WithAttributes(attribute.Int("pysandbox.dependencies", len(req.Dependencies))))
	renv, err := e.resolve(ictx, req.Code, req.PythonVersion, req.Caller, req.Dependencies, req.Progress)
	ispan.End()
	if err != nil {
		if r, ok := e.installResult(err); ok {
			r.DurationMS = time.Since(rs.start).Milliseconds()
			return r, nil
		}
		return nil, err
	}
	defer func() {
		if teardown == nil {
			renv.close()
		} else {
			teardown = append(teardown, renv.close)
		}
	}()
	// The deadline covers everything from here: sandbox start included.
	runCtx, cancel := context.WithTimeout(ctx, rs.timeout)
	defer cancel()

	spec := e.specFor(renv, true, rs.stdout, rs.stderr)
	spec.Imports = ImportsOf(req.Code)
	sctx, sspan := tracing.Tracer().Start(runCtx, "sandbox.start", trace.WithAttributes(attribute.String("pysandbox.backend", string(e.cfg.Backend.Kind()))))
	sb, err := e.cfg.Backend.Start(sctx, spec)
	sspan.End()
	if err != nil {
		if ctx.Err() != nil || runCtx.Err() != nil {
			return rs.finish(ctx, runCtx, nil, nil, sandbox.Exit{}), nil
		}
		return nil, startError(err)
	}
	defer func() {
		if teardown == nil {
			sb.Close()
		} else {
			teardown = append(teardown, func() { sb.Close() })
		}
	}()
	observeUsage(ctx, sb, 0)
	// The run's network ends with its answer, whatever it left running.
	defer attachNetwork(sb, req.Network)()

	rs.onFlood(func() { sb.Kill() })

	conn := worker.NewConn(sb.Control())
	defer func() {
		if teardown == nil {
			conn.Close()
		} else {
			teardown = append([]func(){func() { conn.Close() }}, teardown...)
		}
	}()
	var res *worker.Result
	var deadlineKill bool // the sandbox outlived its deadline (whatever its reply said)
	_, rspan := tracing.Tracer().Start(runCtx, "run")
	_, err = conn.Ready(runCtx)
	if err == nil {
		res, err = conn.Run(runCtx, rs.workerRequest(req.Filename))
	}
	if res != nil {
		rspan.SetAttributes(attribute.String("pysandbox.worker_status", res.Status), attribute.Int("pysandbox.exit_code", res.ExitCode))
	}
	rspan.End()
	var exit sandbox.Exit
	var early bool
	// A reply that came after the run's deadline (the code waited on a
	// tool call the deadline cancelled, and answered with that) does not
	// decide how the run ended either: it ran out of time. Without this,
	// whether such a run was a timeout or an error was a coin toss
	// between the reply and the deadline in finishEarly's select.
	late := err == nil && runCtx.Err() != nil && ctx.Err() == nil
	if err != nil || late {
		// The worker died or the deadline passed: make sure everything in
		// the sandbox is dead before looking at how it ended.
		sb.Kill()
		deadlineKill = late
	} else if exit, early = finishEarly(runCtx, sb); early {
		// The reply and all of the output are in: the run is over, and
		// nothing of it may go on after the slot is free, when it is no
		// longer counted against --max-concurrent or its CPU time. Stop
		// it now (the worker is exiting already); the rest of the
		// teardown happens after the caller has its answer.
		sb.(sandbox.Finisher).Stop()
		teardown = []func(){}
	} else {
		// The one-shot worker exits after replying. Anything it left
		// running dies with it (pid 1 of its namespace); wait for that, but
		// never past the deadline.
		deadlineKill = waitOrKill(runCtx, sb)
	}
	if early {
		// exit has the figures already.
	} else if en, ok := sb.(sandbox.Ender); ok && res != nil {
		// The worker's result has the exit code: no need to wait for the
		// status, only for every process to be gone and the output in.
		exit = en.WaitEnded()
	} else {
		exit = sb.Wait()
	}
	if deadlineKill {
		// The run's own reply does not decide how it ended: what the
		// server measured does.
		res = nil
	}
	r := rs.finish(ctx, runCtx, res, err, exit)
	if rs.flooded.Load() && r.Status != StatusTimeout && r.Status != StatusCancelled {
		// Killed for it, though the process may have exited 0 first.
		r.Status, r.Flooded = StatusOutputLimit, true
		if r.ExitCode == 0 {
			r.ExitCode = -1
		}
		r.Message = fmt.Sprintf("the run printed more than %d bytes and was stopped; print less, or write large results to a file", rs.flood)
	}
	return r, nil
}

// finishEarly waits, for a sandbox that can tell, until a one-shot run's
// output is complete once its worker has replied, and returns its figures
// so far. It reports false when the sandbox cannot tell, or when the
// output is not complete by the deadline (a process the run started holds
// it, and ends only with the sandbox): then the caller waits for the end
// as usual.
func finishEarly(ctx context.Context, sb sandbox.Sandbox) (sandbox.Exit, bool) {
	f, ok := sb.(sandbox.Finisher)
	if !ok {
		return sandbox.Exit{}, false
	}
	var ended <-chan struct{}
	if en, ok := sb.(sandbox.Ender); ok {
		done := make(chan struct{})
		go func() { en.WaitEnded(); close(done) }()
		ended = done
	}
	select {
	case <-f.OutputDone():
		return f.Figures(), true
	case <-ended:
		return sandbox.Exit{}, false
	case <-ctx.Done():
		return sandbox.Exit{}, false
	}
}

// waitOrKill waits until every process of sb has ended, killing them at
// ctx's deadline; it reports whether it had to.
func waitOrKill(ctx context.Context, sb sandbox.Sandbox) bool {
	done := make(chan struct{})
	go func() {
		if en, ok := sb.(sandbox.Ender); ok {
			en.WaitEnded()
		} else {
			sb.Wait()
		}
		close(done)
	}()
	select {
	case <-done:
		return false
	case <-ctx.Done():
		sb.Kill()
		<-done
		return true
	}
}
