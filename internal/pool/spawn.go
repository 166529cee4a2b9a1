package pool

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pysandbox/pysandbox/internal/sandbox"
	"github.com/pysandbox/pysandbox/internal/sandbox/cgroup"
)

// spawn forks one child and waits until it is a complete sandbox.
//
// A child made ahead of demand (ahead) does its setup at the lowest CPU
// weight, so that refilling the pool never competes with runs for the
// cores; Start gives it a run's weight when it hands it out. (Against the
// processes beside the server, the sandboxes weigh as a whole: see
// cgroup's parent weight, so a refill is not starved by them.)
func (p *Pool) spawn(ctx context.Context, f *flavor, oneshot, ahead bool) (*child, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	c := &child{ended: make(chan struct{}), done: make(chan struct{}), outputDone: make(chan struct{}), onIdleDeath: func() { p.idleDeaths.Add(1); f.kick() }}
	if p.cfg.Trace != nil {
		c.trace, c.onTrace = &Trace{Server: map[string]int64{}}, p.cfg.Trace
		c.stamp("spawn")
	}
	var err error
	var childFiles []*os.File
	defer func() {
		for _, f := range childFiles {
			f.Close()
		}
	}()
	fail := func(e error) (*child, error) {
		if c.exitc == nil {
			// Never reached the zygote: nothing to wait for.
			if c.release != nil {
				c.release()
			}
			if c.ctrl != nil {
				c.ctrl.Close()
			}
			for _, f := range c.pipes {
				f.Close()
			}
			if c.cg != nil {
				p.recycle(c.cg)
			}
			return nil, e
		}
		c.Close()
		return nil, e
	}

	lim := p.cfg.Spec.Limits
	var cgl cgroup.Limits
	if p.cgroups.Memory {
		cgl.MemoryBytes = lim.MemoryBytes
	}
	if p.cgroups.Pids {
		cgl.Pids = lim.MaxProcs
	}
	if p.cgroups.CPU {
		cgl.CPUMilli = lim.CPUMilli
	}
	if cgl.MemoryBytes > 0 || cgl.Pids > 0 || cgl.CPUMilli > 0 {
		select {
		case c.cg = <-p.cgFree:
		default:
			name := fmt.Sprintf("pool-%d-%d", os.Getpid(), childSeq.Add(1))
			if c.cg, err = cgroup.New(name, cgl); err != nil {
				return fail(fmt.Errorf("pool: %w", err))
			}
		}
	}
	c.recycle = p.recycle
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fail(fmt.Errorf("pool: %w", os.NewSyscallError("socketpair", err)))
	}
	// Credentials ride on the child's first message only if we ask for them.
	if err := unix.SetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_PASSCRED, 1); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return fail(fmt.Errorf("pool: %w", os.NewSyscallError("setsockopt(SO_PASSCRED)", err)))
	}
	parent := os.NewFile(uintptr(fds[0]), "control")
	fc, err := net.FileConn(parent)
	parent.Close()
	childFiles = append(childFiles, os.NewFile(uintptr(fds[1]), "control"))
	if err != nil {
		return fail(fmt.Errorf("pool: control socket: %w", err))
	}
	c.ctrl = fc.(*net.UnixConn)
	for _, w := range []*switchWriter{&c.stdout, &c.stderr} {
		r, wr, err := os.Pipe()
		if err != nil {
			return fail(fmt.Errorf("pool: %w", err))
		}
		childFiles = append(childFiles, wr)
		c.pipes = append(c.pipes, r)
		// The last copy to end closes outputDone (no goroutine per child
		// waits for them): the write ends stay ours until the zygote has
		// the child's, so no copy can end before both have begun.
		c.copying.Add(1)
		go func() {
			defer func() {
				if c.copying.Add(-1) == 0 {
					close(c.outputDone)
				}
			}()
			bp := copyBufs.Get().(*[32 << 10]byte)
			defer copyBufs.Put(bp)
			for {
				n, err := r.Read(bp[:])
				if n > 0 {
					w.Write(bp[:n])
				}
				if err != nil {
					return
				}
			}
		}()
	}
	req := spawnRequest{TmpBytes: lim.TmpBytes, Rlimits: p.rlimits, Env: p.env, Oneshot: oneshot, Trace: c.trace != nil}
	if p.cfg.Spec.Proxy {
		req.ProxyPort = sandbox.ProxyPort
	}
	freeUID := func() {}
	if os.Geteuid() == 0 {
		// Distinct host users for live runs (see sandbox.ChildIDBase); the
		// id is free again once the child and all its processes are gone
		// (Close ends them before it releases).
		id, ok := childUIDs.take()
		if !ok {
			return fail(fmt.Errorf("pool: all %d child ids are in use", sandbox.ChildIDCount))
		}
		req.UID = sandbox.ChildIDBase + id
		c.uid = req.UID
		freeUID = func() { childUIDs.put(id) }
	}
	if req.TmpBytes <= 0 {
		req.TmpBytes = 256 << 20
	}
	z, err := f.zygote(ctx, p)
	if err != nil {
		freeUID()
		return fail(err)
	}
	c.zyg, c.release = z, func() { f.release(z); freeUID() }
	c.stamp("sent")
	sp, err := z.spawn(ctx, req, []int{int(childFiles[0].Fd()), int(childFiles[1].Fd()), int(childFiles[2].Fd())})
	if err != nil {
		// The child may have said why on its control socket.
		c.ctrl.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		buf := make([]byte, 4096)
		if n, _ := c.ctrl.Read(buf); n > 0 {
			err = fmt.Errorf("%w: %s", err, setupError(buf[:n]))
		}
		return fail(err)
	}
	c.exitc = sp.exit
	c.stamp("spawned")
	if c.trace != nil {
		c.trace.ZygoteCPU = sp.zygoteCPU
	}
	c.pidfdSet = make(chan struct{})
	go c.reap()
	// Only the child holds the write ends now: its death closes the pipes.
	for _, f := range childFiles {
		f.Close()
	}
	childFiles = nil

	c.hostPID, err = hello(ctx, c.ctrl)
	c.stamp("hello")
	if err == nil {
		if c.pidfd, err = unix.PidfdOpen(c.hostPID, 0); err != nil {
			err = fmt.Errorf("pool: %w", os.NewSyscallError("pidfd_open", err))
		}
	}
	close(c.pidfdSet) // reap may look at c.pidfd now
	if err != nil {
		return fail(err)
	}
	if c.cg != nil {
		w := uint64(runWeight)
		if ahead {
			w = 1
		}
		c.lowWeight = ahead
		if err := c.cg.SetWeight(w); err != nil {
			return fail(fmt.Errorf("pool: %w", err))
		}
		if err := c.cg.AddProc(c.hostPID); err != nil {
			return fail(fmt.Errorf("pool: %w", err))
		}
	}
	if _, err := c.ctrl.Write([]byte("{\"op\":\"joined\"}\n")); err != nil {
		return fail(fmt.Errorf("pool: %w", err))
	}
	c.stamp("joined")
	if req.ProxyPort != 0 {
		if c.proxy, err = sandbox.RecvProxyListener(ctx, c.ctrl); err != nil {
			return fail(fmt.Errorf("pool: child setup failed: %w", err))
		}
	}
	if c.trace != nil {
		if c.trace.Stamps, err = readTrace(ctx, c.ctrl); err != nil {
			return fail(err)
		}
	}
	if err := awaitReady(ctx, c.ctrl); err != nil {
		return fail(err)
	}
	c.stamp("ready")
	return c, nil
}

// copyBufs are the buffers the output copies read into: a run's output
// is copied through a buffer from here, not one allocated per child.
var copyBufs = sync.Pool{New: func() any { return new([32 << 10]byte) }}

// recycle keeps an empty cgroup for the next run, or deletes it.
func (p *Pool) recycle(g *cgroup.Group) {
	if p.ctx.Err() == nil && g.Reset() == nil {
		select {
		case p.cgFree <- g:
			return
		default:
		}
	}
	p.cgDropped.Add(1)
	go g.Delete()
}
