package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// toolsCode times n calls of an upstream tool from Python, inside a run,
// each around the call alone, and returns the durations in seconds.
const toolsCode = `
import time, tools
tools.bench.echo(message="warm up")
d = []
for i in range(COUNT):
    t = time.perf_counter()
    tools.bench.echo(message="x")
    d.append(time.perf_counter() - t)
d
`

// upstreamTools compares, in one run, the round trip of an upstream tool
// call made from Python in a run (worker, control channel, policy, audit,
// the server's MCP client) with the same call made directly by a Go MCP
// client. The upstream is an MCP server of the Go SDK on streamable HTTP
// on the loopback, in this process, used the same way by both; its tool
// does nothing, so the difference is what pysandbox adds.
func upstreamTools(ctx context.Context, cfg Config) error {
	up := echoServer(cfg.Version)
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return up }, nil))
	defer hs.Close()
	direct, err := directCalls(ctx, cfg, hs.URL)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "pysandbox-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	upFile := filepath.Join(dir, "upstreams.json")
	doc, _ := json.Marshal(map[string]any{"mcpServers": map[string]any{"bench": map[string]any{"url": hs.URL}}})
	if err := os.WriteFile(upFile, doc, 0o600); err != nil {
		return err
	}
	polFile := filepath.Join(dir, "policy.json")
	if err := os.WriteFile(polFile, []byte(`{"version": "1", "default": "allow", "tools": {"bench.echo": {"limits": [{"counter": "echo", "window": "second", "max": 1000000}]}}}`), 0o600); err != nil {
		return err
	}
	fromPython := func(extra ...string) ([]time.Duration, error) {
		args := append(append(slices.Clip(cfg.ServeArgs), "--upstream", upFile), extra...)
		return toolCallsInRun(ctx, cfg, args)
	}
	plain, err := fromPython()
	if err != nil {
		return err
	}
	governed, err := fromPython("--policy", polFile, "--audit-log", filepath.Join(dir, "audit.log"))
	if err != nil {
		return err
	}
	writeTools(cfg.Out, cfg.N, direct, plain, governed)
	return nil
}

// echoServer is the upstream: one tool that returns its message.
func echoServer(version string) *mcp.Server {
	up := mcp.NewServer(&mcp.Implementation{Name: "bench-upstream", Version: version}, nil)
	mcp.AddTool(up, &mcp.Tool{Name: "echo", Description: "Returns its message."}, func(ctx context.Context, req *mcp.CallToolRequest, in struct {
		Message string `json:"message"`
	}) (*mcp.CallToolResult, struct {
		Echo string `json:"echo"`
	}, error) {
		return nil, struct {
			Echo string `json:"echo"`
		}{in.Message}, nil
	})
	return up
}

// directCalls times the echo tool called by a Go MCP client.
func directCalls(ctx context.Context, cfg Config, url string) ([]time.Duration, error) {
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "pysandbox-bench", Version: cfg.Version}, nil).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url}, nil)
	if err != nil {
		return nil, fmt.Errorf("bench: connect to the upstream: %w", err)
	}
	defer cs.Close()
	return measure(cfg.N, func() error {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"message": "x"}})
		if err == nil && res.IsError {
			err = fmt.Errorf("echo failed: %v", res.Content)
		}
		return err
	})
}

const directRow = "Go MCP client, directly"

// writeTools is the upstream tool calls' table: each row's added p50 and
// ratio to the direct call's.
func writeTools(w io.Writer, n int, direct, plain, governed []time.Duration) {
	fmt.Fprintf(w, "\nupstream tool calls, %d each: a tool of an MCP server on streamable HTTP (loopback) that does nothing\n", n)
	fmt.Fprintf(w, "%-56s %9s %9s %10s\n", "", "p50", "p99", "added p50")
	row := func(name string, d []time.Duration, goal string) {
		fmt.Fprintf(w, "%-56s %9s %9s", name, msd(pct(d, 50)), msd(pct(d, 99)))
		if name != directRow {
			added, x := pct(d, 50)-pct(direct, 50), ratio(pct(d, 50), pct(direct, 50))
			fmt.Fprintf(w, " %9s %.2fx of direct%s", msd(added), x, goalNote(goal, x, millis(added)))
		}
		fmt.Fprintln(w)
	}
	row(directRow, direct, "")
	row("from Python in a run: tools.bench.echo(message=...)", plain, "<= 1ms added")
	row("  the same with --policy (a rate limit) and --audit-log", governed, "")
}

// toolCallsInRun starts this binary as `serve --upstream ...` and has one
// run time n calls from Python.
func toolCallsInRun(ctx context.Context, cfg Config, args []string) ([]time.Duration, error) {
	cs, err := serveStdio(ctx, cfg, args)
	if err != nil {
		return nil, err
	}
	defer cs.Close()
	code := strings.Replace(toolsCode, "COUNT", fmt.Sprint(cfg.N), 1)
	deadline := time.Now().Add(time.Minute)
	for {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": code, "timeout_seconds": 300}})
		if err != nil {
			return nil, err
		}
		d, status, stderr := runDurations(res.StructuredContent, cfg.N)
		if d != nil {
			return d, nil
		}
		// The upstream connects in the background: until it has, the
		// run finds no tools.bench.
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("bench: the run calling the upstream tool ended %s: %s", status, stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// runDurations reads the n durations, in seconds, a successful run of
// toolsCode returned, sorted; nil with its status and stderr otherwise.
func runDurations(structured any, n int) (d []time.Duration, status, stderr string) {
	var r struct {
		Status      string    `json:"status"`
		ReturnValue []float64 `json:"return_value"`
		Stderr      string    `json:"stderr"`
	}
	data, _ := json.Marshal(structured)
	json.Unmarshal(data, &r)
	if r.Status != "success" || len(r.ReturnValue) != n {
		return nil, r.Status, r.Stderr
	}
	d = make([]time.Duration, n)
	for i, s := range r.ReturnValue {
		d[i] = time.Duration(s * float64(time.Second))
	}
	slices.Sort(d)
	return d, r.Status, r.Stderr
}
