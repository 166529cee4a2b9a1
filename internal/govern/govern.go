// Package govern is where every tool call is decided and recorded: the
// calls of pysandbox's own tools, of every profile's, reads of session
// files, and the upstream calls code makes.
//
// A call goes through three steps, each typed, none reaching back into
// the transport:
//
//  1. Admit, with the call's name and raw arguments, before they are
//     parsed: a broken audit log, a hidden or denied tool.
//  2. Ticket.Check, with what the call amounts to (a Subject: its code,
//     packages, session): the package rules, the argument and code rules
//     (require, deny_if, approve_if; code facts derived in the sandbox
//     when a rule names them), the rate limits, and a human's approval.
//  3. Ticket.End, with what happened (an Outcome): the audit record,
//     written before the client sees the result, and the metrics.
//
// The MCP layer (internal/tools) converts requests to Calls and results
// to Outcomes, in one place; nothing here knows MCP.
package govern

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pysandbox/pysandbox/internal/activity"
	"github.com/pysandbox/pysandbox/internal/audit"
	"github.com/pysandbox/pysandbox/internal/egress"
	"github.com/pysandbox/pysandbox/internal/metrics"
	"github.com/pysandbox/pysandbox/internal/policy"
)

// Config is the policy, its rate limits and approvals, the audit log and
// the metrics. Every part is optional; the zero value allows everything
// and records nothing.
type Config struct {
	Policy  *policy.Policy   // nil: allow everything
	Audit   *audit.Writer    // nil: no audit log
	Metrics *metrics.Metrics // nil: no metrics
	// ApprovalTTL is how long a user's approval stays valid for its retry
	// (default 10 minutes).
	ApprovalTTL time.Duration
	// Updates, when set, delivers policies that replace the one in force
	// (serve reloads its file on SIGHUP). Rate-limit counts carry over.
	Updates <-chan *policy.Policy
	// Limiter counts rate limits; nil: in this process. A shared store's
	// (internal/sharedstate) counts across replicas.
	Limiter policy.RateLimiter
	// ApprovalKey seals approval state (AES, 16 to 32 bytes); nil: a
	// random key of this process. Nonces, when set, records used
	// approvals where every replica sees them. With both shared, an
	// approval answered through one replica is honoured, once, by any.
	ApprovalKey []byte
	Nonces      policy.NonceStore
	// Activity, when set, is told of every call in flight (and can stop
	// it) and every call that ended: the operator console's live view.
	Activity *activity.Registry
	// FactsCache is how many programs' code facts are kept, per caller,
	// interpreter and code (SHA-256), so that the same code sent again is
	// decided without parsing it again; 0: none. Only facts from a parser
	// no code had run before are kept, never a decision (see factsCache).
	FactsCache int
}

// DefaultFactsCache is the FactsCache a server keeps: a few agents'
// recent programs.
const DefaultFactsCache = 1024

// Sandbox is what the governor tells a human about where code runs,
// given by the layer that runs it.
type Sandbox struct {
	// Limits describes the limits a run of that timeout gets (0: the
	// default), e.g. "timeout 30s, memory 512 MiB, no network, ...".
	Limits func(timeout time.Duration) string
	// Facts derives the facts of code that rules naming code.* look at
	// (internal/codefacts), inside the sandbox; nil: such rules refuse
	// the call, since they cannot be applied.
	Facts FactsFunc
	// FromRun reads the facts a run's worker sent of its own code before
	// running it (worker.Request.Gate): hostile JSON, validated. When set,
	// a run's code rules are decided in its own sandbox, saving a second
	// one; nil: Facts derives them first.
	FromRun func(raw json.RawMessage, code string) (facts map[string]any, summary string, err error)
}

// FactsFunc derives the facts of code for python (a version, or "" for
// the default), as JSON values, and their one-line summary.
type FactsFunc func(ctx context.Context, code, python string) (facts map[string]any, summary string, err error)

// Governor enforces a Config.
type Governor struct {
	pol      atomic.Pointer[policy.Policy]
	limiter  policy.RateLimiter
	sealer   *policy.Sealer
	audit    *audit.Writer
	metrics  *metrics.Metrics
	activity *activity.Registry
	log      *slog.Logger
	sandbox  Sandbox
	facts    *factsCache // nil: none

	// broken is set once the audit log failed: from then on every call is
	// refused, because it could not be recorded.
	mu     sync.Mutex
	broken error
}

