// Package engine runs Python code: it takes a request, starts a sandbox
// with the worker inside, drives the worker over its control socket,
// enforces the timeout, output cap and concurrency cap, and turns whatever
// happened into one Result.
//
// It is the single place that knows how a run is put together; the MCP
// tools and the command line are thin layers on top.
package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pysandbox/pysandbox/internal/deps"
	"github.com/pysandbox/pysandbox/internal/interp"
	"github.com/pysandbox/pysandbox/internal/pydist"
	"github.com/pysandbox/pysandbox/internal/sandbox"
	"github.com/pysandbox/pysandbox/internal/worker"
)

// Status is the outcome of a run.
type Status string

const (
	StatusSuccess     Status = "success"
	StatusError       Status = "error"
	StatusTimeout     Status = "timeout"
	StatusMemoryLimit Status = "memory_limit"
	StatusOutputLimit Status = "output_limit"
	StatusKilled      Status = "killed"
	StatusCancelled   Status = "cancelled"
)

// workerPath is where the worker program sits inside every sandbox.
const workerPath = "/.pysandbox/worker.py"

// toolsPath is where the "tools" module's source sits, next to the worker
// (which looks for it there: worker.ToolsFile).
const toolsPath = "/.pysandbox/" + worker.ToolsFile

// factsPath is where the worker finds codefacts.py, to gate a run on its
// code's facts (RunRequest.Gate).
const factsPath = "/.pysandbox/" + worker.CodeFactsFile

// Config configures an Engine.
type Config struct {
	Backend sandbox.Backend
	// Python is the default interpreter; Interpreters are all that a run
	// may select with python_version or requires-python (default: Python).
	Python       *interp.Interpreter
	Interpreters []*interp.Interpreter
	// Discover, when Interpreters is empty, finds them on first need (it
	// runs every interpreter once, which startup should not wait for).
	Discover func(context.Context) []*interp.Interpreter
	// Deps builds and caches dependency environments; nil refuses runs
	// that need dependencies.
	Deps *deps.Cache
	// NoDepsReason says why Deps is nil, for the agent.
	NoDepsReason string
	// Pythons provides the Python versions the host lacks (managed
	// interpreters, downloaded on demand); nil: only the host's.
	Pythons *pydist.Manager
	// NoPythonsReason says why Pythons is nil when it should not be
	// (a cache no sandbox can mount), for the agent and check_environment.
	NoPythonsReason string
	// PythonPreference orders the host's interpreters and the managed
	// ones, as uv's python-preference does ("" is pydist.PreferSystem).
	PythonPreference pydist.Preference
	// CheckPython, when set, is the server's Python policy: asked about
	// the version of every run's interpreter, and before a download.
	CheckPython func(version string) error
	// CheckPackage, when set, is the server's package policy. It is asked
	// about every requested package (requested true) before anything is
	// installed, and about every distribution in an environment (requested
	// false) before a sandbox can import from it. name is PEP 503
	// normalised. An error refuses the run with a PackageDeniedError.
	CheckPackage func(name string, requested bool) error
	Limits       sandbox.Limits
	// DefaultTimeout applies when a request names none; MaxTimeout caps
	// what a request may ask for.
	DefaultTimeout time.Duration
	MaxTimeout     time.Duration
	// MaxOutput is the number of bytes kept per stream (head and tail).
	MaxOutput int
	// MaxFigureBytes is the PNG size figures are scaled down to fit, so
	// they can be returned inline (default 1 MiB).
	MaxFigureBytes int
	// MaxConcurrent runs execute at once; up to MaxQueue more wait.
	MaxConcurrent int
	MaxQueue      int
	// Network gives sandboxes a way out through the server's proxy
	// (internal/egress): each listens on 127.0.0.1:sandbox.ProxyPort and
	// its environment points HTTP clients there. Which run may reach what
	// is up to the NetAttach of its request; a run without one has no
	// network. Off: no sandbox has any network at all.
	Network bool
	Logger  *slog.Logger
}

// NetAttach serves a sandbox's proxy listener (see Config.Network) for one
// run or one session, and returns the function that ends that, which the
// engine calls when the run or session is over.
type NetAttach func(l net.Listener) (stop func())

// Engine runs code. It is safe for concurrent use.
type Engine struct {
	cfg          Config
	discoverOnce sync.Once
	slots        chan struct{}
	waiting      atomic.Int64
	log          *slog.Logger
	// baseDists are each interpreter's own distributions (preinstalled.go).
	baseDists sync.Map
}

