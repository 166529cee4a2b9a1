package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Tokens of the replicas measurement: a caller's, and the replicas' own
// (at least 32 characters, as serve asks).
const (
	benchCallerToken  = "bench-caller-0123456789abcdef"
	benchReplicaToken = "bench-replicas-0123456789abcdef0123456789"
)

// replicaCalls compares, in one run, a trivial call on a session (x += 1)
// made at the replica that owns the session with the same call made
// through another replica, which forwards it to the owner. Two replicas
// of this binary (`serve --http --internal-http --store`) share a Redis
// of their own on a unix socket; one real MCP client talks to each, both
// as the same caller. The calls alternate, so both see the same machine.
func replicaCalls(ctx context.Context, cfg Config) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	at, through, err := replicaDurations(ctx, cfg, self)
	if err != nil {
		return err
	}
	writeReplicas(cfg.Out, cfg.N, at, through)
	return nil
}

// replicasIfRedis is the full bench's replicas section: measured when
// redis-server is on PATH, else a line says how to get it.
func replicasIfRedis(ctx context.Context, cfg Config) error {
	if _, err := exec.LookPath("redis-server"); err != nil {
		fmt.Fprintln(cfg.Out, "\n(no redis-server on PATH: the call through another replica is not measured; apt-get install redis-server)")
		return nil
	}
	return replicaCalls(ctx, cfg)
}

// replicaDurations starts the Redis and the two replicas of binary self,
// and times the calls at the owner and through the other, sorted.
func replicaDurations(ctx context.Context, cfg Config, self string) (at, through []time.Duration, err error) {
	dir, err := os.MkdirTemp("", "pysandbox-bench-replicas-")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(dir)
	store, stop, err := startRedis(ctx, dir)
	if err != nil {
		return nil, nil, err
	}
	defer stop()
	tokens, replicaToken := filepath.Join(dir, "tokens"), filepath.Join(dir, "replica-token")
	if err := os.WriteFile(tokens, []byte("bench "+benchCallerToken+"\n"), 0o600); err != nil {
		return nil, nil, err
	}
	if err := os.WriteFile(replicaToken, []byte(benchReplicaToken+"\n"), 0o600); err != nil {
		return nil, nil, err
	}
	var sessions [2]*mcp.ClientSession
	for i, name := range []string{"bench-a", "bench-b"} {
		url, stop, err := startReplica(ctx, self, cfg.ServeArgs, dir, name, store, tokens, replicaToken)
		if err != nil {
			return nil, nil, err
		}
		defer stop()
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "pysandbox-bench", Version: cfg.Version}, nil).Connect(ctx,
			&mcp.StreamableClientTransport{Endpoint: url + "/mcp", HTTPClient: &http.Client{Transport: bearerTransport(benchCallerToken)}}, nil)
		if err != nil {
			return nil, nil, fmt.Errorf("bench: connect to replica %s: %w", name, err)
		}
		defer cs.Close()
		sessions[i] = cs
	}
	return sessionCalls(ctx, cfg.N, sessions[0], sessions[1])
}

// sessionCalls makes a session at owner and times n calls on it at owner
// and n through other, alternating; both sorted.
func sessionCalls(ctx context.Context, n int, owner, other *mcp.ClientSession) (at, through []time.Duration, err error) {
	res, err := owner.CallTool(ctx, &mcp.CallToolParams{Name: "create_session", Arguments: map[string]any{}})
	if err != nil {
		return nil, nil, fmt.Errorf("bench: create_session: %w", err)
	}
	out, _ := res.StructuredContent.(map[string]any)
	id, _ := out["session_id"].(string)
	if res.IsError || id == "" {
		return nil, nil, fmt.Errorf("bench: create_session failed: %s", resultText(res))
	}
	call := func(cs *mcp.ClientSession, code string) error {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": code, "session_id": id}})
		if err != nil {
			return err
		}
		if out, _ := res.StructuredContent.(map[string]any); res.IsError || out["status"] != "success" {
			return fmt.Errorf("bench: a call on the session failed: %s", resultText(res))
		}
		return nil
	}
	// The first calls through each replica connect what the others reuse
	// (the forwarder's connection to the owner among them): not timed.
	if err := call(owner, "x = 0"); err != nil {
		return nil, nil, err
	}
	for range 3 {
		for _, cs := range []*mcp.ClientSession{owner, other} {
			if err := call(cs, "x += 1"); err != nil {
				return nil, nil, err
			}
		}
	}
	for range n {
		for _, cs := range []*mcp.ClientSession{owner, other} {
			start := time.Now()
			if err := call(cs, "x += 1"); err != nil {
				return nil, nil, err
			}
			if cs == owner {
				at = append(at, time.Since(start))
			} else {
				through = append(through, time.Since(start))
			}
		}
	}
	slices.Sort(at)
	slices.Sort(through)
	return at, through, nil
}

