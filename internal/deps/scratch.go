package deps

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/pysandbox/pysandbox/internal/sandbox"
)

// The installer never writes to the host's disk. It installs into
// scratchSite, in the sandbox's own tmpfs, whose size is the run's scratch
// cap (Limits.TmpBytes) and which the memory cgroup charges too; so build
// code (an sdist's, with AllowSdist) can fill that and nothing more. Once
// the installer has exited, the wrapper below, pid 1 of the sandbox, kills
// whatever it left running and says "done CODE" on the control socket; the
// server then copies the tree out through the sandbox's root with
// openat2(RESOLVE_BENEATH) (copy.go), within the room it reserved in the
// cache (reserve.go), and lets the wrapper exit.
const scratchSite = "/work/site"

// scratchWrapper runs the installer (its argv follows) with no
// descriptor but stdio (close_fds), so nothing the install runs can speak
// on the control socket, fd 3.
const scratchWrapper = `
import os, signal, subprocess, sys
try:
    code = subprocess.call(sys.argv[1:], close_fds=True)
except OSError as e:
    print("the installer could not start: %s" % e, file=sys.stderr)
    code = 127
try:
    os.kill(-1, signal.SIGKILL)
except OSError:
    pass
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
os.write(3, b"done %d\n" % code)
os.read(3, 1)
sys.exit(code if 0 <= code < 256 else 1)
`

// collect waits for the wrapper's "done", copies a successful install into
// bdir/site within the room res can hold, and releases the wrapper. A
// sandbox that ends without saying done leaves nothing to copy; Wait then
// tells how it ended.
func (c *Cache) collect(ctx context.Context, sb sandbox.Sandbox, bdir string, res *reservation) error {
	line := make(chan string, 1)
	go func() {
		// The line is "done N": a few bytes, whatever else arrives.
		s, _ := bufio.NewReaderSize(io.LimitReader(sb.Control(), 64), 64).ReadString('\n')
		line <- s
	}()
	var s string
	select {
	case s = <-line:
	case <-ctx.Done():
		return nil // the caller kills the sandbox and reports the timeout
	}
	code, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(s, "done ")))
	if !strings.HasPrefix(s, "done ") || err != nil {
		return nil // it died first: nothing to copy
	}
	defer sb.Control().Write([]byte{'x'})
	if code != 0 {
		return nil
	}
	ssr, ok := sb.(sandbox.Sessioner)
	if !ok {
		return fmt.Errorf("deps: the %s backend cannot hand an install over", c.cfg.Backend.Kind())
	}
	f, err := ssr.OpenWorkspace()
	if err != nil {
		return fmt.Errorf("deps: reach the installer's scratch space: %w", err)
	}
	defer f.Close()
	return c.copyOut(int(f.Fd()), strings.TrimPrefix(scratchSite, "/work/"), filepath.Join(bdir, "site"), res)
}

// envOverhead is what an env takes besides site/: its directory and
// meta.json, a block each.
const envOverhead = 2 * (InodeCost + blockSize)

// copyOut copies the tree src (a name in the directory work) to the new
// directory dst. It looks at the whole tree first: what the copy would
// refuse is refused before anything is copied, and so is a tree that
// would not fit in the cache; otherwise res reserves the most the copy can
// take, and the copy charges it as it goes.
func (c *Cache) copyOut(work int, src, dst string, res *reservation) error {
	open := func() (int, error) {
		fd, err := OpenBeneath(work, src, unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil && !errors.Is(err, unix.ENOENT) {
			return -1, refuse("the installer's target %s is not a directory the server can read: %v", scratchSite, err)
		}
		return fd, err
	}
	fd, err := open()
	if errors.Is(err, unix.ENOENT) {
		return nil // nothing installed: sanitize makes an empty site
	}
	if err != nil {
		return err
	}
	est, err := estimateTree(fd)
	if err != nil {
		return err
	}
	if low := est.low + envOverhead; low > c.cfg.MaxBytes {
		return refuse("the installed packages would take at least %s on disk (%d files and directories, each charged %d bytes besides its blocks), more than the whole cache may hold (%s)", mib(low), est.entries+1, InodeCost, mib(c.cfg.MaxBytes))
	}
	// An estimate over the cap may still fit (it is an upper bound): the
	// copy finds out, growing the reservation to the cap at most.
	if err := res.ensure(min(est.high+envOverhead, c.cfg.MaxBytes)); err != nil {
		return err
	}
	if err := res.charge(envOverhead); err != nil {
		return err
	}
	if fd, err = open(); err != nil {
		return err
	}
	return copyTree(fd, dst, res.charge)
}
