// Package testutil holds small helpers shared by the tests and benchmarks
// of several packages. Nothing outside tests imports it.
package testutil

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// SyncBuffer is a bytes.Buffer that output-copying goroutines can write to
// while a test reads it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// SpawnBaseline times `/usr/bin/python3 -c pass`, spawned directly with no
// isolation, in the calling process: the reference every benchmark ratio
// is taken against.
func SpawnBaseline(b testing.TB) time.Duration {
	b.Helper()
	const n = 10
	t := time.Now()
	for range n {
		if err := exec.Command("/usr/bin/python3", "-c", "pass").Run(); err != nil {
			b.Fatal(err)
		}
	}
	return time.Since(t) / n
}

// Golden compares got with the golden file at path, or rewrites the file
// when update is set (each package's -update flag).
func Golden(t testing.TB, path string, got []byte, update bool) {
	t.Helper()
	if update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s is stale (run go test -update if the change is intended)\ngot:\n%s\nwant:\n%s", path, got, want)
	}
}

// ProcStat is what tests read of a host process from /proc/PID/stat.
type ProcStat struct {
	Comm  string
	State byte
	PPid  int
	Start string // start time in clock ticks: with the pid, names a process
}

// Dead reports whether the process has exited and only waits to be reaped.
func (s ProcStat) Dead() bool { return s.State == 'Z' || s.State == 'X' }

// ReadProcStat reads /proc/PID/stat; false when there is no such process.
func ReadProcStat(pid int) (ProcStat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ProcStat{}, false
	}
	// "pid (comm) state ppid ...": comm may hold anything, but its ')' is
	// the last one.
	open, closing := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || closing < open {
		return ProcStat{}, false
	}
	f := strings.Fields(string(b[closing+1:]))
	if len(f) < 20 || len(f[0]) != 1 {
		return ProcStat{}, false
	}
	ppid, _ := strconv.Atoi(f[1])
	return ProcStat{Comm: string(b[open+1 : closing]), State: f[0][0], PPid: ppid, Start: f[19]}, true
}

// HostProcs lists the pids of the host's processes for which keep says
// yes; keep gets the process's /proc directory. Tests use it to find a
// sandbox's processes from outside, or processes that should be gone.
func HostProcs(keep func(procDir string) bool) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, d := range ents {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		if keep("/proc/" + d.Name()) {
			out = append(out, pid)
		}
	}
	return out
}

// Strings converts a decoded JSON list to strings (non-strings become "").
func Strings(v any) []string {
	var out []string
	list, _ := v.([]any)
	for _, x := range list {
		s, _ := x.(string)
		out = append(out, s)
	}
	return out
}

// Bearer is an HTTP transport that sends token as a bearer token on every
// request, over base (nil: http.DefaultTransport).
func Bearer(token string, base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return bearer{token, base}
}

type bearer struct {
	token string
	base  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.base.RoundTrip(r)
}

// ThrowawayUser creates a system user for the test and deletes it after;
// it skips the test when not root (the whole run is then unprivileged).
func ThrowawayUser(t testing.TB) (uid, gid uint32) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("not root: this whole test run is the unprivileged path")
	}
	name := fmt.Sprintf("pysbx%d", os.Getpid()%100000)
	if out, err := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name).CombinedOutput(); err != nil {
		t.Fatalf("useradd: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("userdel", name).Run() })
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	u32 := func(s string) uint32 { n, _ := strconv.Atoi(s); return uint32(n) }
	return u32(u.Uid), u32(u.Gid)
}