// New checks cfg and returns an Engine.
func New(cfg Config) (*Engine, error) {
	if cfg.Backend == nil || cfg.Python == nil {
		return nil, errors.New("engine: a backend and an interpreter are required")
	}
	if cfg.DefaultTimeout <= 0 {
		cfg.DefaultTimeout = 30 * time.Second
	}
	if cfg.MaxTimeout < cfg.DefaultTimeout {
		cfg.MaxTimeout = cfg.DefaultTimeout
	}
	if cfg.MaxOutput <= 0 {
		cfg.MaxOutput = 1 << 20
	}
	if cfg.MaxConcurrent <= 0 {
		cfg.MaxConcurrent = 16
	}
	if cfg.MaxFigureBytes <= 0 {
		cfg.MaxFigureBytes = 1 << 20
	}
	if cfg.MaxQueue < 0 {
		cfg.MaxQueue = 0
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Limits.CPUSeconds == 0 {
		// A backstop far behind the wall clock: CPU time cannot exceed
		// wall time times the cores, and the wall clock kills first.
		cfg.Limits.CPUSeconds = uint64(cfg.MaxTimeout/time.Second)*4 + 10
	}
	return &Engine{cfg: cfg, slots: make(chan struct{}, cfg.MaxConcurrent), log: cfg.Logger}, nil
}

// Config returns the effective configuration.
func (e *Engine) Config() Config { return e.cfg }

// ErrBusy means the server cannot take the run now: the concurrency cap
// and the queue are full, or the machine is so loaded that no sandbox
// could be prepared in time. Nothing was run; the caller may retry.
var ErrBusy = errors.New("engine: the server is busy")

// startError explains a sandbox that could not start: one that ran out of
// time while the run still had time left is a machine too busy to prepare
// it, which a retry may fix, not a broken sandbox.
func startError(err error) error {
	if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: no sandbox could be prepared in time, as other runs are using the machine (%v); retry in a few seconds", ErrBusy, err)
	}
	return fmt.Errorf("engine: %w", err)
}

