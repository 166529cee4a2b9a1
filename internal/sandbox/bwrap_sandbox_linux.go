package sandbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pysandbox/pysandbox/internal/sandbox/cgroup"
)

type bwrapSandbox struct {
	bwrap string
	cg    *cgroup.Group
	ctrl  net.Conn

	block *os.File // write end of bwrap's --block-fd

	mu      sync.Mutex
	cmd     *exec.Cmd // the shim, then bwrap's monitor process
	initPid int       // the sandbox's pid 1, in our pid namespace
	pidfd   int       // a pidfd of initPid, or -1

	initSeen   chan struct{} // closed once initPid is known
	status     *os.File      // read end of bwrap's --json-status-fd
	statusDone chan struct{} // closed when it has been read to the end
	execOK     atomic.Bool   // bwrap reported an exit code: the interpreter was exec'd
	stderr     *stderrGate
	pipes      []*os.File     // read ends of stdout and stderr
	copiers    sync.WaitGroup // their copies

	done      chan struct{} // closed when everything has exited and been read
	exit      Exit
	closeOnce sync.Once
	closeErr  error
}

func (s *bwrapSandbox) Control() net.Conn { return s.ctrl }

// readStatus reads bwrap's --json-status-fd: a first document with the
// sandbox's first pid and, when the interpreter was exec'd, a last one with
// its exit code.
func (s *bwrapSandbox) readStatus(r *os.File) {
	defer close(s.statusDone)
	defer r.Close()
	dec := json.NewDecoder(r)
	for {
		var st struct {
			ChildPid *int `json:"child-pid"`
			ExitCode *int `json:"exit-code"`
		}
		if err := dec.Decode(&st); err != nil {
			io.Copy(io.Discard, r)
			return
		}
		if st.ChildPid != nil && *st.ChildPid > 0 {
			s.setInit(*st.ChildPid)
		}
		if st.ExitCode != nil {
			s.execOK.Store(true)
		}
	}
}

func (s *bwrapSandbox) setInit(pid int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.initPid != 0 {
		return
	}
	s.initPid = pid
	// bwrap reports the pid right after clone, while the process is its
	// unreaped child, so the pid cannot have been reused yet.
	if fd, err := unix.PidfdOpen(pid, 0); err == nil {
		s.pidfd = fd
	}
	close(s.initSeen)
}

func (s *bwrapSandbox) killInit() {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.pidfd >= 0:
		unix.PidfdSendSignal(s.pidfd, unix.SIGKILL, nil, 0)
	case s.initPid > 0:
		unix.Kill(s.initPid, unix.SIGKILL)
	}
}

// waitInit waits until the sandbox's pid 1 has exited. The kernel kills and
// reaps every other process of its pid namespace before that.
func (s *bwrapSandbox) waitInit(timeout time.Duration) {
	s.mu.Lock()
	fd, pid := s.pidfd, s.initPid
	s.mu.Unlock()
	deadline := time.Now().Add(timeout)
	if fd >= 0 {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			ms := int(time.Until(deadline) / time.Millisecond)
			if ms <= 0 {
				return
			}
			n, err := unix.Poll(pfd, ms)
			if n > 0 || (err != nil && err != unix.EINTR) {
				return
			}
		}
	}
	for pid > 0 && time.Now().Before(deadline) {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return
		}
		if i := bytes.LastIndexByte(b, ')'); i > 0 && len(b) > i+2 && (b[i+2] == 'Z' || b[i+2] == 'X') {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (s *bwrapSandbox) reap() {
	err := s.cmd.Wait()
	// Only bwrap's monitor held the status descriptor, so it ends now, and
	// with it the last chance to learn the sandbox's pid 1.
	select {
	case <-s.statusDone:
	case <-time.After(bwrapDrainTimeout):
		s.status.Close()
		<-s.statusDone
	}
	// The monitor has exited: pid 1 has a death signal for that, but do not
	// wait for it to be delivered.
	s.killInit()
	s.waitInit(bwrapDrainTimeout)
	e := Exit{Code: -1}
	if ps := s.cmd.ProcessState; ps != nil {
		if ws, ok := ps.Sys().(syscall.WaitStatus); ok {
			switch {
			case ws.Signaled():
				// bwrap itself was killed (Kill).
				e.Signal = ws.Signal()
			case ws.Exited():
				e.Code = ws.ExitStatus()
				// bwrap exits with 128+n when the interpreter was killed
				// by signal n, as a shell does.
				if e.Code > 128 && e.Code <= 128+64 {
					e.Signal = syscall.Signal(e.Code - 128)
					e.Code = -1
				}
			}
		}
	} else if err != nil {
		e.Code = -1
	}
	if s.cg != nil {
		s.cg.Kill() // bwrap's pid 1 is its own reaper, not ours: make sure
	}
	FinalFigures(s.cg, &e)
	copied := make(chan struct{})
	go func() {
		s.copiers.Wait()
		close(copied)
	}()
	select {
	case <-copied:
	case <-time.After(bwrapDrainTimeout):
		// Something outside the sandbox holds a pipe open (it cannot be a
		// process of the sandbox: they are all gone). Stop copying.
		for _, f := range s.pipes {
			f.Close()
		}
		<-copied
	}
	s.exit = e
	close(s.done)
}

func (s *bwrapSandbox) Wait() Exit {
	<-s.done
	return s.exit
}

// Kill SIGKILLs bwrap, the sandbox's pid 1 (which takes its whole pid
// namespace with it) and whatever is in the cgroup.
func (s *bwrapSandbox) Kill() {
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		cmd.Process.Kill()
	}
	s.killInit()
	if s.cg != nil {
		s.cg.Kill()
	}
}

