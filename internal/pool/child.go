package pool

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pysandbox/pysandbox/internal/sandbox"
	"github.com/pysandbox/pysandbox/internal/sandbox/cgroup"
)

// child is one single-use sandbox forked from the zygote. It implements
// sandbox.Sandbox, so the engine drives it exactly like a cold sandbox.
type child struct {
	ctrl        *net.UnixConn
	proxy       net.Listener // see sandbox.Proxied; nil without Spec.Proxy
	pidfd       int          // pidfd of the run's pid 1, so a kill can never hit a recycled pid
	hostPID     int
	uid         int // its user in the zygote's namespace (root server), 0 otherwise
	cg          *cgroup.Group
	cgMu        sync.Mutex
	cgGone      bool // cg was handed back to the pool (Close)
	exitc       chan exitStatus
	stdout      switchWriter
	stderr      switchWriter
	pipes       []*os.File
	copying     atomic.Int32 // output copies still running
	handed      atomic.Bool  // given to a caller (not idle any more)
	onIdleDeath func()
	recycle     func(*cgroup.Group) // hands the empty cgroup back to the pool
	onClose     func()              // asks the pool to prepare a replacement
	release     func()              // uncounts the child on its zygote
	zyg         *zygote             // the zygote it was forked from
	lowWeight   bool                // set up ahead of demand at the lowest CPU weight
	trace       *Trace              // nil unless Config.Trace is set
	traceMu     sync.Mutex
	onTrace     func(*Trace)
	early       atomic.Pointer[sandbox.Exit] // the figures Figures read for the run's answer

	outputDone chan struct{} // both output streams copied to their end
	ended      chan struct{} // every process gone, output copied, figures read
	pidfdSet   chan struct{} // closed once pidfd is set (or will not be)
	endedExit  sandbox.Exit  // the figures, set before ended is closed
	done       chan struct{} // and the exit status known
	exit       sandbox.Exit
	closeOnce  sync.Once
}

func (c *child) Control() net.Conn { return c.ctrl }

// ProxyListener implements sandbox.Proxied.
func (c *child) ProxyListener() net.Listener { return c.proxy }

