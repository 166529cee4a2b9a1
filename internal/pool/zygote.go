package pool

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pysandbox/pysandbox/internal/sandbox"
	"github.com/pysandbox/pysandbox/internal/sandbox/seccomp"
)

// zygote is the Go side of one zygote worker: a sandboxed Python process
// with the preloaded modules imported, which forks a child per request
// (see the zygote section of worker.py). Everything it says is untrusted:
// it runs inside a sandbox, next to the code it forks.
type zygote struct {
	sb   sandbox.Sandbox
	conn *net.UnixConn

	spawnMu sync.Mutex // one spawn in flight: descriptors travel with their line

	mu      sync.Mutex
	replies map[string]chan spawned // by request id
	exits   map[int]chan exitStatus // by child pid (the zygote's view)
	dead    error                   // set when the zygote is gone
	done    chan struct{}

	seq   atomic.Uint64
	Ready zygoteReady

	born    time.Time
	forks   atomic.Int64 // children forked
	live    atomic.Int64 // children (and forks under way) not yet closed
	retired atomic.Bool  // replaced: closed once live is 0
}

// expired reports whether z has served its share: maxRuns forks, or
// maxAge since it started (0: no bound).
func (z *zygote) expired(maxRuns int64, maxAge time.Duration) bool {
	return (maxRuns > 0 && z.forks.Load() >= maxRuns) || (maxAge > 0 && time.Since(z.born) >= maxAge)
}

type zygoteReady struct {
	Op        string            `json:"op"`
	PID       int               `json:"pid"`
	Python    string            `json:"python"`
	Preloaded []string          `json:"preloaded"`
	RSSBytes  int64             `json:"rss_bytes"`
	Failed    map[string]string `json:"failed"`
	// Modules are the top-level modules loaded once the zygote is ready
	// (the worker's own and the preloaded ones).
	Modules []string `json:"modules"`
}

type spawned struct {
	pid  int
	exit chan exitStatus
	// For a traced spawn: the zygote's CPU time so far (see Trace).
	zygoteCPU time.Duration
}

// rusage is the wire form of Usage (from the zygote's wait4), bounded
// when read: only ever shown in `pysandbox bench`.
type rusage struct {
	CPUUS  int64 `json:"cpu_us"`
	Minflt int64 `json:"minflt"`
}

func (r rusage) usage() Usage {
	return Usage{CPU: time.Duration(clamp(r.CPUUS, 1<<40)) * time.Microsecond, Minflt: clamp(r.Minflt, 1<<40)}
}

func clamp(v, hi int64) int64 { return min(max(v, 0), hi) }

// exitStatus is how a child ended, as the zygote saw it (it mirrors the
// run's pid 1).
type exitStatus struct {
	Code   int
	Signal int
	Usage  Usage // the run's pid 1 with what it reaped, for Trace
}

// spawnRequest is sent to the zygote; the descriptors go alongside.
type spawnRequest struct {
	Op string `json:"op"`
	ID string `json:"id"`
	// UID is the child's own id in the zygote's namespace (root server).
	// Right after the id: both change with every spawn, and the zygote
	// parses the rest of the line only when it changes.
	UID      int               `json:"uid,omitempty"`
	TmpBytes int64             `json:"tmp_bytes"`
	Rlimits  [][3]uint64       `json:"rlimits"`
	Env      map[string]string `json:"env"`
	Oneshot  bool              `json:"oneshot"`
	Trace    bool              `json:"trace,omitempty"` // send phase stamps (see Trace)
	// ProxyPort: listen there on 127.0.0.1 once lo is up and hand the
	// socket over (see sandbox.Proxied); 0: no network at all.
	ProxyPort int `json:"proxy_port,omitempty"`
}

// startZygote starts a zygote in a sandbox of backend and waits until it
// has imported preload.
func startZygote(ctx context.Context, backend sandbox.Backend, spec *sandbox.Spec, preload []string) (*zygote, error) {
	sb, err := backend.Start(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("pool: start zygote: %w", err)
	}
	uc, ok := sb.Control().(*net.UnixConn)
	if !ok {
		sb.Close()
		return nil, errors.New("pool: zygote control channel is not a Unix socket")
	}
	z := &zygote{born: time.Now(), sb: sb, conn: uc, replies: map[string]chan spawned{}, exits: map[int]chan exitStatus{}, done: make(chan struct{})}
	prog, err := seccomp.Program()
	if err != nil {
		sb.Close()
		return nil, err
	}
	msg := map[string]any{"op": "zygote", "preload": preload, "seccomp": base64.StdEncoding.EncodeToString(seccomp.Encode(prog)),
		"proc_masks": sandbox.DefaultProcMasks(), "landlock": landlockWritable()}
	if os.Geteuid() == 0 {
		// The zygote maps this block into the user namespace its children
		// are built in (see _zygote_userns in worker.py).
		msg["id_block"] = []int{sandbox.ChildIDBase, sandbox.ChildIDCount}
	}
	init, _ := json.Marshal(msg)
	if _, err := uc.Write(append(init, '\n')); err != nil {
		sb.Close()
		return nil, fmt.Errorf("pool: zygote init: %w", err)
	}
	r := bufio.NewReaderSize(uc, 64<<10)
	readyc := make(chan error, 1)
	go func() {
		line, err := readLine(r)
		if err == nil {
			err = json.Unmarshal(line, &z.Ready)
			if err == nil && z.Ready.Op != "zygote_ready" {
				err = fmt.Errorf("unexpected %q", clip(line))
			}
		}
		readyc <- err
		if err == nil {
			z.readLoop(r)
		}
	}()
	select {
	case err = <-readyc:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		sb.Close()
		return nil, fmt.Errorf("pool: zygote did not start: %w", err)
	}
	return z, nil
}

