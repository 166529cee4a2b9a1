package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// serveStdio starts this binary as `serve` over stdio with args and
// connects a real SDK client to it.
func serveStdio(ctx context.Context, cfg Config, args []string) (*mcp.ClientSession, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, append([]string{"serve", "--log-level", "error"}, args...)...)
	cmd.Stderr = os.Stderr
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "pysandbox-bench", Version: cfg.Version}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		return nil, fmt.Errorf("start MCP server: %w", err)
	}
	return cs, nil
}

// mcpLatency starts this binary as `serve` over stdio with args and times
// tools/call round trips from a real SDK client: n calls with between()
// before each (not timed), with a progress token and without,
// interleaved, then n back to back.
func mcpLatency(ctx context.Context, cfg Config, args []string, between func() error) (paced, backToBack, withProgress []time.Duration, err error) {
	cs, err := serveStdio(ctx, cfg, args)
	if err != nil {
		return nil, nil, nil, err
	}
	defer cs.Close()
	calls := 0
	call := func(progress bool) func() error {
		return func() error {
			var meta mcp.Meta
			if progress {
				// With a token, the server watches the call (heartbeat
				// and live output): what that costs.
				calls++
				meta = mcp.Meta{"progressToken": fmt.Sprint("bench-", calls)}
			}
			return mcpHello(ctx, cs, meta)
		}
	}
	// Let its pool fill before anything is timed.
	time.Sleep(1500 * time.Millisecond)
	// With and without a token, interleaved, so both see the same machine.
	var plain, tokened []time.Duration
	for range cfg.N {
		for _, p := range []bool{false, true} {
			if err := between(); err != nil {
				return nil, nil, nil, err
			}
			start := time.Now()
			if err := call(p)(); err != nil {
				return nil, nil, nil, err
			}
			if p {
				tokened = append(tokened, time.Since(start))
			} else {
				plain = append(plain, time.Since(start))
			}
		}
	}
	if backToBack, err = measure(cfg.N, call(false)); err != nil {
		return nil, nil, nil, err
	}
	// Sorted, as pct wants them (their p50 and p99 were taken unsorted).
	slices.Sort(plain)
	slices.Sort(tokened)
	return plain, backToBack, tokened, nil
}

// mcpAlternating times print('hi') on several `serve` processes over
// stdio, one call on each in turn (a different one first each round), so
// that every server sees the same machine: the governed servers' ratios to
// an ungoverned one are then not the drift of a busy machine between two
// blocks of calls. Each server has one untimed call first (a gated
// policy's first call derives the code's facts, which later calls find
// kept). The durations come back sorted, one slice per server.
func mcpAlternating(ctx context.Context, cfg Config, servers [][]string, between func() error) ([][]time.Duration, error) {
	var clients []*mcp.ClientSession
	defer func() {
		for _, cs := range clients {
			cs.Close()
		}
	}()
	for _, args := range servers {
		cs, err := serveStdio(ctx, cfg, args)
		if err != nil {
			return nil, err
		}
		clients = append(clients, cs)
	}
	// Let their pools fill before anything is timed.
	time.Sleep(1500 * time.Millisecond)
	for _, cs := range clients {
		if err := mcpHello(ctx, cs, nil); err != nil {
			return nil, err
		}
	}
	out := make([][]time.Duration, len(clients))
	for round := range cfg.N {
		// Each round starts at the next server, so none is always first
		// (or last) after the pause.
		for k := range clients {
			i := (round + k) % len(clients)
			if err := between(); err != nil {
				return nil, err
			}
			start := time.Now()
			if err := mcpHello(ctx, clients[i], nil); err != nil {
				return nil, err
			}
			out[i] = append(out[i], time.Since(start))
		}
	}
	for _, d := range out {
		slices.Sort(d)
	}
	return out, nil
}

// mcpHello is one run_python print('hi') call, with meta (a progress
// token) when set.
func mcpHello(ctx context.Context, cs *mcp.ClientSession, meta mcp.Meta) error {
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "print('hi')"}, Meta: meta})
	if err != nil {
		return err
	}
	if res.IsError {
		return fmt.Errorf("run_python failed: %v", res.Content)
	}
	return nil
}