// alive reports whether the child's pid 1 still runs. The pidfd answers
// at once; the reaper may not have noticed yet.
func (c *child) alive() bool {
	select {
	case <-c.ended:
		return false
	default:
	}
	if c.pidfd <= 0 {
		return true
	}
	fds := []unix.PollFd{{Fd: int32(c.pidfd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n == 0
}

// attach routes the child's output to the run's writers.
func (c *child) attach(stdout, stderr io.Writer) {
	c.handed.Store(true)
	c.stdout.set(stdout)
	c.stderr.set(stderr)
}

// reap waits until the run's pid 1 is gone (its pidfd says so at once; the
// zygote's report of the exit status comes a little later), then for its
// output, then completes the figures from its cgroup.
func (c *child) reap() {
	var st exitStatus
	gotStatus := false
	<-c.pidfdSet
	if c.pidfd > 0 {
		waitPidfd(c.pidfd)
	} else {
		st, gotStatus = <-c.exitc, true
	}
	c.stamp("exited")
	t := time.NewTimer(2 * time.Second)
	select {
	case <-c.outputDone:
	case <-t.C:
		// Every process of the run is dead (its pid 1 is); a pipe still
		// open can only be ours. Stop copying.
		for _, p := range c.pipes {
			p.Close()
		}
		<-c.outputDone
	}
	t.Stop()
	var e sandbox.Exit
	if early := c.early.Load(); early != nil {
		// The run took its figures when it answered, and they are what it
		// reports; reading the cgroup again would cost every run for
		// nothing.
		e = *early
	} else {
		sandbox.FinalFigures(c.cg, &e)
	}
	// WaitEnded's copy: c.exit is still written below, after ended.
	c.endedExit = e
	c.exit = e
	c.stamp("ended")
	close(c.ended)
	if !gotStatus {
		st = <-c.exitc
	}
	c.exit.Code = st.Code
	if c.trace != nil {
		c.trace.B = st.Usage
	}
	if st.Signal != 0 {
		c.exit.Code, c.exit.Signal = -1, unix.Signal(st.Signal)
	}
	close(c.done)
	if !c.handed.Load() && c.onIdleDeath != nil {
		c.onIdleDeath()
	}
}

// OutputDone implements sandbox.Finisher.
func (c *child) OutputDone() <-chan struct{} { return c.outputDone }

// Figures implements sandbox.Finisher.
func (c *child) Figures() sandbox.Exit {
	var e sandbox.Exit
	sandbox.FinalFigures(c.cg, &e)
	c.early.Store(&e)
	return e
}

// WaitEnded implements sandbox.Ender.
func (c *child) WaitEnded() sandbox.Exit {
	<-c.ended
	return c.endedExit
}

func (c *child) Wait() sandbox.Exit {
	<-c.done
	return c.exit
}

func (c *child) Kill() {
	c.Stop()
	if c.cg != nil {
		c.cg.Kill()
	}
}

// stopGrace is how long Close waits for the run to end by the death of
// its pid 1 before it kills the cgroup's processes one by one.
const stopGrace = time.Second

// end makes sure every process of the run is gone. SIGKILL to pid 1 is
// enough: the kernel kills every other process of its pid namespace, and
// pid 1's exit completes (its pidfd turns readable, and reap closes
// c.ended) only once they are all reaped, so the cgroup is empty then.
// Kill's loop over the cgroup (read every pid, freeze, signal, thaw,
// sleep, again) cost a run 6 ms of wall time and ~1 ms of the server's
// CPU for nothing in that case; it stays the fallback for a child
// without a pidfd, or one whose pid 1 does not die in time (a task stuck
// in uninterruptible sleep).
func (c *child) end() {
	select {
	case <-c.ended:
		return
	default:
	}
	if c.pidfd > 0 {
		c.Stop()
		t := time.NewTimer(stopGrace)
		defer t.Stop()
		select {
		case <-c.ended:
			return
		case <-t.C:
		}
	}
	c.Kill()
	<-c.ended
}

// Stop SIGKILLs pid 1 of the run's namespace, which takes every process
// in it; unlike Kill it does not wait for the cgroup to be empty.
func (c *child) Stop() {
	if c.pidfd > 0 {
		unix.PidfdSendSignal(c.pidfd, unix.SIGKILL, nil, 0)
	}
}

func (c *child) Close() error {
	var err error
	c.closeOnce.Do(func() {
		c.stamp("closing")
		c.end()
		c.ctrl.Close()
		if c.proxy != nil {
			c.proxy.Close()
		}
		if c.pidfd > 0 {
			unix.Close(c.pidfd)
		}
		for _, p := range c.pipes {
			p.Close()
		}
		if c.cg != nil {
			// Nothing is left in it (pid 1 is gone, and with it every
			// process of the run): the next run can have it.
			c.cgMu.Lock()
			c.cgGone = true
			c.cgMu.Unlock()
			c.recycle(c.cg)
		}
		c.stamp("closed")
		if c.trace != nil && c.onTrace != nil {
			go func() { <-c.done; c.onTrace(c.trace) }()
		}
		if c.release != nil {
			c.release()
		}
		if c.onClose != nil {
			c.onClose()
		}
	})
	return err
}

// switchWriter lets the output of a child that was started before its run
// go to the run's writers once the run takes it.
type switchWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *switchWriter) set(w io.Writer) {
	s.mu.Lock()
	s.w = w
	s.mu.Unlock()
}

func (s *switchWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	w := s.w
	s.mu.Unlock()
	if w != nil {
		w.Write(p)
	}
	return len(p), nil
}

// hello reads the child's first message: the kernel-attested credentials
// that tell us its host pid.
func hello(ctx context.Context, conn *net.UnixConn) (int, error) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(10 * time.Second)
	}
	conn.SetReadDeadline(deadline)
	defer conn.SetReadDeadline(time.Time{})
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(unix.SizeofUcred))
	n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
	if err != nil {
		return 0, fmt.Errorf("pool: child did not start: %w", err)
	}
	if !bytes.HasPrefix(buf[:n], []byte(`{"op":"hello"}`)) {
		return 0, fmt.Errorf("pool: child setup failed: %s", setupError(buf[:n]))
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return 0, errors.New("pool: child sent no credentials")
	}
	cred, err := unix.ParseUnixCredentials(&msgs[0])
	if err != nil || cred.Pid <= 0 {
		return 0, errors.New("pool: child sent no credentials")
	}
	return int(cred.Pid), nil
}

