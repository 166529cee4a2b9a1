package main

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestBenchInterrupted: Ctrl-C during bench removes what it made (its
// temporary directories, the servers it started) and says so; before,
// the process died where it stood.
func TestBenchInterrupted(t *testing.T) {
	tmp := t.TempDir()
	cmd := exec.Command(binary(t), "bench", "--tools", "-n", "5000")
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// --tools makes its temporary directory (an upstream server's
	// files) first, and keeps it to the end of its many calls.
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		if entries, _ := os.ReadDir(tmp); len(entries) > 0 {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("bench made nothing in TMPDIR in 5 minutes; stderr:\n%s", stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("TMPDIR has an entry after %v", time.Since(deadline.Add(-5*time.Minute)).Round(time.Millisecond))
	interrupted := time.Now()
	cmd.Process.Signal(syscall.SIGINT)
	exited := make(chan error, 1)
	go func() {
		for range lines {
		}
		exited <- cmd.Wait()
	}()
	select {
	case err = <-exited:
	case <-time.After(5 * time.Minute):
		cmd.Process.Kill()
		t.Fatal("bench did not end 5 minutes after its interrupt")
	}
	t.Logf("bench ended %v after its interrupt", time.Since(interrupted).Round(time.Millisecond))
	if err == nil || !strings.Contains(stderr.String(), "interrupted; cleaning up") {
		t.Errorf("exit %v, stderr:\n%s", err, stderr.String())
	}
	if entries, _ := os.ReadDir(tmp); len(entries) != 0 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("left in TMPDIR: %v", names)
	}
}