func (s *bwrapSandbox) Close() error {
	s.closeOnce.Do(func() {
		s.Kill()
		s.mu.Lock()
		started := s.cmd != nil
		s.mu.Unlock()
		if started {
			<-s.done
		}
		if s.ctrl != nil {
			s.ctrl.Close()
		}
		if s.block != nil {
			// Only now: on EOF bwrap would go on without RLIMIT_NPROC.
			s.block.Close()
		}
		s.mu.Lock()
		if s.pidfd >= 0 {
			unix.Close(s.pidfd)
			s.pidfd = -1
		}
		s.initPid = 0
		s.mu.Unlock()
		if s.cg != nil {
			s.closeErr = s.cg.Delete()
		}
	})
	return s.closeErr
}

// drain copies r to w until EOF. A failing w does not stop the copy, so the
// sandbox never blocks on a full pipe.
func drain(w io.Writer, r *os.File) {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 && w != nil {
			if _, werr := w.Write(buf[:n]); werr != nil {
				w = nil
			}
		}
		if err != nil {
			r.Close()
			return
		}
	}
}

// stderrGate holds the sandbox's stderr back until the interpreter runs:
// until then it can only be bwrap's own error messages, which belong in
// Start's error.
type stderrGate struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	out  io.Writer
	open bool
}

func (g *stderrGate) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.open {
		g.buf.Write(p)
	} else if g.out != nil {
		if _, err := g.out.Write(p); err != nil {
			g.out = nil
		}
	}
	return len(p), nil
}

// release passes what was held, and everything after it, to w.
func (g *stderrGate) release(w io.Writer) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.open, g.out = true, w
	if w != nil && g.buf.Len() > 0 {
		if _, err := w.Write(g.buf.Bytes()); err != nil {
			g.out = nil
		}
	}
	g.buf = bytes.Buffer{}
}

func (g *stderrGate) held() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	const max = 8 << 10
	b := g.buf.Bytes()
	if len(b) > max {
		b = b[:max]
	}
	return string(b)
}

// OpenWorkspace implements Sessioner: /work is reached through the
// sandbox's pid 1 (bwrap's reaper), which shares the worker's mounts.
func (s *bwrapSandbox) OpenWorkspace() (*os.File, error) {
	s.mu.Lock()
	pid := s.initPid
	s.mu.Unlock()
	return OpenWorkspace(pid)
}

// Interrupt implements Sessioner. Under bwrap the worker is not pid 1 but
// the reaper's only child.
func (s *bwrapSandbox) Interrupt() error {
	s.mu.Lock()
	pid := s.initPid
	s.mu.Unlock()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		return fmt.Errorf("sandbox: find the worker: %w", err)
	}
	fields := strings.Fields(string(b))
	if len(fields) == 0 {
		return errors.New("sandbox: the worker has exited")
	}
	worker, err := strconv.Atoi(fields[0])
	if err != nil {
		return fmt.Errorf("sandbox: find the worker: %w", err)
	}
	return os.NewSyscallError("kill", unix.Kill(worker, unix.SIGINT))
}

// Idle implements Sessioner. bwrap sessions are not held to the idle
// quota: when the server dies, a bwrap session ends by its worker exiting
// on its own (Python's teardown, tens of milliseconds of CPU), which a
// thousandth of a CPU would stretch to minutes. Their processes keep their
// run quota between runs instead.
func (s *bwrapSandbox) Idle(bool) error { return ErrNoCPUControl }

// CPUUsage is the CPU time the sandbox used so far (0 without a cgroup).
func (s *bwrapSandbox) CPUUsage() time.Duration { return CPUUsage(s.cg) }

// MemoryCurrent is the memory the sandbox uses now (0 without a cgroup).
func (s *bwrapSandbox) MemoryCurrent() int64 { return MemoryCurrent(s.cg) }