// awaitReady waits until the child has finished its setup, without
// consuming the worker's "ready" message, which belongs to the engine.
func awaitReady(ctx context.Context, conn *net.UnixConn) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(10 * time.Second)
	}
	conn.SetReadDeadline(deadline)
	defer conn.SetReadDeadline(time.Time{})
	raw, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	buf := make([]byte, 512)
	var n int
	var rerr error
	err = raw.Read(func(fd uintptr) bool {
		n, _, rerr = unix.Recvfrom(int(fd), buf, unix.MSG_PEEK|unix.MSG_DONTWAIT)
		if rerr == unix.EAGAIN {
			return false // wait until readable
		}
		if rerr == nil && n > 0 && !bytes.Contains(buf[:n], []byte("\n")) && n < len(buf) {
			return false // a partial line: wait for the rest
		}
		return true
	})
	if err == nil {
		err = rerr
	}
	if err != nil {
		return fmt.Errorf("pool: child setup: %w", err)
	}
	if n == 0 {
		return errors.New("pool: child exited during setup")
	}
	if !bytes.HasPrefix(buf[:n], []byte(`{"op":"ready"`)) {
		return fmt.Errorf("pool: child setup failed: %s", setupError(buf[:n]))
	}
	return nil
}

func setupError(line []byte) string {
	var m struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(bytes.TrimSpace(line), &m) == nil && m.Message != "" {
		return clip([]byte(m.Message))
	}
	return fmt.Sprintf("%q", clip(line))
}

// OpenWorkspace implements sandbox.Sessioner.
func (c *child) OpenWorkspace() (*os.File, error) {
	f, err := sandbox.OpenWorkspace(c.hostPID)
	if err != nil {
		return nil, err
	}
	// The pid could have been reused had the child died in between: the
	// pidfd says whether the process we opened through is still ours.
	if !c.alive() {
		f.Close()
		return nil, errors.New("pool: the session's worker has exited")
	}
	return f, nil
}

// Interrupt implements sandbox.Sessioner.
func (c *child) Interrupt() error {
	return os.NewSyscallError("pidfd_send_signal", unix.PidfdSendSignal(c.pidfd, unix.SIGINT, nil, 0))
}

// MemoryCurrent is the memory the child uses now (0 without a cgroup).
func (c *child) MemoryCurrent() int64 { return sandbox.MemoryCurrent(c.cg) }

// Idle implements sandbox.Sessioner.
func (c *child) Idle(idle bool) error {
	// Under the lock Close takes before it hands the group back: a group
	// given to another run must never get this one's quota. A session's
	// pause set the idle quota after the sandbox had gone (a deferred
	// call), and the next run forked into that group got a thousandth of
	// a CPU: a resume took two seconds instead of 20 ms.
	c.cgMu.Lock()
	defer c.cgMu.Unlock()
	if c.cgGone {
		return nil
	}
	return sandbox.Idle(c.cg, idle)
}

// CPUUsage is the CPU time the child used so far (0 without a cgroup).
func (c *child) CPUUsage() time.Duration { return sandbox.CPUUsage(c.cg) }

// waitPidfd returns once the process of pidfd has exited. It waits in
// Go's netpoller on a duplicate of the descriptor (a pidfd turns readable
// when its process exits), rather than in a blocking poll(2) that would
// hold an OS thread per live child; when the duplicate cannot be polled
// that way, it falls back to poll(2).
func waitPidfd(pidfd int) {
	if netpollPidfd(pidfd) == nil {
		return
	}
	for !pidfdExited(pidfd, -1) {
	}
}

// netpollPidfd waits in the netpoller until pidfd's process has exited.
func netpollPidfd(pidfd int) error {
	fd, err := unix.FcntlInt(uintptr(pidfd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return err
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return err
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	return rc.Read(func(fd uintptr) bool { return pidfdExited(int(fd), 0) })
}

// pidfdExited polls fd for up to timeout ms (-1: without a limit) and
// reports whether its process has exited. A failure other than EINTR
// counts as exited: there is nothing left to wait for on fd.
func pidfdExited(fd, timeout int) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, timeout)
	return n > 0 || (err != nil && err != unix.EINTR)
}
