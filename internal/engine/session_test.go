package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/sandbox"
	"github.com/pysandbox/pysandbox/internal/sandbox/cgroup"
	"github.com/pysandbox/pysandbox/internal/workspace"
)

func newSessions(t *testing.T, mod func(*Config), cfg SessionConfig) *Sessions {
	t.Helper()
	e := newEngine(t, func(c *Config) {
		c.MaxTimeout = time.Minute
		if mod != nil {
			mod(c)
		}
		if escPooled {
			poolize(t, c)
		}
	})
	s := e.NewSessions(cfg)
	t.Cleanup(s.Shutdown)
	return s
}

func create(t *testing.T, s *Sessions) string {
	t.Helper()
	info, err := s.Create(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	return info.ID
}

func srun(t *testing.T, s *Sessions, id, code string) *Result {
	t.Helper()
	r, err := s.Run(context.Background(), id, RunRequest{Code: code})
	if err != nil {
		t.Fatalf("run %q: %v", code, err)
	}
	return r
}

// TestSessionRefusesAGate: a session's worker has run the caller's code,
// which can change the facts it reports, so a run gated on its code's
// facts is refused before anything of it runs, the gate never asked.
func TestSessionRefusesAGate(t *testing.T) {
	s := newSessions(t, nil, SessionConfig{})
	id := create(t, s)
	asked := false
	r, err := s.Run(context.Background(), id, RunRequest{Code: "open('ran', 'w').write('x')", Gate: func(context.Context, string, json.RawMessage) string {
		asked = true
		return ""
	}})
	if err == nil || !strings.Contains(err.Error(), "cannot run in a session") || asked {
		t.Fatalf("a gated run in a session: %+v %v (gate asked: %v)", r, err, asked)
	}
	if r := srun(t, s, id, "import os\nos.path.exists('ran')"); r.ReturnValue != false {
		t.Errorf("the refused run's code ran: %+v", r)
	}
}

func TestSessionStatePersists(t *testing.T) {
	s := newSessions(t, nil, SessionConfig{})
	id := create(t, s)
	srun(t, s, id, "import json\nx = 1\nopen('notes.txt', 'w').write('kept')")
	srun(t, s, id, "x += 1")
	r := srun(t, s, id, "print('x is', x)\n[x, json.dumps([1]), open('/work/notes.txt').read()]")
	if r.Status != StatusSuccess || r.Stdout != "x is 2\n" || fmt.Sprint(r.ReturnValue) != "[2 [1] kept]" {
		t.Fatalf("%+v", r)
	}
	// Each run's output is its own.
	r = srun(t, s, id, "print('only this')")
	if r.Stdout != "only this\n" {
		t.Errorf("stdout %q carries earlier output", r.Stdout)
	}
	list := s.List()
	if len(list) != 1 || list[0].Runs != 4 || list[0].ID != id {
		t.Errorf("list %+v", list)
	}
}

func TestSessionsAreIsolated(t *testing.T) {
	s := newSessions(t, nil, SessionConfig{})
	a, b := create(t, s), create(t, s)
	srun(t, s, a, "secret = 'a'\nopen('/work/a.txt', 'w').write('a')\nopen('/tmp/a.tmp', 'w').write('a')")
	r := srun(t, s, b, "import os\n[('secret' in globals()), os.listdir('/work'), os.listdir('/tmp'), os.readlink('/proc/self/ns/pid')]")
	got := fmt.Sprint(r.ReturnValue)
	if !strings.HasPrefix(got, "[false [] [] ") {
		t.Errorf("session b sees session a: %s", got)
	}
}

func TestSessionOutputFloodIsCapped(t *testing.T) {
	s := newSessions(t, func(c *Config) { c.MaxOutput = 4096 }, SessionConfig{})
	id := create(t, s)
	r := srun(t, s, id, "for i in range(4000): print('line', i)")
	if r.Status != StatusOutputLimit || !r.StdoutTruncated || !strings.HasSuffix(r.Stdout, "line 3999\n") || !r.Completed() {
		t.Fatalf("status %s truncated %v tail %q", r.Status, r.StdoutTruncated, r.Stdout[max(0, len(r.Stdout)-40):])
	}
	if r := srun(t, s, id, "print('next')"); r.Stdout != "next\n" {
		t.Errorf("next run's stdout %q", r.Stdout)
	}
}

func TestSessionTimeoutKeepsState(t *testing.T) {
	s := newSessions(t, nil, SessionConfig{})
	id := create(t, s)
	srun(t, s, id, "x = 41")
	start := time.Now()
	r, err := s.Run(context.Background(), id, RunRequest{Code: "import time\ntime.sleep(60)", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// Well under the 60 s sleep: the timeout, not the code, ended it.
	if r.Status != StatusTimeout || time.Since(start) > 30*time.Second {
		t.Fatalf("status %s after %s: %+v", r.Status, time.Since(start), r)
	}
	if r := srun(t, s, id, "x + 1"); fmt.Sprint(r.ReturnValue) != "42" {
		t.Errorf("state lost after a timeout: %+v", r)
	}
	// A return value whose own code hangs as it is encoded (a list
	// subclass's iteration) is interrupted at the timeout like the code
	// itself, and the session lives on (it was killed, found by an
	// attacker with a numpy scalar's item()).
	r, err = s.Run(context.Background(), id, RunRequest{Code: "class L(list):\n    def __iter__(self):\n        while True:\n            pass\nL([1])", Timeout: time.Second})
	if err != nil || r.Status != StatusTimeout {
		t.Fatalf("a hanging return value: %v %+v", err, r)
	}
	if r := srun(t, s, id, "x + 1"); fmt.Sprint(r.ReturnValue) != "42" {
		t.Errorf("state lost after a hanging return value: %+v", r)
	}
}

func TestSessionCrashIsReported(t *testing.T) {
	s := newSessions(t, nil, SessionConfig{})
	id := create(t, s)
	r := srun(t, s, id, "import os\nos._exit(3)")
	if r.Status == StatusSuccess || !strings.Contains(r.Message, "session has ended") {
		t.Fatalf("%+v", r)
	}
	_, err := s.Run(context.Background(), id, RunRequest{Code: "1"})
	var gone *SessionGoneError
	if !errors.As(err, &gone) || !strings.Contains(err.Error(), "code 3") || !strings.Contains(err.Error(), "create_session") {
		t.Fatalf("next call: %v", err)
	}
	// The server keeps serving: a new session works.
	if r := srun(t, s, create(t, s), "1 + 1"); fmt.Sprint(r.ReturnValue) != "2" {
		t.Errorf("%+v", r)
	}
}

func TestSessionSegfaultIsReported(t *testing.T) {
	s := newSessions(t, nil, SessionConfig{})
	id := create(t, s)
	srun(t, s, id, "x = 1")
	r := srun(t, s, id, "import ctypes\nctypes.string_at(0)")
	if r.Status != StatusKilled || !strings.Contains(r.Message, "segmentation fault") {
		t.Fatalf("%+v", r)
	}
	if _, err := s.Run(context.Background(), id, RunRequest{Code: "x"}); err == nil || !strings.Contains(err.Error(), "killed by SIGSEGV (signal 11: segmentation fault)") {
		t.Fatalf("next call: %v", err)
	}
}

func TestSessionMemoryKill(t *testing.T) {
	s := newSessions(t, func(c *Config) { c.Limits.MemoryBytes = 128 << 20 }, SessionConfig{})
	id := create(t, s)
	r := srun(t, s, id, "x = []\nwhile True: x.append(bytearray(10**7))")
	if r.Status != StatusMemoryLimit {
		t.Fatalf("%+v", r)
	}
	// A MemoryError (RLIMIT_AS) leaves the worker alive; an OOM kill does
	// not. Either way the result says memory_limit, and the next call says
	// what happened.
	if _, err := s.Run(context.Background(), id, RunRequest{Code: "1"}); err != nil && !strings.Contains(err.Error(), "memory") {
		t.Errorf("next call: %v", err)
	}
}

// Files in /work are held in memory and count towards a session's memory
// limit: a session that filled /work and then allocated past the limit
// is told so, not only that it used too much memory.
func TestSessionFilesCountTowardsMemory(t *testing.T) {
	if !cgroup.Detect().Memory {
		t.Skip("no cgroup memory limit here: RLIMIT_AS, the fallback, does not count files")
	}
	s := newSessions(t, func(c *Config) { c.Limits.MemoryBytes = 128 << 20; c.Limits.TmpBytes = 256 << 20 }, SessionConfig{})
	id := create(t, s)
	if r := srun(t, s, id, "with open('/work/big', 'wb') as f:\n    for _ in range(100):\n        f.write(b'x' * (1 << 20))"); r.Status != StatusSuccess {
		t.Fatalf("writing 100 MiB into /work: %+v", r)
	}
	r := srun(t, s, id, "b = bytearray(60 << 20)")
	if r.Status != StatusMemoryLimit || !strings.Contains(r.Message, "/work count towards it") {
		t.Fatalf("60 MiB more after 100 MiB of files, with a 128 MiB limit: %+v", r)
	}
}

func TestSessionTTLExpiry(t *testing.T) {
	s := newSessions(t, nil, SessionConfig{})
	info, err := s.Create(context.Background(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	pidNS := sessionPidNS(t, s, info.ID)
	time.Sleep(2500 * time.Millisecond)
	_, err = s.Run(context.Background(), info.ID, RunRequest{Code: "1"})
	if err == nil || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("after the TTL: %v", err)
	}
	waitGone(t, pidNS)
}

func TestSessionCloseAndShutdownCleanUp(t *testing.T) {
	s := newSessions(t, nil, SessionConfig{})
	a, b := create(t, s), create(t, s)
	nsA, nsB := sessionPidNS(t, s, a), sessionPidNS(t, s, b)
	before := escMounts(t)
	if err := s.Close(a); err != nil {
		t.Fatal(err)
	}
	waitGone(t, nsA)
	if _, err := s.Run(context.Background(), a, RunRequest{Code: "1"}); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("run after close: %v", err)
	}
	if err := s.Workspace(a, func(*workspace.Dir) error { return nil }); err == nil {
		t.Error("workspace of a closed session still reachable")
	}
	s.Shutdown()
	waitGone(t, nsB)
	if after := escMounts(t); after != before {
		t.Errorf("host mounts %d → %d", before, after)
	}
	if _, err := s.Run(context.Background(), "s-nonexistent", RunRequest{Code: "1"}); !errors.Is(err, ErrNoSession) {
		t.Errorf("unknown id: %v", err)
	}
}

// sessionPidNS is the pid namespace of a session's worker, seen from the
// host, for leftover checks.
func sessionPidNS(t *testing.T, s *Sessions, id string) string {
	t.Helper()
	r := srun(t, s, id, "import os\nos.readlink('/proc/self/ns/pid')")
	ns, _ := r.ReturnValue.(string)
	if ns == "" {
		t.Fatalf("%+v", r)
	}
	return ns
}

func waitGone(t *testing.T, ns string) {
	t.Helper()
	// Generous: on a loaded machine the kernel takes a while to tear a pid
	// namespace down, and what this looks for would stay for good.
	deadline := time.Now().Add(15 * time.Second)
	for len(escHostProcs(ns)) > 0 {
		if time.Now().After(deadline) {
			var desc []string
			for _, pid := range escHostProcs(ns) {
				stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
				desc = append(desc, strings.TrimSpace(string(stat)))
			}
			t.Fatalf("processes of %s still there:\n%s", ns, strings.Join(desc, "\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Sessions work on the bwrap backend too: state, interrupts, files.
func TestSessionOnBwrap(t *testing.T) {
	b, err := sandbox.NewBwrap()
	if err != nil {
		t.Skipf("bwrap not available: %v", err)
	}
	e := newEngine(t, func(c *Config) { c.Backend = b; c.MaxTimeout = time.Minute })
	s := e.NewSessions(SessionConfig{})
	defer s.Shutdown()
	id := create(t, s)
	srun(t, s, id, "x = 20")
	if r, _ := s.Run(context.Background(), id, RunRequest{Code: "import time\ntime.sleep(30)", Timeout: time.Second}); r == nil || r.Status != StatusTimeout {
		t.Fatalf("timeout: %+v", r)
	}
	if err := s.Workspace(id, func(d *workspace.Dir) error { return d.Write("n.txt", []byte("22"), 10) }); err != nil {
		t.Fatal(err)
	}
	if r := srun(t, s, id, "x + int(open('n.txt').read())"); fmt.Sprint(r.ReturnValue) != "42" {
		t.Fatalf("%+v", r)
	}
}
