package engine

import (
	"context"
	"fmt"
	"io"
	"slices"

	"github.com/pysandbox/pysandbox/internal/sandbox"

	"github.com/pysandbox/pysandbox/internal/worker"
)

// withWorker starts a sandboxed, long-lived worker, hands its connection to
// f, and tears everything down afterwards. Validation and probing use it:
// they never run user code, but compiling is still done inside the
// sandbox, since the compiler is a large attack surface of its own.
func (e *Engine) withWorker(ctx context.Context, f func(*worker.Conn) error) error {
	if err := e.acquire(ctx); err != nil {
		return err
	}
	defer e.release()
	ctx, cancel := context.WithTimeout(ctx, e.cfg.DefaultTimeout)
	defer cancel()
	sb, err := e.cfg.Backend.Start(ctx, e.spec(false, io.Discard, io.Discard))
	if err != nil {
		return startError(err)
	}
	defer sb.Close()
	conn := worker.NewConn(sb.Control())
	defer conn.Close()
	if _, err := conn.Ready(ctx); err != nil {
		return fmt.Errorf("engine: worker did not start: %w", err)
	}
	return f(conn)
}

// Validate compiles code inside a sandbox without running it.
func (e *Engine) Validate(ctx context.Context, code, filename string) (*worker.Validation, error) {
	var v *worker.Validation
	err := e.withWorker(ctx, func(c *worker.Conn) error {
		var err error
		v, err = c.Validate(ctx, code, filename)
		return err
	})
	return v, err
}

// probe asks a sandboxed worker what it sees of its own isolation.
func (e *Engine) probe(ctx context.Context) (*worker.Probe, error) {
	var p *worker.Probe
	err := e.withWorker(ctx, func(c *worker.Conn) error {
		var err error
		m := sandbox.DefaultProcMasks()
		p, err = c.Probe(ctx, append(slices.Clone(m.Files), m.Dirs...), m.ReadOnly)
		return err
	})
	return p, err
}
