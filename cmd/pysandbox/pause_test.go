package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// callJSON calls a tool and returns whether it failed, its text and its
// structured result.
func callJSON(_ context.Context, t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) (bool, string, map[string]any) {
	t.Helper()
	res, out := callTool(t, cs, name, args)
	return res.IsError, toolText(res), out
}

// stopWith sends sig to the server and waits for it to exit.
func stopWith(t *testing.T, pid int, sig syscall.Signal) {
	t.Helper()
	p, _ := os.FindProcess(pid)
	p.Signal(sig)
	deadline := time.Now().Add(2 * time.Minute) // guards a hang only
	for time.Now().Before(deadline) {
		if p.Signal(syscall.Signal(0)) != nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("the server did not stop")
}

const sessionState = `
import numpy as np
rows = [{"i": i, "name": "row%d" % i, "sq": i * i} for i in range(1000)]
scale = 3
def total(xs, k=2):
    return sum(r["sq"] for r in xs) * k * scale
class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y
    def norm2(self):
        return self.x * self.x + self.y * self.y
p = Point(3, 4)
arr = np.arange(10000, dtype=np.float64).reshape(100, 100)
with open("notes.txt", "w") as f:
    f.write("kept across restarts\n")
log = open("log.txt", "w")
gen = (i for i in range(3))
`

const sessionCheck = `
import os
print(len(rows), rows[999]["sq"], total(rows[:3]), isinstance(p, Point), p.norm2(), float(arr.sum()), open("notes.txt").read().strip(), np.__name__)
print("log" in globals(), "gen" in globals())
`

// TestSessionSurvivesRestart: through the built binary and real clients
// over HTTP with tokens, a session with data, a function, a class
// instance, a numpy array and a file is paused by SIGTERM, and the next
// server on the same state directory resumes it under its id on its
// owner's next call; another token cannot resume it; what could not be
// saved is listed. Then pause_session and resume_session, a snapshot
// edited on disk, the size cap, and the paused time to live.
func TestSessionSurvivesRestart(t *testing.T) {
	requireModule(t, "numpy")
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	const alice, bob = "alice-0123456789abcdef", "bob-0123456789abcdef00"
	os.WriteFile(tokens, []byte("alice "+alice+"\nbob "+bob+"\n"), 0o600)
	state := filepath.Join(dir, "state")
	auditLog := filepath.Join(dir, "audit.log")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // guards a hang only
	defer cancel()
	start := func(extra ...string) (string, int) {
		addr := freePort(t)
		base := "http://" + addr
		cmd, stderr := startServe(t, addr, base, nil, append([]string{"--auth-token-file", tokens, "--state-dir", state, "--audit-log", auditLog, "--log-level", "info"}, extra...)...)
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("server log:\n%s", stderr.String())
			}
		})
		return base, cmd.Process.Pid
	}

	base, pid := start()
	a := connectHTTP(ctx, t, base, alice)
	_, _, out := callJSON(ctx, t, a, "create_session", nil)
	id, _ := out["session_id"].(string)
	if isErr, text, _ := callJSON(ctx, t, a, "run_python", map[string]any{"session_id": id, "code": sessionState}); isErr {
		t.Fatalf("state: %s", text)
	}
	stopWith(t, pid, syscall.SIGTERM)

	base, pid = start()
	a = connectHTTP(ctx, t, base, alice)
	b := connectHTTP(ctx, t, base, bob)
	// Listed as paused for its owner, not for anyone else.
	_, _, list := callJSON(ctx, t, a, "list_sessions", nil)
	if s := sessionsOf(list); len(s) != 1 || s[0]["session_id"] != id || s[0]["state"] != "paused" || s[0]["snapshot_bytes"].(float64) <= 0 {
		t.Errorf("alice's list after the restart: %v", list)
	}
	_, _, list = callJSON(ctx, t, b, "list_sessions", nil)
	if s := sessionsOf(list); len(s) != 0 {
		t.Errorf("bob sees: %v", list)
	}
	for _, tool := range []string{"run_python", "resume_session", "list_files"} {
		args := map[string]any{"session_id": id}
		if tool == "run_python" {
			args["code"] = "print(rows)"
		}
		if isErr, text, _ := callJSON(ctx, t, b, tool, args); !isErr || !strings.Contains(text, "Unknown session") {
			t.Errorf("bob's %s: %v %s", tool, isErr, text)
		}
	}
	// The owner's next call just works, and says what did not come back.
	isErr, text, out := callJSON(ctx, t, a, "run_python", map[string]any{"session_id": id, "code": sessionCheck})
	if isErr || !strings.Contains(text, "1000 998001 30 True 25 49995000.0 kept across restarts numpy") || !strings.Contains(text, "False False") {
		t.Fatalf("after the restart: %v %s", isErr, text)
	}
	resumed, _ := out["resumed"].(string)
	if !strings.Contains(resumed, "resumed from its snapshot") || !strings.Contains(resumed, "log (") || !strings.Contains(resumed, "gen (") {
		t.Errorf("resumed note: %q", resumed)
	}

	// pause_session frees it; resume_session brings it back.
	isErr, text, out = callJSON(ctx, t, a, "pause_session", map[string]any{"session_id": id})
	if isErr || out["paused"] != true || len(out["saved"].([]any)) < 5 {
		t.Fatalf("pause: %s %v", text, out)
	}
	if isErr, text, _ := callJSON(ctx, t, b, "pause_session", map[string]any{"session_id": id}); !isErr || !strings.Contains(text, "Unknown session") {
		t.Errorf("bob's pause: %s", text)
	}
	isErr, text, out = callJSON(ctx, t, a, "resume_session", map[string]any{"session_id": id})
	if isErr || out["resumed"] != true {
		t.Fatalf("resume: %s %v", text, out)
	}
	if isErr, text, _ := callJSON(ctx, t, a, "run_python", map[string]any{"session_id": id, "code": "print(total(rows[:3]), p.norm2())"}); isErr || !strings.Contains(text, "30 25") {
		t.Errorf("after resume_session: %s", text)
	}

	// A snapshot edited on disk is refused, and the session is gone with
	// a reason.
	if isErr, text, _ := callJSON(ctx, t, a, "pause_session", map[string]any{"session_id": id}); isErr {
		t.Fatal(text)
	}
	snap := filepath.Join(state, "sessions", id+".snap")
	data, err := os.ReadFile(snap)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0x20
	os.WriteFile(snap, data, 0o600)
	if isErr, text, _ := callJSON(ctx, t, a, "run_python", map[string]any{"session_id": id, "code": "print(1)"}); !isErr || !strings.Contains(text, "altered") {
		t.Errorf("tampered: %v %s", isErr, text)
	}
	if _, err := os.Stat(snap); !os.IsNotExist(err) {
		t.Errorf("the tampered snapshot is still there: %v", err)
	}
	stopWith(t, pid, syscall.SIGTERM)

	// The size cap: a session bigger than --max-snapshot is not paused and
	// keeps running. The paused time to live deletes a paused session.
	base, pid = start("--max-snapshot", "1MiB", "--paused-ttl", "2s")
	a = connectHTTP(ctx, t, base, alice)
	_, _, out = callJSON(ctx, t, a, "create_session", nil)
	big, _ := out["session_id"].(string)
	callJSON(ctx, t, a, "run_python", map[string]any{"session_id": big, "code": "blob = bytes(3 << 20)"})
	if isErr, text, _ := callJSON(ctx, t, a, "pause_session", map[string]any{"session_id": big}); !isErr || !strings.Contains(text, "too big") {
		t.Errorf("over the cap: %v %s", isErr, text)
	}
	if isErr, text, _ := callJSON(ctx, t, a, "run_python", map[string]any{"session_id": big, "code": "print(len(blob))"}); isErr || !strings.Contains(text, "3145728") {
		t.Errorf("after a refused pause: %s", text)
	}
	callJSON(ctx, t, a, "run_python", map[string]any{"session_id": big, "code": "del blob"})
	if isErr, text, _ := callJSON(ctx, t, a, "pause_session", map[string]any{"session_id": big}); isErr {
		t.Fatalf("small pause: %s", text)
	}
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(filepath.Join(state, "sessions", big+".snap")); os.IsNotExist(err) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if isErr, text, _ := callJSON(ctx, t, a, "resume_session", map[string]any{"session_id": big}); !isErr || !strings.Contains(text, "not resumed within") {
		t.Errorf("expired: %v %s", isErr, text)
	}
	stopWith(t, pid, syscall.SIGTERM)

	// Every pause, resume, expiry and refusal is in the audit log.
	seen := map[string]bool{}
	f, _ := os.Open(auditLog)
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r struct{ Event, Decision, Identity string }
		json.Unmarshal(sc.Bytes(), &r)
		if r.Event == "session" {
			seen[r.Decision+" "+r.Identity] = true
		}
	}
	for _, want := range []string{"pause alice", "resume alice", "refuse bob", "refuse alice", "expire alice"} {
		if !seen[want] {
			t.Errorf("no %q session record; have %v", want, seen)
		}
	}
}

