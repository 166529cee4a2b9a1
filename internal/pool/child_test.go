package pool

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// threads is this process's number of OS threads.
func threads(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	t.Fatal("no Threads line in /proc/self/status")
	return 0
}

// TestWaitPidfd: waitPidfd returns once its process has exited, not
// before, and many waits hold no OS thread each (they wait in the
// netpoller, not in a blocking poll(2)).
func TestWaitPidfd(t *testing.T) {
	const n = 64
	var cmds []*exec.Cmd
	var done []chan struct{}
	before := threads(t)
	for range n {
		cmd := exec.Command("sleep", "600")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
		pidfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
		if err != nil {
			cmd.Process.Kill()
			t.Skipf("no pidfd_open here: %v", err)
		}
		t.Cleanup(func() { unix.Close(pidfd) })
		d := make(chan struct{})
		done = append(done, d)
		go func() { waitPidfd(pidfd); close(d) }()
	}
	t.Cleanup(func() {
		for _, c := range cmds {
			c.Process.Kill()
			c.Wait()
		}
	})
	time.Sleep(200 * time.Millisecond)
	for i, d := range done {
		select {
		case <-d:
			t.Fatalf("wait %d returned while its process lives", i)
		default:
		}
	}
	if now := threads(t); now-before >= n/2 {
		t.Errorf("%d waits took %d OS threads more (%d before)", n, now-before, before)
	}
	for i, c := range cmds {
		c.Process.Kill()
		c.Wait()
		select {
		case <-done[i]:
		case <-time.After(time.Minute): // a guard against a hang only
			t.Fatalf("wait %d did not return after its process exited", i)
		}
	}
}
