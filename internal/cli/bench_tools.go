package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// benchToolsCode times n calls of an upstream tool from Python, inside a
// run, each around the call alone, and returns the durations in seconds.
const benchToolsCode = `
import time, tools
tools.bench.echo(message="warm up")
d = []
for i in range(COUNT):
    t = time.perf_counter()
    tools.bench.echo(message="x")
    d.append(time.perf_counter() - t)
d
`

// benchTools compares, in one run, the round trip of an upstream tool
// call made from Python in a run (worker, control channel, policy,
// audit, the server's MCP client) with the same call made directly by a
// Go MCP client. The upstream is an MCP server of the Go SDK on
// streamable HTTP on the loopback, in this process, used the same way by
// both; its tool does nothing, so the difference is what pysandbox adds.
func benchTools(ctx context.Context, n int, args []string, out io.Writer) error {
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
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return up }, nil))
	defer hs.Close()

	cs, err := mcp.NewClient(&mcp.Implementation{Name: "pysandbox-bench", Version: version}, nil).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: hs.URL}, nil)
	if err != nil {
		return fmt.Errorf("bench: connect to the upstream: %w", err)
	}
	defer cs.Close()
	direct, err := measure(n, func() error {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"message": "x"}})
		if err == nil && res.IsError {
			err = fmt.Errorf("echo failed: %v", res.Content)
		}
		return err
	})
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
		return benchToolsInRun(ctx, n, append(append(filterBenchFlags(args), "--upstream", upFile), extra...))
	}
	plain, err := fromPython()
	if err != nil {
		return err
	}
	governed, err := fromPython("--policy", polFile, "--audit-log", filepath.Join(dir, "audit.log"))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\nupstream tool calls, %d each: a tool of an MCP server on streamable HTTP (loopback) that does nothing\n", n)
	fmt.Fprintf(out, "%-56s %9s %9s %10s\n", "", "p50", "p99", "added p50")
	row := func(name string, d []time.Duration, goal string) {
		fmt.Fprintf(out, "%-56s %9s %9s", name, msd(pct(d, 50)), msd(pct(d, 99)))
		if name != directRow {
			fmt.Fprintf(out, " %9s %.2fx of direct", msd(pct(d, 50)-pct(direct, 50)), ratio(pct(d, 50), pct(direct, 50)))
			if goal != "" {
				fmt.Fprintf(out, " (goal %s)", goal)
			}
		}
		fmt.Fprintln(out)
	}
	row(directRow, direct, "")
	row("from Python in a run: tools.bench.echo(message=...)", plain, "<= 1ms added")
	row("  the same with --policy (a rate limit) and --audit-log", governed, "")
	return nil
}

const directRow = "Go MCP client, directly"

// benchToolsInRun starts this binary as `serve --upstream ...` and has
// one run time n calls from Python.
func benchToolsInRun(ctx context.Context, n int, args []string) ([]time.Duration, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, append([]string{"serve", "--log-level", "error"}, args...)...)
	cmd.Stderr = os.Stderr
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "pysandbox-bench", Version: version}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		return nil, fmt.Errorf("start MCP server: %w", err)
	}
	defer cs.Close()
	code := strings.Replace(benchToolsCode, "COUNT", fmt.Sprint(n), 1)
	deadline := time.Now().Add(time.Minute)
	for {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": code, "timeout_seconds": 300}})
		if err != nil {
			return nil, err
		}
		var r struct {
			Status      string    `json:"status"`
			ReturnValue []float64 `json:"return_value"`
			Stderr      string    `json:"stderr"`
		}
		data, _ := json.Marshal(res.StructuredContent)
		json.Unmarshal(data, &r)
		if r.Status == "success" && len(r.ReturnValue) == n {
			d := make([]time.Duration, n)
			for i, s := range r.ReturnValue {
				d[i] = time.Duration(s * float64(time.Second))
			}
			slices.Sort(d)
			return d, nil
		}
		// The upstream connects in the background: until it has, the
		// run finds no tools.bench.
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("bench: the run calling the upstream tool ended %s: %s", r.Status, r.Stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
