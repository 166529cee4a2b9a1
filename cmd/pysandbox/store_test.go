package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/testutil/redisserver"
)

// TestServeSharedStore: two replicas of `serve --http --store` on one
// Redis hold a global rate limit exactly between them, and a store that
// goes away refuses limited calls with a clear message while the rest
// is served.
func TestServeSharedStore(t *testing.T) {
	r := redisserver.Start(t)
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.yaml")
	os.WriteFile(pol, []byte(`version: "1"
default: allow
tools:
  run_python: {limits: [{counter: runs, window: day, max: 3}]}
`), 0o600)
	key := filepath.Join(dir, "approval.key")
	os.WriteFile(key, []byte("00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n"), 0o600)
	var sessions []*mcp.ClientSession
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		addr := freePort(t)
		startServe(t, addr, "http://"+addr, nil, "--policy", pol, "--store", r.URL(), "--approval-key-file", key, "--pool-size", "1")
		sessions = append(sessions, connectHTTP(ctx, t, "http://"+addr, ""))
	}
	allowed, limited := 0, 0
	for i := 0; i < 8; i++ {
		res, err := sessions[i%2].CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "print(1)"}})
		if err != nil {
			t.Fatal(err)
		}
		switch txt := res.Content[0].(*mcp.TextContent).Text; {
		case !res.IsError:
			allowed++
		case strings.Contains(txt, "rate limit"):
			limited++
		default:
			t.Fatalf("call %d: %s", i, txt)
		}
	}
	if allowed != 3 || limited != 5 {
		t.Errorf("%d allowed and %d limited through two replicas, want exactly 3 and 5", allowed, limited)
	}
	r.Stop()
	res, err := sessions[0].CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "print(1)"}})
	if err != nil || !res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "shared rate-limit store did not answer") {
		t.Errorf("with the store gone: %v %+v", err, res)
	}
	res, err = sessions[1].CallTool(ctx, &mcp.CallToolParams{Name: "validate_script", Arguments: map[string]any{"code": "x = 1"}})
	if err != nil || res.IsError {
		t.Errorf("a call without limits, with the store gone: %v %+v", err, res)
	}
}