func sessionsOf(list map[string]any) []map[string]any {
	var out []map[string]any
	all, _ := list["sessions"].([]any)
	for _, s := range all {
		if m, ok := s.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}

// requireModule skips a test on a machine whose python3 cannot import
// mod (scripts/test.sh installs Debian's python3-pandas, with numpy).
func requireModule(t *testing.T, mod string) {
	t.Helper()
	if err := exec.Command("/usr/bin/python3", "-c", "import "+mod).Run(); err != nil {
		t.Skipf("python3 cannot import %s (apt-get install python3-pandas)", mod)
	}
}

// TestStdioSessionSurvivesClientRestart: a stdio server pauses its
// sessions when its client goes away, and the next server the client
// starts on the same state directory resumes them.
func TestStdioSessionSurvivesClientRestart(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	ctx, cs := serveStdio(t, "--state-dir", state)
	_, _, out := callJSON(ctx, t, cs, "create_session", nil)
	id, _ := out["session_id"].(string)
	if isErr, text, _ := callJSON(ctx, t, cs, "run_python", map[string]any{"session_id": id, "code": "def twice(x):\n    return 2 * x\nkept = twice(21)"}); isErr {
		t.Fatal(text)
	}
	cs.Close() // stdin closed: the client went away
	// The next server starts once the first let go of the directory.
	deadline := time.Now().Add(time.Minute) // guards a hang only
	for {
		ctx, cs = serveStdio(t, "--state-dir", state)
		isErr, text, out := callJSON(ctx, t, cs, "run_python", map[string]any{"session_id": id, "code": "print(kept, twice(5))"})
		if !isErr && strings.Contains(text, "42 10") && strings.Contains(out["resumed"].(string), "resumed from its snapshot") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the client's restart: %s", text)
		}
		cs.Close()
		time.Sleep(200 * time.Millisecond)
	}
}

