package tools

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/audit"
	"github.com/pysandbox/pysandbox/internal/metrics"
	"github.com/pysandbox/pysandbox/internal/policy"
)

// BenchmarkGovernance measures what governance adds to a call: a tool
// that starts no sandbox (list_sessions), over in-memory MCP, plain and
// under a policy with a rate limit plus an fsynced audit log. Compare the
// two with benchstat or by eye:
//
//	go test -run '^$' -bench Governance ./internal/tools
func BenchmarkGovernance(b *testing.B) {
	for _, governed := range []bool{false, true} {
		name := "plain"
		if governed {
			name = "policy+ratelimit+audit"
		}
		b.Run(name, func(b *testing.B) {
			var gov Governance
			if governed {
				pol, err := policy.Parse([]byte(`{"version": "1", "default": "deny", "tools": {"list_sessions": {"limits": [{"counter": "c", "window": "second", "max": 1000000000, "scope": "grant"}]}}}`), "bench.json", Names)
				if err != nil {
					b.Fatal(err)
				}
				w, err := audit.Open(filepath.Join(b.TempDir(), "audit.log"), audit.Options{})
				if err != nil {
					b.Fatal(err)
				}
				defer w.Close()
				gov = Governance{Policy: pol, Audit: w, Metrics: metrics.New(metrics.Gauges{})}
			}
			cs := benchConnect(b, gov)
			ctx := context.Background()
			b.ResetTimer()
			for b.Loop() {
				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "list_sessions"})
				if err != nil || res.IsError {
					b.Fatalf("%v %+v", err, res)
				}
			}
		})
	}
}

func benchConnect(b *testing.B, gov Governance) *mcp.ClientSession {
	b.Helper()
	return connectFull(b, nil, func(o *Options) { o.Governance = gov }, nil, nil)
}
