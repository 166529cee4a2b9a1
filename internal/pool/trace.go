package pool

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// Trace is how one pooled child was made, used and ended, phase by phase:
// what `pysandbox bench --phases` reports. Tracing is off unless
// Config.Trace is set; a traced child does exactly what any child does,
// except that it also times itself.
//
// Everything the child reports is untrusted (it is bounded when read,
// and only ever printed), but it is what the child measured of itself:
// the wall clock is CLOCK_MONOTONIC on both sides, so the child's stamps
// and the server's line up.
type Trace struct {
	// Stamps are the child's own, in order: the zygote's from the request
	// to just before the fork ("zygote.*"), then the child's ("b.*", up to
	// its lockdown and "b.user_paths"). CPU and minor faults count per
	// process, so only differences between stamps of one process mean
	// anything.
	Stamps []Stamp
	// Server are the server's stamps: spawn (the spawn began: cgroup,
	// socket, pipes), sent (the request is with the zygote), spawned (the
	// zygote answered), hello (the child's credentials arrived), joined
	// (the child is in its cgroup), ready (its setup is done), taken (a
	// run took it), exited (its pid 1 is gone: the run replied and
	// exited), ended (and its output is in), closing (the run closed it),
	// closed (its cgroup reset for the next run).
	Server map[string]int64
	// B is the run's pid 1's whole life (setup, run and exit, with
	// whatever it reaped), as the zygote's wait4 saw it.
	B Usage
	// ZygoteCPU is the zygote's CPU time when it answered this spawn
	// (differences between spawns are the zygote's cost per fork).
	ZygoteCPU time.Duration
}

// Stamp is one point of a child's setup.
type Stamp struct {
	Name   string
	Wall   int64 // CLOCK_MONOTONIC, ns
	CPU    int64 // the process's CPU time so far, ns
	Minflt int64 // the process's minor page faults so far
}

// Usage is a process's CPU time and minor page faults.
type Usage struct {
	CPU    time.Duration
	Minflt int64
}

// Monotonic is CLOCK_MONOTONIC in ns, the clock of every stamp.
func Monotonic() int64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

func (c *child) stamp(name string) {
	if c.trace != nil {
		c.traceMu.Lock()
		c.trace.Server[name] = Monotonic()
		c.traceMu.Unlock()
	}
}

const (
	maxStamps      = 64
	maxStampName   = 32
	maxTraceLength = 16 << 10
)

// readTrace reads the child's trace line, which it sends after joining
// its cgroup and before the worker's ready message (which stays unread).
func readTrace(ctx context.Context, conn *net.UnixConn) ([]Stamp, error) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(10 * time.Second)
	}
	conn.SetReadDeadline(deadline)
	defer conn.SetReadDeadline(time.Time{})
	raw, err := conn.SyscallConn()
	if err != nil {
		return nil, err
	}
	buf := make([]byte, maxTraceLength)
	var n int
	var rerr error
	err = raw.Read(func(fd uintptr) bool {
		n, _, rerr = unix.Recvfrom(int(fd), buf, unix.MSG_PEEK|unix.MSG_DONTWAIT)
		if rerr == unix.EAGAIN {
			return false
		}
		return rerr != nil || n == 0 || bytes.IndexByte(buf[:n], '\n') >= 0 || n == len(buf)
	})
	if err == nil {
		err = rerr
	}
	if err != nil {
		return nil, fmt.Errorf("pool: child trace: %w", err)
	}
	i := bytes.IndexByte(buf[:n], '\n')
	if i < 0 {
		return nil, errors.New("pool: child trace: no line")
	}
	// Consume exactly the line: the ready message behind it is the engine's.
	line := buf[:i+1]
	for got := 0; got < len(line); {
		m, err := conn.Read(line[got:])
		if err != nil {
			return nil, fmt.Errorf("pool: child trace: %w", err)
		}
		got += m
	}
	var m struct {
		Op     string  `json:"op"`
		Stamps [][]any `json:"stamps"`
	}
	if err := json.Unmarshal(line, &m); err != nil || m.Op != "trace" {
		return nil, fmt.Errorf("pool: child sent %q instead of its trace", clip(line))
	}
	var out []Stamp
	for _, s := range m.Stamps[:min(len(m.Stamps), maxStamps)] {
		if len(s) != 4 {
			continue
		}
		name, _ := s[0].(string)
		if name == "" || len(name) > maxStampName {
			continue
		}
		num := func(v any) int64 { f, _ := v.(float64); return clamp(int64(f), 1<<62) }
		out = append(out, Stamp{Name: name, Wall: num(s[1]), CPU: num(s[2]), Minflt: num(s[3])})
	}
	return out, nil
}
