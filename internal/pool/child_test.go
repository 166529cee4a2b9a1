package pool

import (
	"context"
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

// TestLateIdleLeavesTheGroupAlone: a session's idle quota set after its
// sandbox was closed (a pause's deferred call did) never reaches the
// group, which another run has by then: the next child in it runs at
// the full quota, not at a thousandth of a CPU.
func TestLateIdleLeavesTheGroupAlone(t *testing.T) {
	_, p := newPooledEngine(t, 1, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := p.Start(ctx, p.cfg.Spec)
	if err != nil {
		t.Fatal(err)
	}
	c := sb.(*child)
	if c.cg == nil || !c.cg.CanIdle() {
		sb.Close()
		t.Skip("no cpu controller for the pool's groups on this machine")
	}
	g := c.cg
	want, _, err := g.CPUQuota()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Idle(true); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := c.Idle(true); err != nil {
		t.Fatal(err)
	}
	if q, _, err := g.CPUQuota(); err == nil && q != want {
		t.Fatalf("the group handed back has quota %d, made with %d", q, want)
	}
}
