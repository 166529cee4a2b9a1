// Package afterlife checks that nothing of a run goes on once the run has
// answered: the server stops counting it then (its slot is free, its CPU
// time reported), so anything still running would be unaccounted for.
package afterlife

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Code is Python that tries to outlive its run's answer in three ways: a
// daemon thread that never ends, an atexit handler that registers another while atexit handlers run
// (a second pass over them would run it), and a sys.stdout whose flush
// never returns once fd 1 is /dev/null (which the worker makes it just
// before it replies, so a flush after the reply would run it). Each spins
// renaming its thread (the comm the host sees) to marker and a growing
// counter. The run prints "renamed" once its thread's name is seen to
// change.
func Code(marker string) string {
	return fmt.Sprintf(`
import atexit, ctypes, os, stat, sys, threading, time
MARK = %q
prctl = ctypes.CDLL(None).prctl
def spin():
    i = 0
    while True:
        i += 1
        prctl(15, (MARK + str(i %% 10**8)).encode(), 0, 0, 0)  # PR_SET_NAME
def later():
    atexit.register(spin)
atexit.register(later)
NULL = os.stat("/dev/null").st_rdev
class Out:
    def __init__(self, f):
        self.f = f
    def write(self, s):
        return self.f.write(s)
    def flush(self):
        st = os.fstat(1)
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == NULL:
            spin()
        self.f.flush()
    def __getattr__(self, name):
        return getattr(self.f, name)
sys.stdout = Out(sys.stdout)
t = threading.Thread(target=spin, daemon=True)
t.start()
names = set()
for _ in range(200):
    with open("/proc/self/task/%%d/comm" %% t.native_id) as f:
        names.add(f.read())
    if len(names) > 2:
        break
    time.sleep(0.01)
print("renamed" if len(names) > 1 else "not renamed: %%r" %% names)
`, marker)
}

// Threads is a run whose non-daemon thread prints after the main code
// and before the atexit handler, when the run waits for its threads as a
// script's interpreter does; ThreadsOut is what it prints then.
const Threads = `
import atexit, threading, time
atexit.register(print, "atexit")
def work():
    time.sleep(0.2)
    print("thread done")
threading.Thread(target=work).start()
print("main done")
`

// ThreadsOut is the output of Threads.
const ThreadsOut = "main done\nthread done\natexit\n"

// Check fails t if a thread named by Code still changes its name: called
// once the run has answered, it must find every such thread dead (or
// killed and never to run again).
func Check(t testing.TB, marker string) {
	t.Helper()
	first := names(marker)
	// Long enough for a thread that still runs to rename itself many
	// times over, even on a busy machine; a dead one never does.
	time.Sleep(300 * time.Millisecond)
	for path, was := range names(marker) {
		if old, ok := first[path]; ok && old != was {
			t.Errorf("%s still runs after the run answered (%s, then %s)", path, old, was)
		}
	}
}

func names(marker string) map[string]string {
	out := map[string]string{}
	paths, _ := filepath.Glob("/proc/[0-9]*/task/[0-9]*/comm")
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err == nil && strings.HasPrefix(string(b), marker) {
			out[p] = strings.TrimSpace(string(b))
		}
	}
	return out
}