// New returns a governor for cfg. The updates of cfg.Updates are applied
// by whoever reads them (see SetPolicy): the MCP layer also has to
// change its tool list.
func New(cfg Config, sb Sandbox, log *slog.Logger) *Governor {
	if log == nil {
		log = slog.Default()
	}
	pol := cfg.Policy
	if pol == nil {
		pol = policy.AllowAll()
	}
	ttl := cfg.ApprovalTTL
	if ttl <= 0 {
		ttl = 10 * time.Minute
	}
	var sealer *policy.Sealer
	var err error
	if cfg.ApprovalKey != nil {
		sealer, err = policy.NewSharedSealer(cfg.ApprovalKey, ttl, nil, cfg.Nonces)
	} else {
		sealer, err = policy.NewSealer(ttl, nil)
	}
	if err != nil {
		// Only a broken system random source gets here; approvals then
		// cannot be granted, which fails closed.
		log.Error("approvals disabled", "err", err)
	}
	var limiter policy.RateLimiter = policy.NewLimiter(nil)
	if cfg.Limiter != nil {
		limiter = cfg.Limiter
	}
	if sb.Limits == nil {
		sb.Limits = func(time.Duration) string { return "the server's limits" }
	}
	g := &Governor{limiter: limiter, sealer: sealer, activity: cfg.Activity, audit: cfg.Audit, metrics: cfg.Metrics, log: log, sandbox: sb,
		facts: newFactsCache(cfg.FactsCache)}
	g.pol.Store(pol)
	return g
}

// Policy is the policy in force now.
func (g *Governor) Policy() *policy.Policy { return g.pol.Load() }

// SetPolicy replaces the policy in force; calls admitted before go on
// under the old one, and an approval answered meanwhile is checked
// against the new one.
func (g *Governor) SetPolicy(p *policy.Policy) { g.pol.Store(p) }

// Activity is the console's registry (nil without a console).
func (g *Governor) Activity() *activity.Registry { return g.activity }

// Metrics are the server's metrics (nil: none; every method is nil-safe).
func (g *Governor) Metrics() *metrics.Metrics { return g.metrics }

// Reserve counts one call by identity against limits (see
// policy.RateLimiter).
func (g *Governor) Reserve(ctx context.Context, limits []policy.Limit, identity string) (policy.Reservation, *policy.Exceeded, error) {
	return g.limiter.Reserve(ctx, limits, identity)
}

// Broken is the audit log's failure, once it failed: every call is then
// refused.
func (g *Governor) Broken() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.broken
}

// Append writes a record that is not a tool call's own (a connection, an
// upstream call). A failed write breaks the log: every later call is
// refused.
func (g *Governor) Append(rec *audit.Record) error {
	if g.audit == nil {
		return nil
	}
	err := g.audit.Append(rec)
	if err != nil {
		g.mu.Lock()
		if g.broken == nil {
			g.broken = err
		}
		g.mu.Unlock()
		g.log.Error("audit log write failed; refusing every call from now on", "err", err)
	}
	return err
}

// NetRecord writes a connection's audit record and counts it: the
// egress proxy's recorder.
func (g *Governor) NetRecord(r egress.Record) {
	if r.Unrecorded != nil {
		// A summary: the connections it counts are counted now.
		for d, n := range r.Unrecorded {
			g.metrics.NetConns(d, n)
		}
	} else {
		g.metrics.NetConn(r.Decision, r.BytesIn, r.BytesOut)
	}
	if g.audit == nil {
		return
	}
	rec := &audit.Record{Event: audit.EventConnect, Identity: r.Identity, Tool: r.Tool, CallID: r.CallID,
		Decision: r.Decision, Reason: r.Reason, DurationMS: r.Duration.Milliseconds(),
		Net: &audit.Connection{Method: r.Method, Host: r.Host, Port: r.Port, Address: r.Address, Session: r.Session, BytesIn: r.BytesIn, BytesOut: r.BytesOut, Unrecorded: r.Unrecorded}}
	if r.Limit != "" {
		rec.LimitsHit = []string{"net:" + r.Limit}
	}
	g.Append(rec)
}

// RateHit names a rate limit in a record's limits_hit, e.g. rate:runs/minute.
func RateHit(e *policy.Exceeded) string { return "rate:" + e.Limit.Counter + "/" + e.Limit.Window }
