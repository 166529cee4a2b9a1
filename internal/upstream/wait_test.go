package upstream

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/testutil/refservers"
)

// startNow starts the servers without waiting for them: these tests call
// while they connect.
func startNow(t *testing.T, servers map[string]any, o Options) *Manager {
	t.Helper()
	doc, _ := json.Marshal(map[string]any{"mcpServers": servers})
	cfg, err := Parse(doc, "test.json")
	if err != nil {
		t.Fatal(err)
	}
	if o.RestartDelay == 0 {
		o.RestartDelay = 50 * time.Millisecond
	}
	m := Start(cfg, o)
	t.Cleanup(func() { m.Close() })
	return m
}

// slowEverything is server-everything started after a pause of secs.
func slowEverything(t *testing.T, secs string) map[string]any {
	evCmd, evArgs := refservers.Everything(t)
	return map[string]any{"command": "sh", "args": append([]string{"-c", `sleep ` + secs + `; exec "$0" "$@"`, evCmd}, evArgs...)}
}

// TestCallWaitsForStart: a call made at once to a server that takes 3 s
// to start waits for it and succeeds, and Settle waits for every server's
// first attempt, so that a listing taken at once has their tools.
func TestCallWaitsForStart(t *testing.T) {
	m := startNow(t, map[string]any{"slow": slowEverything(t, "3"), "later": slowEverything(t, "3")}, Options{})
	// It sleeps before it serves: it cannot be ready yet.
	if st := status(m, "slow"); st.State != StateConnecting {
		t.Fatalf("just started: %+v", st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		res, err := m.Call(ctx, "slow.echo", json.RawMessage(`{"message": "early"}`))
		if err == nil && !strings.Contains(text(res), "early") {
			err = errors.New("result " + text(res))
		}
		done <- err
	}()
	m.Settle(ctx)
	if _, ok := m.Lookup("later.echo"); !ok {
		t.Errorf("after Settle: %+v", m.Status())
	}
	if err := <-done; err != nil {
		t.Errorf("a call made at once: %v", err)
	}
}

// TestCallToFailedServer: a server that failed is not waited for: the
// call fails at once with the reason and when it is tried again, even
// with a wait far longer than the test.
func TestCallToFailedServer(t *testing.T) {
	m := startNow(t, map[string]any{
		"missing": map[string]any{"command": "/nonexistent/mcp-server"},
		"unset":   map[string]any{"command": "sh", "env": map[string]string{"X": "${PYSANDBOX_TEST_UNSET_VARIABLE}"}},
	}, Options{ConnectWait: time.Hour, RestartDelay: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	_, err := m.Call(ctx, "missing.tool", json.RawMessage(`{}`))
	if err == nil || !errors.Is(err, ErrNotSent) || !strings.Contains(err.Error(), `"missing" failed`) ||
		!strings.Contains(err.Error(), "/nonexistent/mcp-server") || !strings.Contains(err.Error(), "tried again in") {
		t.Errorf("a call to a server whose command fails: %v", err)
	}
	if st := status(m, "missing"); st.State != StateFailed || !strings.Contains(st.Error, "tried again in") {
		t.Errorf("its status: %+v", st)
	}
	if _, err := m.Call(ctx, "unset.tool", json.RawMessage(`{}`)); err == nil || !strings.Contains(err.Error(), "PYSANDBOX_TEST_UNSET_VARIABLE") ||
		!strings.Contains(err.Error(), "not tried again") {
		t.Errorf("a call to an entry that cannot be used: %v", err)
	}
	if ctx.Err() != nil {
		t.Error("the calls waited for a failed server")
	}
}

// TestCallToHungServer: a server that never answers initialize is waited
// for up to ConnectWait (not its connect timeout), and then named as still
// connecting; Settle is bounded the same way; a cancelled call ends its
// wait.
func TestCallToHungServer(t *testing.T) {
	hung := map[string]any{"command": "sh", "args": []string{"-c", "exec sleep 1000"}}
	m := startNow(t, map[string]any{"hung": hung}, Options{ConnectWait: 200 * time.Millisecond, ConnectTimeout: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	_, err := m.Call(ctx, "hung.tool", json.RawMessage(`{}`))
	if err == nil || !errors.Is(err, ErrNotSent) || !strings.Contains(err.Error(), `"hung" is still connecting after 200ms`) {
		t.Errorf("a call to a server that never answers: %v", err)
	}
	if err := m.Await(ctx, "hung.tool"); err == nil || !strings.Contains(err.Error(), "still connecting after 200ms") {
		t.Errorf("Await: %v", err)
	}
	// Bounded by ConnectWait, not by the hour the attempt may take.
	m.Settle(ctx)
	if st := status(m, "hung"); st.State != StateConnecting {
		t.Errorf("after Settle: %+v", st)
	}
	if ctx.Err() != nil {
		t.Fatal("the waits outlasted the test's guard")
	}

	// A wait as long as the attempt ends with the call's context.
	m2 := startNow(t, map[string]any{"hung": hung}, Options{ConnectWait: time.Hour, ConnectTimeout: time.Hour})
	cctx, ccancel := context.WithCancel(ctx)
	time.AfterFunc(100*time.Millisecond, ccancel)
	if _, err := m2.Call(cctx, "hung.tool", json.RawMessage(`{}`)); !errors.Is(err, context.Canceled) || !errors.Is(err, ErrNotSent) {
		t.Errorf("a cancelled call: %v", err)
	}
	sctx, scancel := context.WithCancel(ctx)
	time.AfterFunc(100*time.Millisecond, scancel)
	m2.Settle(sctx)
	if ctx.Err() != nil {
		t.Error("Settle outlived its context")
	}
	// Close ends a wait too.
	go func() {
		time.Sleep(100 * time.Millisecond)
		m2.Close()
	}()
	if _, err := m2.Call(ctx, "hung.tool", json.RawMessage(`{}`)); err == nil || !strings.Contains(err.Error(), "stopping") {
		t.Errorf("a call waiting when the manager closes: %v", err)
	}
}

// TestCallWaitsForRestart: a server that worked and stopped counts as
// connecting until it is back, keeps its tools listed meanwhile, and a
// call made then waits for it. Its restart is held until the test lets
// it go, so the test sees it connecting whatever the machine's speed.
func TestCallWaitsForRestart(t *testing.T) {
	evCmd, evArgs := refservers.Everything(t)
	dir := t.TempDir()
	started, release := filepath.Join(dir, "started"), filepath.Join(dir, "release")
	// The first start writes its pid and serves; a restart waits for the
	// release file first.
	script := `if [ -e "$STARTED" ]; then while [ ! -e "$RELEASE" ]; do sleep 0.05; done; fi; echo $$ > "$STARTED"; exec "$0" "$@"`
	m := start(t, map[string]any{"everything": map[string]any{"command": "sh", "args": append([]string{"-c", script, evCmd}, evArgs...),
		"env": map[string]string{"STARTED": started, "RELEASE": release}}}, Options{ConnectWait: hang})
	st := status(m, "everything")
	if st.State != StateReady {
		t.Fatalf("%+v", st)
	}
	s := m.byName["everything"]
	s.mu.Lock()
	pid := s.pid
	s.mu.Unlock()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the server to notice", func() bool { return status(m, "everything").State != StateReady })
	if now := status(m, "everything"); now.State != StateConnecting || now.Tools != st.Tools || !strings.Contains(now.Error, "stopped") {
		t.Errorf("restarting: %+v", now)
	}
	if _, ok := m.Lookup("everything.echo"); ok {
		t.Error("a tool of a server that is down is callable")
	}
	if len(m.Tools()) != st.Tools {
		t.Errorf("%d tools listed while it restarts, want %d", len(m.Tools()), st.Tools)
	}
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		res, err := m.Call(ctx, "everything.echo", json.RawMessage(`{"message": "back"}`))
		if err == nil && !strings.Contains(text(res), "back") {
			err = errors.New("result " + text(res))
		}
		done <- err
	}()
	// The restart is held: the call is still waiting (it cannot have an
	// answer, and if it failed it would be here).
	time.Sleep(200 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("the call ended while the server was down: %v", err)
	default:
	}
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Errorf("a call made while it restarted: %v", err)
	}
}
