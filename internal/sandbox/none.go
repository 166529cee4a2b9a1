package sandbox

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// None runs the worker directly on the host, in a scratch directory, with
// the same scrubbed environment but no isolation at all. It exists for
// machines where no sandbox can work, and must be asked for by name.
type None struct{}

func (None) Kind() Kind { return KindNone }

func (None) Start(ctx context.Context, spec *Spec) (Sandbox, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pysandbox-none-")
	if err != nil {
		return nil, fmt.Errorf("sandbox: scratch dir: %w", err)
	}
	s := &noneSandbox{dir: dir, done: make(chan struct{})}
	ok := false
	defer func() {
		if !ok {
			s.Close()
		}
	}()
	// The worker expects its files at their sandbox paths; here they live
	// under the scratch directory and the arguments are rewritten to match.
	args := append([]string(nil), spec.Args...)
	for _, f := range spec.Files {
		host := filepath.Join(dir, f.Path)
		if err := os.MkdirAll(filepath.Dir(host), 0o755); err != nil {
			return nil, fmt.Errorf("sandbox: %w", err)
		}
		if err := os.WriteFile(host, f.Content, 0o444); err != nil {
			return nil, fmt.Errorf("sandbox: %w", err)
		}
		for i, a := range args {
			if a == f.Path {
				args[i] = host
			}
		}
	}
	work := filepath.Join(dir, "work")
	if err := os.Mkdir(work, 0o755); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	var ctrlChild *os.File
	s.ctrl, ctrlChild, err = controlSocket()
	if err != nil {
		return nil, err
	}
	defer ctrlChild.Close()
	cmd := exec.Command(spec.Python, args...)
	cmd.Env = spec.Env
	cmd.Dir = work
	cmd.Stdout, cmd.Stderr = spec.Stdout, spec.Stderr
	if cmd.Stdout == nil {
		cmd.Stdout = io.Discard
	}
	if cmd.Stderr == nil {
		cmd.Stderr = io.Discard
	}
	cmd.ExtraFiles = []*os.File{ctrlChild}
	// A process group of its own, so a kill reaches the children it started
	// (unless they left the group: nothing here can stop that).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("sandbox: start %s: %w", spec.Python, err)
	}
	s.cmd = cmd
	go s.reap()
	ok = true
	return s, nil
}

type noneSandbox struct {
	cmd       *exec.Cmd
	ctrl      net.Conn
	dir       string
	done      chan struct{}
	exit      Exit
	closeOnce sync.Once
}

func (s *noneSandbox) Control() net.Conn { return s.ctrl }

func (s *noneSandbox) reap() {
	s.cmd.Wait()
	e := exitOf(s.cmd.ProcessState)
	// Take the rest of the group down with the worker.
	syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	s.exit = e
	close(s.done)
}

func (s *noneSandbox) Wait() Exit { <-s.done; return s.exit }

func (s *noneSandbox) Kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	}
}

func (s *noneSandbox) Close() error {
	var err error
	s.closeOnce.Do(func() {
		s.Kill()
		if s.cmd != nil {
			<-s.done
		}
		if s.ctrl != nil {
			s.ctrl.Close()
		}
		err = os.RemoveAll(s.dir)
	})
	return err
}

func (s *noneSandbox) OpenWorkspace() (*os.File, error) {
	return os.Open(filepath.Join(s.dir, "work"))
}

func (s *noneSandbox) Interrupt() error {
	if s.cmd == nil || s.cmd.Process == nil {
		return fmt.Errorf("sandbox: not started")
	}
	return s.cmd.Process.Signal(syscall.SIGINT)
}

// Idle implements Sessioner: an unsandboxed process has no cgroup.
func (s *noneSandbox) Idle(bool) error { return ErrNoCPUControl }
