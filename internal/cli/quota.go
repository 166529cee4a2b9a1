package cli

import (
	"errors"
	"flag"
	"sync/atomic"
	"time"

	"github.com/pysandbox/pysandbox/internal/httpserver"
	"github.com/pysandbox/pysandbox/internal/policy"
	"github.com/pysandbox/pysandbox/internal/quota"
)

// quotaFlags are the per-caller quotas of serve. -1 means "automatic":
// over HTTP, where several tenants share the server, half of the server's
// own cap (at least 1); over stdio, where there is one caller, none.
type quotaFlags struct {
	runs, queue, sessions int
	// The MCP sessions of sessionful HTTP (httpserver.SessionLimits).
	mcp httpserver.SessionLimits
}

func (q *quotaFlags) add(fs *flag.FlagSet) {
	fs.IntVar(&q.runs, "max-runs-per-caller", -1, "runs one caller (a token; all callers without a token together) may have executing at once; -1: half of --max-concurrent over HTTP, no bound over stdio; the policy file's quotas section overrides it")
	fs.IntVar(&q.queue, "max-queue-per-caller", -1, "runs one caller may have waiting for those; -1: half of --max-queue over HTTP, no bound over stdio")
	fs.IntVar(&q.sessions, "max-sessions-per-caller", -1, "sessions one caller may have open; -1: half of --max-sessions over HTTP, no bound over stdio")
	fs.DurationVar(&q.mcp.Idle, "mcp-session-idle", 10*time.Minute, "with --http: an MCP session (protocols before 2026-07-28) without requests for this long ends (an open event stream or a call in flight keeps it)")
	fs.IntVar(&q.mcp.PerCaller, "max-mcp-sessions-per-caller", 64, "with --http: MCP sessions plus sessionless requests in flight one caller may have at once (all callers without a token together); past it the request is answered with a JSON-RPC error saying so")
	fs.IntVar(&q.mcp.Total, "max-mcp-sessions", 1024, "with --http: MCP sessions plus sessionless requests in flight the server keeps at once")
}

// check refuses values the flags do not take.
func (q *quotaFlags) check() error {
	if q.mcp.Idle <= 0 || q.mcp.PerCaller <= 0 || q.mcp.Total <= 0 {
		return usageError{errors.New("--mcp-session-idle, --max-mcp-sessions-per-caller and --max-mcp-sessions must be positive")}
	}
	if q.runs < -1 || q.queue < -1 || q.sessions < -1 {
		return usageError{errors.New("--max-runs-per-caller, --max-queue-per-caller and --max-sessions-per-caller take -1 (automatic), 0 (no bound) or a positive number")}
	}
	return nil
}

// limits resolves the flags, checked, against the server's caps.
func (q *quotaFlags) limits(http bool, maxConcurrent, maxQueue, maxSessions int) quota.Limits {
	auto := func(v, capacity int) int {
		if v >= 0 {
			return v
		}
		if !http {
			return 0
		}
		return max(capacity/2, 1)
	}
	return quota.Limits{
		Runs:     auto(q.runs, maxConcurrent),
		Queue:    auto(q.queue, maxQueue),
		Sessions: auto(q.sessions, maxSessions),
	}
}

// quotaFunc is each caller's limits: the flags, then the policy in force's
// quotas section (its defaults, then the caller's own entry), so a policy
// reload applies to the next call.
func quotaFunc(flags quota.Limits, current *atomic.Pointer[policy.Policy]) func(string) quota.Limits {
	return func(id string) quota.Limits {
		l := flags
		pol := current.Load()
		if pol == nil || pol.Quotas == nil {
			return l
		}
		apply := func(p policy.QuotaLimits) {
			if p.Runs > 0 {
				l.Runs = p.Runs
			}
			if p.Queue > 0 {
				l.Queue = p.Queue
			}
			if p.Sessions > 0 {
				l.Sessions = p.Sessions
			}
		}
		apply(pol.Quotas.QuotaLimits)
		if own, ok := pol.Quotas.Identities[id]; ok {
			apply(own)
		}
		return l
	}
}