// writeReplicas is the replicas' table: the call at the owner, and
// through the other replica with what that adds at p50.
func writeReplicas(w io.Writer, n int, at, through []time.Duration) {
	fmt.Fprintf(w, "\na trivial call on a session (x += 1), %d each, alternating: two replicas (serve --http --internal-http) sharing a Redis, loopback\n", n)
	fmt.Fprintf(w, "%-44s %9s %9s %10s\n", "", "p50", "p99", "added p50")
	fmt.Fprintf(w, "%-44s %9s %9s\n", "at the replica that owns the session", msd(pct(at, 50)), msd(pct(at, 99)))
	added := pct(through, 50) - pct(at, 50)
	fmt.Fprintf(w, "%-44s %9s %9s %10s %.2fx of at the owner%s\n", "through the other replica (forwarded)", msd(pct(through, 50)), msd(pct(through, 99)),
		msd(added), ratio(pct(through, 50), pct(at, 50)), goalNote("<= 1ms added", ratio(pct(through, 50), pct(at, 50)), millis(added)))
}

// startRedis starts redis-server from PATH on a unix socket in dir,
// without persistence; stop kills it.
func startRedis(ctx context.Context, dir string) (url string, stop func(), err error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", nil, errors.New("bench --replicas needs redis-server on PATH, for the replicas' shared store (apt-get install redis-server; or brew install redis)")
	}
	sock := filepath.Join(dir, "redis.sock")
	cmd := exec.CommandContext(ctx, bin, "--port", "0", "--unixsocket", sock, "--unixsocketperm", "700", "--save", "", "--appendonly", "no",
		"--dir", dir, "--loglevel", "warning")
	cmd.Stderr = os.Stderr
	// It dies with this process, whatever ends it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("bench: start redis-server: %w", err)
	}
	stop = func() { cmd.Process.Kill(); cmd.Wait() }
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.Close()
			return "unix://" + sock, stop, nil
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Errorf("bench: redis-server did not listen on %s: %w", sock, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startReplica starts self (this binary) as one replica, named name, on
// a loopback port, with the command line's shared flags, and waits until
// it serves; stop interrupts it and waits for it to end.
func startReplica(ctx context.Context, self string, serveArgs []string, dir, name, store, tokens, replicaToken string) (url string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	args := append([]string{"serve", "--log-level", "error", "--http", addr, "--auth-token-file", tokens, "--store", store,
		"--internal-http", "127.0.0.1:0", "--advertise", "127.0.0.1", "--replica", name, "--replica-token-file", replicaToken,
		// Its own state directory: paused sessions and snapshots stay
		// with the bench.
		"--state-dir", filepath.Join(dir, name)}, serveArgs...)
	cmd := exec.Command(self, args...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("bench: start replica %s: %w", name, err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	stop = func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	}
	url = "http://" + addr
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get(url + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return url, stop, nil
			}
		}
		select {
		case <-exited:
			return "", nil, fmt.Errorf("bench: replica %s exited before it served", name)
		case <-ctx.Done():
			stop()
			return "", nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Errorf("bench: replica %s did not serve within a minute", name)
		}
	}
}

// bearerTransport adds the caller's token to every request.
func bearerTransport(token string) http.RoundTripper {
	return roundTripper(func(r *http.Request) (*http.Response, error) {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+token)
		return http.DefaultTransport.RoundTrip(r)
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// resultText is a tool result's text, for an error.
func resultText(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, t.Text)
		}
	}
	return strings.Join(parts, "\n")
}