// acquire takes a run slot, waiting in line (FIFO, as Go wakes channel
// receivers in order) while the queue has room.
func (e *Engine) acquire(ctx context.Context) error {
	select {
	case e.slots <- struct{}{}:
		return nil
	default:
	}
	if e.waiting.Add(1) > int64(e.cfg.MaxQueue) {
		e.waiting.Add(-1)
		return fmt.Errorf("%w: %d runs are running and %d queued; retry in a few seconds", ErrBusy, e.cfg.MaxConcurrent, e.cfg.MaxQueue)
	}
	defer e.waiting.Add(-1)
	select {
	case e.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (e *Engine) release() { <-e.slots }

// Running is the number of runs holding a slot right now.
func (e *Engine) Running() int { return len(e.slots) }

// Waiting is the number of runs queued for a slot right now.
func (e *Engine) Waiting() int { return int(e.waiting.Load()) }

// Result is the outcome of a run. (How a tool shows it is the tool's:
// run_python's is internal/tools' RunPythonOutput.)
type Result struct {
	Status   Status
	ExitCode int
	Stdout   string
	Stderr   string
	// ReturnValue is the last expression's value (nil when none): decoded
	// JSON, or its repr() string when it was not JSON-able.
	ReturnValue     any
	StdoutTruncated bool
	StderrTruncated bool
	// StdoutBytes and StderrBytes are how much the run printed, all of it,
	// however little the server kept (--max-output).
	StdoutBytes, StderrBytes int64
	DurationMS               int64
	// Error names the exception that ended the run, when there was one.
	Error *worker.Exception
	// Message explains a non-success status in words an agent can act on.
	Message string
	// Sandbox is the backend that ran the code; "none" means unsandboxed.
	Sandbox string
	// Figures are the matplotlib figures the run left open, as PNG.
	Figures []Figure
	// ReturnText is a text rendering of a pandas return value.
	ReturnText string
	// Displays are the run's rich outputs (display(), rich reprs).
	Displays        []Display
	DisplaysOmitted int
	// FiguresOmitted counts the open figures beyond worker.MaxFigures.
	FiguresOmitted int
	// Resource use, for the audit trail.
	PeakMemoryBytes int64
	CPUTimeMS       int64
	// Flooded: the server stopped the run (interrupted or killed it) for
	// printing more than the flood limit, whatever its exit said.
	Flooded bool
}

// Completed tells whether the code ran to its end without an exception:
// a success, or an output_limit whose run went on to exit 0 with only
// its printed output cut to head and tail (not one stopped for flooding).
// Such a run's result is not a failure, whatever its status says.
func (r *Result) Completed() bool {
	return r.Status == StatusSuccess || r.Status == StatusOutputLimit && !r.Flooded && r.Error == nil && r.ExitCode == 0
}

// timeout picks the effective timeout of a request.
func (e *Engine) timeout(d time.Duration) time.Duration {
	if d <= 0 {
		return e.cfg.DefaultTimeout
	}
	return min(d, e.cfg.MaxTimeout)
}

// spec is the sandbox spec for one worker.
func (e *Engine) spec(oneshot bool, stdout, stderr io.Writer) *sandbox.Spec {
	return e.specFor(nil, oneshot, stdout, stderr)
}

// RunSpec is the sandbox spec of a one-shot run (output writers unset):
// the warm pool prepares sandboxes for exactly this spec.
func (e *Engine) RunSpec() *sandbox.Spec { return e.spec(true, nil, nil) }

// workerEnv is the whole environment of the worker: nothing of the
// server's leaks in.
func (e *Engine) workerEnv() []string {
	env := baseEnv()
	if e.cfg.Network {
		env = append(env, sandbox.ProxyEnv()...)
	}
	return env
}

func baseEnv() []string {
	return []string{
		"PATH=/usr/local/bin:/usr/bin:/bin",
		"HOME=/work",
		"TMPDIR=/tmp",
		"LANG=C.UTF-8",
		"LC_ALL=C.UTF-8",
		"USER=sandbox",
		// Plots must never try to open a window.
		"MPLBACKEND=Agg",
		// Numeric libraries would otherwise start a thread per host core,
		// against the sandbox's pids limit.
		"OMP_NUM_THREADS=1",
		"OPENBLAS_NUM_THREADS=1",
	}
}

// nearMemoryLimit tells a MemoryError that the memory limit caused from
// one that user code raised or forged: with a memory cgroup, the run must
// have come near the limit (a real overrun is usually an OOM kill); with
// RLIMIT_AS only, a MemoryError is how the limit shows.
func (e *Engine) nearMemoryLimit(exit sandbox.Exit) bool {
	cg, ok := e.cfg.Backend.(interface {
		CgroupSupport() (mem, pids bool, mode, reason string)
	})
	if !ok || e.cfg.Limits.MemoryBytes <= 0 {
		return true
	}
	if mem, _, _, _ := cg.CgroupSupport(); !mem {
		return true // RLIMIT_AS enforces the limit: a MemoryError is how it shows
	}
	return exit.PeakMemoryBytes >= e.cfg.Limits.MemoryBytes/2
}

// clipErr shortens an error that may quote the sandbox.
func clipErr(err error) string {
	s := err.Error()
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}

func exitCode(res *worker.Result, exit sandbox.Exit) int {
	if res != nil {
		return res.ExitCode
	}
	if exit.Signal != 0 {
		return 128 + int(exit.Signal)
	}
	return exit.Code
}

// Figure is one matplotlib figure a run produced.
type Figure struct {
	Width, Height int
	Bytes         int  // of PNG
	TooLarge      bool // it could not be scaled down to Config.MaxFigureBytes
	PNG           []byte
}

// decodeReturn decodes the worker's JSON value, keeping numbers exact. The
// worker is inside the sandbox, so a value that does not decode is passed
// on as text rather than trusted.
func decodeReturn(raw json.RawMessage) any {
	if len(raw) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return string(raw)
	}
	return safeNumbers(v)
}

// safeNumbers replaces numbers that a JSON client decoding into float64
// (the MCP SDK itself, when it checks the output schema) would round or
// fail on with their digits as strings: integers beyond 2^53, and values
// beyond float64's range.
func safeNumbers(v any) any {
	switch x := v.(type) {
	case json.Number:
		f, err := x.Float64()
		if err != nil || math.IsInf(f, 0) {
			return x.String()
		}
		if i, err := x.Int64(); err == nil {
			if i > 1<<53 || i < -(1<<53) {
				return x.String()
			}
		} else if !strings.ContainsAny(x.String(), ".eE") {
			return x.String() // an integer too large for int64
		}
		return x
	case []any:
		for i := range x {
			x[i] = safeNumbers(x[i])
		}
	case map[string]any:
		for k := range x {
			x[k] = safeNumbers(x[k])
		}
	}
	return v
}

var importRE = regexp.MustCompile(`(?m)^[ \t]*(?:from[ \t]+([A-Za-z_][\w.]*)[ \t]+import\b|import[ \t]+([A-Za-z_][\w.]*(?:[ \t]+as[ \t]+\w+)?(?:[ \t]*,[ \t]*[A-Za-z_][\w.]*(?:[ \t]+as[ \t]+\w+)?)*))`)

// ImportsOf lists the top-level modules a piece of code imports, by a
// plain scan of its import statements. It is a hint for choosing a warm
// zygote, so a miss only costs speed, never correctness.
func ImportsOf(code string) []string {
	var out []string
	seen := map[string]bool{}
	add := func(name string) {
		top, _, _ := strings.Cut(strings.TrimSpace(name), ".")
		if top != "" && !seen[top] {
			seen[top] = true
			out = append(out, top)
		}
	}
	for _, m := range importRE.FindAllStringSubmatch(code, 256) {
		if m[1] != "" {
			add(m[1])
			continue
		}
		for _, part := range strings.Split(m[2], ",") {
			name, _, _ := strings.Cut(strings.TrimSpace(part), " ")
			add(name)
		}
	}
	return out
}

// attachNetwork hands a sandbox's proxy listener to attach, or closes it
// when the run has no network; it returns what ends the network.
func attachNetwork(sb sandbox.Sandbox, attach NetAttach) (stop func()) {
	p, ok := sb.(sandbox.Proxied)
	if !ok || p.ProxyListener() == nil {
		return func() {}
	}
	l := p.ProxyListener()
	if attach == nil {
		l.Close()
		return func() {}
	}
	return attach(l)
}
