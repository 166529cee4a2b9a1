package sandbox

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/testutil"
)

func TestBwrapExitStatus(t *testing.T) {
	b := requireBwrap(t)
	for _, tc := range []struct {
		code   string
		exit   int
		signal syscall.Signal
		stderr string
	}{
		{"import sys; sys.stderr.write('bye\\n'); sys.exit(7)", 7, 0, "bye\n"},
		{"import os, signal; os.kill(os.getpid(), signal.SIGKILL)", -1, syscall.SIGKILL, ""},
		{"import os, signal; os.kill(os.getpid(), signal.SIGTERM)", -1, syscall.SIGTERM, ""},
		{"print('ok')", 0, 0, ""},
	} {
		s, _, errb := startBwrap(t, b, tc.code, Limits{MemoryBytes: 128 << 20, MaxProcs: 16})
		e := s.Wait()
		if e.Code != tc.exit || e.Signal != tc.signal || errb.String() != tc.stderr {
			t.Errorf("%s: exit %+v stderr %q, want code %d signal %v stderr %q", tc.code, e, errb, tc.exit, tc.signal, tc.stderr)
		}
		if s.cg != nil && (e.PeakMemoryBytes <= 0 || e.CPUTime <= 0) {
			t.Errorf("%s: no usage figures from the cgroup: %+v", tc.code, e)
		}
		checkGone(t, s)
	}
}

// procsWithArg lists host processes with arg in their argv.
func procsWithArg(arg string) []int {
	return testutil.HostProcs(func(dir string) bool {
		b, err := os.ReadFile(dir + "/cmdline")
		return err == nil && slices.Contains(strings.Split(string(b), "\x00"), arg)
	})
}

func TestBwrapKillEscapedGrandchild(t *testing.T) {
	b := requireBwrap(t)
	tok := make([]byte, 8)
	rand.Read(tok)
	marker := "pysandbox-escape-" + hex.EncodeToString(tok)
	// The marker is assembled at run time, so only the grandchild's argv
	// holds it whole.
	code := fmt.Sprintf(`
import os, sys, time
m = 'pysandbox-esc' + 'ape-' + %q
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, '-c', 'import signal, time; signal.signal(signal.SIGHUP, signal.SIG_IGN); time.sleep(600)', m])
    os._exit(0)
time.sleep(600)
`, hex.EncodeToString(tok))
	s, _, errb := startBwrap(t, b, code, Limits{MemoryBytes: 256 << 20, MaxProcs: 32})
	deadline := time.Now().Add(30 * time.Second)
	var pids []int
	for len(pids) == 0 && time.Now().Before(deadline) {
		pids = procsWithArg(marker)
		time.Sleep(20 * time.Millisecond)
	}
	if len(pids) == 0 {
		t.Fatalf("the escaping grandchild never appeared; stderr: %s", errb)
	}
	s.Kill() // as the engine does on timeout
	e := s.Wait()
	if e.Signal != syscall.SIGKILL {
		t.Errorf("exit %+v, want SIGKILL", e)
	}
	for _, pid := range procsWithArg(marker) {
		if alive(pid) {
			t.Errorf("grandchild %d (%s) survived Kill+Wait", pid, marker)
		}
	}
	checkGone(t, s)
}