// readLoop dispatches the zygote's messages until it goes away.
func (z *zygote) readLoop(r *bufio.Reader) {
	var err error
	for {
		var line []byte
		line, err = readLine(r)
		if err != nil {
			break
		}
		var m struct {
			Op     string `json:"op"`
			ID     string `json:"id"`
			PID    int    `json:"pid"`
			Code   *int   `json:"code"`
			Signal int    `json:"signal"`
			rusage
			ZygoteCPU int64 `json:"zygote_cpu_us"`
		}
		if json.Unmarshal(line, &m) != nil {
			continue
		}
		z.mu.Lock()
		switch m.Op {
		case "spawned":
			if c, ok := z.replies[m.ID]; ok && m.PID > 0 {
				delete(z.replies, m.ID)
				// The exit channel exists before anyone can see the pid, so
				// an early exit is never lost.
				ex := make(chan exitStatus, 1)
				z.exits[m.PID] = ex
				sp := spawned{pid: m.PID, exit: ex, zygoteCPU: time.Duration(clamp(m.ZygoteCPU, 1<<40)) * time.Microsecond}
				c <- sp
			}
		case "error":
			// A spawn that failed before the child's sandbox existed.
			if c, ok := z.replies[m.ID]; ok && m.ID != "" {
				delete(z.replies, m.ID)
				close(c)
			}
		case "exited":
			if c, ok := z.exits[m.PID]; ok {
				delete(z.exits, m.PID)
				st := exitStatus{Signal: m.Signal, Usage: m.rusage.usage()}
				if m.Code != nil {
					st.Code = *m.Code
				}
				c <- st
			}
		}
		z.mu.Unlock()
	}
	z.mu.Lock()
	z.dead = fmt.Errorf("pool: zygote exited: %w", err)
	for id, c := range z.replies {
		close(c)
		delete(z.replies, id)
	}
	for pid, c := range z.exits {
		// Every child of a dead zygote is dead too: its sandbox is gone.
		c <- exitStatus{Signal: int(unix.SIGKILL)}
		delete(z.exits, pid)
	}
	z.mu.Unlock()
	close(z.done)
}

// spawn asks for one child with the given descriptors (control socket,
// stdout, stderr) and returns its pid as the zygote sees it.
func (z *zygote) spawn(ctx context.Context, req spawnRequest, fds []int) (spawned, error) {
	z.spawnMu.Lock()
	defer z.spawnMu.Unlock()
	req.Op, req.ID = "spawn", strconv.FormatUint(z.seq.Add(1), 10)
	c := make(chan spawned, 1)
	z.mu.Lock()
	if z.dead != nil {
		z.mu.Unlock()
		return spawned{}, z.dead
	}
	z.replies[req.ID] = c
	z.mu.Unlock()
	line, _ := json.Marshal(req)
	if _, _, err := z.conn.WriteMsgUnix(append(line, '\n'), unix.UnixRights(fds...), nil); err != nil {
		z.mu.Lock()
		delete(z.replies, req.ID)
		z.mu.Unlock()
		return spawned{}, fmt.Errorf("pool: send spawn: %w", err)
	}
	select {
	case s, ok := <-c:
		if !ok {
			return spawned{}, z.err()
		}
		z.forks.Add(1)
		return s, nil
	case <-ctx.Done():
		return spawned{}, ctx.Err()
	}
}

func (z *zygote) err() error {
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.dead != nil {
		return z.dead
	}
	return errors.New("pool: the zygote could not create the child's namespaces")
}

func (z *zygote) close() error {
	z.sb.Kill()
	err := z.sb.Close()
	<-z.done
	return err
}

// landlockWritable is where pool children may write (a variable so that a
// test can narrow it and see Landlock refuse what the mounts allow).
var landlockWritable = sandbox.LandlockWritable

// readLine reads one line, refusing lines longer than 1 MiB: the zygote
// only ever sends short messages.
func readLine(r *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > 1<<20 {
			return nil, errors.New("message too long")
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		return line, err
	}
}

func clip(b []byte) string {
	if len(b) > 200 {
		b = b[:200]
	}
	return string(b)
}
