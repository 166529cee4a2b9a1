package cgroup

import (
	"bytes"
	"io"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestMemoryBombV1(t *testing.T) {
	requireV1(t)
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("needs /usr/bin/python3 for the memory bomb")
	}
	const mem = 64 << 20
	g := newGroup(t, Limits{MemoryBytes: mem, Pids: 64})
	var out bytes.Buffer
	cmd := startIn(t, g, &out, &out, "/usr/bin/python3", "-c", `
b = bytearray(200 * 1024 * 1024)
for i in range(0, len(b), 4096):
    b[i] = 1   # touch every page so it is really allocated
print("survived", len(b))
`)
	err := waitTimeout(t, cmd, 60*time.Second)
	if sig := killedBy(err); sig != syscall.SIGKILL {
		t.Fatalf("python3 ended with %v (output %q), want SIGKILL by the OOM killer", err, out.String())
	}
	if strings.Contains(out.String(), "survived") {
		t.Fatalf("python3 printed %q, the limit did not hold", out.String())
	}
	if !g.OOMKilled() {
		t.Error("OOMKilled = false after an OOM kill")
	}
	st, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Stats after the bomb: %+v", st)
	if st.OOMKills < 1 {
		t.Errorf("OOMKills = %d, want >= 1", st.OOMKills)
	}
	if st.MemoryPeakBytes > mem || st.MemoryPeakBytes < mem/2 {
		t.Errorf("MemoryPeakBytes = %d, want close to the %d limit", st.MemoryPeakBytes, mem)
	}
	// The cheap readers the pool uses for every run agree with Stats.
	f, err := g.Figures()
	if err != nil || f.MemoryPeakBytes != st.MemoryPeakBytes || f.OOMKills != st.OOMKills || f.CPUUsage != st.CPUUsage || f.CPUUsage <= 0 {
		t.Errorf("Figures %+v (%v), Stats %+v", f, err, st)
	}
	// The charge still falls for a moment after the kill, as the kernel
	// frees what the process held: MemoryCurrent must read between two
	// Stats read around it (tried a few times, for the moment it settles).
	for try := 0; ; try++ {
		before, _ := g.Stats()
		m, err := g.MemoryCurrent()
		after, _ := g.Stats()
		lo, hi := min(before.MemoryCurrentBytes, after.MemoryCurrentBytes), max(before.MemoryCurrentBytes, after.MemoryCurrentBytes)
		if err == nil && m >= lo && m <= hi {
			break
		}
		if try == 20 {
			t.Errorf("MemoryCurrent %d (%v), Stats around it %d and %d", m, err, before.MemoryCurrentBytes, after.MemoryCurrentBytes)
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if c, err := g.CPUUsage(); err != nil || c != st.CPUUsage {
		t.Errorf("CPUUsage %v (%v), Stats %v", c, err, st.CPUUsage)
	}

	// Reset makes the group as good as new for the next run: no OOM kill,
	// no peak, no CPU time carried over, and the limits still hold.
	if err := g.Reset(); err != nil {
		t.Fatal(err)
	}
	if g.OOMKilled() {
		t.Error("OOMKilled = true right after Reset")
	}
	st, err = g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.OOMKills != 0 || st.MemoryPeakBytes > mem/4 || st.CPUUsage > 10*time.Millisecond {
		t.Errorf("after Reset: %+v", st)
	}
	if f, err := g.Figures(); err != nil || f.OOMKills != 0 || f.MemoryPeakBytes > mem/4 || f.CPUUsage > 10*time.Millisecond {
		t.Errorf("Figures after Reset: %+v (%v)", f, err)
	}
	out.Reset()
	cmd = startIn(t, g, &out, &out, "/usr/bin/python3", "-c", "b = bytearray(200 * 1024 * 1024)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('survived')")
	if sig := killedBy(waitTimeout(t, cmd, 60*time.Second)); sig != syscall.SIGKILL || !g.OOMKilled() {
		t.Errorf("second bomb in the reused group: %v, OOMKilled %v", sig, g.OOMKilled())
	}
	// A group with a process in it is never reset.
	busy := startIn(t, g, io.Discard, io.Discard, "sleep", "30")
	defer busy.Process.Kill()
	waitUntil := time.Now().Add(5 * time.Second)
	for len(g.v1.pids()) == 0 && time.Now().Before(waitUntil) {
		time.Sleep(10 * time.Millisecond)
	}
	if err := g.Reset(); err == nil {
		t.Error("Reset of a group with a process succeeded")
	}
	g.Kill()
}