// TestStdioTwoServersOneStateDir: two servers on one state directory
// (two windows of one client): the second keeps its sessions below the
// directory, can pause them, and when both have gone, the next server
// resumes the sessions of both.
func TestStdioTwoServersOneStateDir(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	ctxA, a := serveStdio(t, "--state-dir", state)
	ids := map[string]string{}
	_, _, out := callJSON(ctxA, t, a, "create_session", nil)
	ids["first"], _ = out["session_id"].(string)
	if isErr, text, _ := callJSON(ctxA, t, a, "run_python", map[string]any{"session_id": ids["first"], "code": "kept = 'first'"}); isErr {
		t.Fatal(text)
	}
	ctxB, b := serveStdio(t, "--state-dir", state)
	_, _, out = callJSON(ctxB, t, b, "create_session", nil)
	ids["second"], _ = out["session_id"].(string)
	if isErr, text, _ := callJSON(ctxB, t, b, "run_python", map[string]any{"session_id": ids["second"], "code": "kept = 'second'"}); isErr {
		t.Fatal(text)
	}
	if isErr, text, _ := callJSON(ctxB, t, b, "pause_session", map[string]any{"session_id": ids["second"]}); isErr {
		t.Fatalf("pause on the second server: %s", text)
	}
	b.Close()
	a.Close()
	deadline := time.Now().Add(time.Minute) // guards a hang only
	for name, id := range ids {
		for {
			ctx, cs := serveStdio(t, "--state-dir", state)
			isErr, text, _ := callJSON(ctx, t, cs, "run_python", map[string]any{"session_id": id, "code": "print(kept)"})
			cs.Close()
			if !isErr && strings.Contains(text, name) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the %s server's session after both stopped: %s", name, text)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// TestStdioDrainInterruptsRun: SIGTERM to a stdio server with a run in
// flight: the drain interrupts the run at --drain-timeout, its caller
// gets the reply, and the session is saved with what its finished runs
// did; the next server resumes it.
func TestStdioDrainInterruptsRun(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // guards a hang only
	defer cancel()
	cmd := exec.Command(binary(t), "serve", "--log-level", "error", "--state-dir", state, "--drain-timeout", "1s")
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	_, _, out := callJSON(ctx, t, cs, "create_session", nil)
	id, _ := out["session_id"].(string)
	callJSON(ctx, t, cs, "run_python", map[string]any{"session_id": id, "code": "done = 'before'"})
	type reply struct {
		isErr bool
		text  string
	}
	got := make(chan reply, 1)
	go func() {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"session_id": id, "code": "import time\ntime.sleep(60)\ndone = 'never'"}})
		if err != nil {
			got <- reply{true, err.Error()}
			return
		}
		got <- reply{res.IsError, toolText(res)}
	}()
	time.Sleep(time.Second) // the run is in flight
	cmd.Process.Signal(syscall.SIGTERM)
	r := <-got
	if !strings.Contains(r.text, "KeyboardInterrupt") {
		t.Errorf("the run in flight at the drain: %v %s", r.isErr, r.text)
	}
	cmd.Wait()
	ctx2, cs2 := serveStdio(t, "--state-dir", state)
	if isErr, text, _ := callJSON(ctx2, t, cs2, "run_python", map[string]any{"session_id": id, "code": "print(done)"}); isErr || !strings.Contains(text, "before") {
		t.Errorf("after the restart: %s", text)
	}
}
