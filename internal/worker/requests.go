package worker

import (
	"context"
	"encoding/json"
	"fmt"
)

// Run executes code in the worker. Op and ID of req are set by Run. A
// non-nil error means the exchange itself failed; errors in the user's code
// are reported in the Result.
//
// In a serving worker, runs share one session (see the package comment). To
// stop a run that takes too long without losing the session, send SIGINT to
// the worker and keep waiting: the run ends with a KeyboardInterrupt error.
// Cancelling ctx instead makes the Conn unusable.
//
// With req.Tools set, the run's code may call tools (see OpToolCall): Run
// serves its calls until the run's result is read, each in a goroutine of
// its own, and returns once they have all returned. Their ctx is derived
// from req.ToolsCtx (or ctx) and is cancelled when the result is read. A
// reply the worker did not read whole (see lateReplyGrace) leaves the
// stream out of step: Run still returns the run's result, and the Conn is
// unusable from then on.
func (c *Conn) Run(ctx context.Context, req Request) (*Result, error) {
	req.Op = OpRun
	req.ToolsOn = req.Tools != nil
	req.GateOn = req.Gate != nil
	var res Result
	maxReturn := req.MaxReturnBytes
	if maxReturn <= 0 {
		maxReturn = DefaultMaxReturnBytes
	}
	if err := c.callChecked(ctx, &req, OpResult, &res, func() error { return res.check(maxReturn) }); err != nil {
		return nil, err
	}
	if len(res.ReturnValue) == 0 {
		res.ReturnValue = json.RawMessage("null")
	}
	return &res, nil
}

// check rejects results no well-behaved worker sends: every field within
// the bounds the worker keeps to (see worker.py), so that a result forged
// by user code costs the server no more than a real one.
func (res *Result) check(maxReturn int) error {
	// The worker's JSON is ASCII (ensure_ascii), so its length is its size;
	// a little room for the truncation mark of a repr.
	if len(res.ReturnValue) > maxReturn+64 {
		return fmt.Errorf("worker: return value of %d bytes (the bound is %d)", len(res.ReturnValue), maxReturn)
	}
	if len(res.ReturnText) > MaxReturnTextBytes+64 {
		return fmt.Errorf("worker: return text of %d bytes (the bound is %d)", len(res.ReturnText), MaxReturnTextBytes)
	}
	if e := res.Error; e != nil {
		// Characters, up to 4 bytes each in UTF-8.
		limit := 4 * (MaxErrorChars + 64)
		if len(e.Type) > MaxErrorTypeBytes || len(e.Message) > limit || len(e.Traceback) > limit {
			return fmt.Errorf("worker: error of %d+%d+%d bytes (the bound is %d each)", len(e.Type), len(e.Message), len(e.Traceback), limit)
		}
	}
	switch res.Status {
	case "success", "error":
	default:
		return fmt.Errorf("worker: bad result status %q", clip(res.Status))
	}
	if res.ExitCode < 0 || res.ExitCode > 255 {
		return fmt.Errorf("worker: bad exit code %d", res.ExitCode)
	}
	if len(res.Figures) > MaxFigures || res.FiguresOmitted < 0 {
		return fmt.Errorf("worker: bad figure count %d (+%d omitted)", len(res.Figures), res.FiguresOmitted)
	}
	if len(res.Displays) > MaxDisplays || res.DisplaysOmitted < 0 {
		return fmt.Errorf("worker: bad display count %d (+%d omitted)", len(res.Displays), res.DisplaysOmitted)
	}
	// The worker's own bounds are advice only (code in the sandbox can
	// change any of its globals): these are the server's.
	shown := 0
	for i, d := range res.Displays {
		text, ok := d.Data["text/plain"]
		if !ok || len(d.Data) > len(DisplayMIMETypes) {
			return fmt.Errorf("worker: display %d has no text/plain or too many types", i)
		}
		if len(text) > 4*(MaxDisplayTextBytes+64) {
			return fmt.Errorf("worker: display %d has a text of %d bytes", i, len(text))
		}
		for mime, v := range d.Data {
			if _, ok := DisplayMIMETypes[mime]; !ok {
				return fmt.Errorf("worker: display %d has type %q", i, clip(mime))
			}
			if len(v) > MaxDisplayItemBytes*4/3+64 {
				return fmt.Errorf("worker: display %d as %s has %d bytes", i, clip(mime), len(v))
			}
			shown += len(v)
			if shown > MaxDisplaysTotalBytes {
				return fmt.Errorf("worker: displays of more than %d bytes", MaxDisplaysTotalBytes)
			}
		}
	}
	total := 0
	for i, f := range res.Figures {
		total += len(f.PNG)
		if f.Width < 0 || f.Height < 0 || !(f.DPI >= 0) || len(f.PNG) > MaxFigurePNGBytes || total > MaxFiguresTotalBytes {
			return fmt.Errorf("worker: bad figure %d (%dx%d, dpi %g, %d bytes)", i, f.Width, f.Height, f.DPI, len(f.PNG))
		}
	}
	return nil
}

// Validate compiles code without running it.
func (c *Conn) Validate(ctx context.Context, code, filename string) (*Validation, error) {
	var v Validation
	req := Request{Op: OpValidate, Code: code, Filename: filename}
	if err := c.call(ctx, &req, OpValidated, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// Probe asks the worker to report its isolation as seen from inside.
// hidden are paths that should read as empty or not exist, readOnly paths
// that should be on read-only mounts; the reply names those that are not.
func (c *Conn) Probe(ctx context.Context, hidden, readOnly []string) (*Probe, error) {
	var p Probe
	req := Request{Op: OpProbe, Hidden: hidden, ReadOnly: readOnly}
	if err := c.call(ctx, &req, OpProbed, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// Sync writes marker and a newline to the worker's stdout and stderr, after
// everything Python code in the worker has printed so far, and returns once
// both are written. Reading either stream up to the marker line then yields
// all the output produced before the call (output written directly to the
// file descriptors by threads or child processes may still interleave).
// The marker must be 16 to 128 characters of [A-Za-z0-9_-], and should be
// unpredictable to the user's code.
func (c *Conn) Sync(ctx context.Context, marker string) error {
	if !ValidMarker(marker) {
		return fmt.Errorf("worker: invalid sync marker %q", clip(marker))
	}
	var s Synced
	req := Request{Op: OpSync, Marker: marker}
	return c.call(ctx, &req, OpSynced, &s)
}

// ValidMarker reports whether marker can be used with Sync.
func ValidMarker(marker string) bool {
	if len(marker) < 16 || len(marker) > 128 {
		return false
	}
	for i := 0; i < len(marker); i++ {
		switch b := marker[i]; {
		case 'a' <= b && b <= 'z', 'A' <= b && b <= 'Z', '0' <= b && b <= '9', b == '_', b == '-':
		default:
			return false
		}
	}
	return true
}
