package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestServeQuotas: two token holders over HTTP. Alice fills her quota of
// runs (executing and waiting) and sessions, and is refused with the
// quota named; Bob, meanwhile, still runs code and opens a session. The
// policy file gives Bob a larger quota than the flags.
func TestServeQuotas(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	os.WriteFile(tokens, []byte("alice alice-0123456789abcdef\nbob bob-0123456789abcdef00\n"), 0o600)
	pol := filepath.Join(dir, "policy.yaml")
	os.WriteFile(pol, []byte(`version: "1"
default: allow
quotas:
  runs: 1
  queue: 1
  sessions: 1
  identities:
    bob: {sessions: 2}
`), 0o600)
	addr := freePort(t)
	startServe(t, addr, "http://"+addr, nil, "--auth-token-file", tokens, "--policy", pol, "--pool-size", "1")
	url := "http://" + addr
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	alice, bob := connectHTTP(ctx, t, url, "alice-0123456789abcdef"), connectHTTP(ctx, t, url, "bob-0123456789abcdef00")
	run := func(cs *mcp.ClientSession, code string) *mcp.CallToolResult {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": code}})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	status := func(res *mcp.CallToolResult) string {
		m, _ := res.StructuredContent.(map[string]any)
		s, _ := m["status"].(string)
		return s
	}

	// Alice sends three long runs at once: one executes, one waits in her
	// one queue place, and the third is refused, naming her quota (the
	// first holds its slot for seconds, so all three meet).
	var wg sync.WaitGroup
	results := make(chan *mcp.CallToolResult, 3)
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results <- run(alice, "import time\ntime.sleep(3)\n'done'")
		}()
	}
	// Meanwhile Bob is not affected.
	time.Sleep(500 * time.Millisecond) // lets alice's calls arrive first; not a pass/fail timing
	if res := run(bob, "6*7"); res.IsError || status(res) != "success" {
		t.Fatalf("bob while alice is at her quota: %v", res.Content)
	}
	wg.Wait()
	close(results)
	var refused, ran int
	for r := range results {
		switch status(r) {
		case "quota":
			refused++
			if !r.IsError || !strings.Contains(r.Content[0].(*mcp.TextContent).Text, "alice may have 1 runs executing and 1 waiting") {
				t.Errorf("the refusal does not name the quota: %v", r.Content[0].(*mcp.TextContent).Text)
			}
		case "success":
			ran++
		default:
			t.Errorf("alice's run: %s %v", status(r), r.Content)
		}
	}
	if refused != 1 || ran != 2 {
		t.Errorf("alice's three runs: %d refused, %d ran; want 1 and 2", refused, ran)
	}

	// Sessions: alice may have 1, bob 2 (the policy's own entry for him).
	create := func(cs *mcp.ClientSession) *mcp.CallToolResult {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "create_session", Arguments: map[string]any{}})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := create(alice); res.IsError {
		t.Fatalf("alice's first session: %v", res.Content)
	}
	if res := create(alice); !res.IsError || status(res) != "quota" {
		t.Fatalf("alice's second session: %v %v", status(res), res.Content)
	}
	for i := range 2 {
		if res := create(bob); res.IsError {
			t.Fatalf("bob's session %d: %v", i+1, res.Content)
		}
	}
}
