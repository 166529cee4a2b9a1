package deps

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/pysandbox/pysandbox/internal/sandbox"
	"github.com/pysandbox/pysandbox/internal/workspace"
)

// The installer never writes to the host's disk. It installs into
// scratchSite, in the sandbox's own tmpfs, whose size is the run's scratch
// cap (Limits.TmpBytes) and which the memory cgroup charges too; so build
// code (an sdist's, with AllowSdist) can fill that and nothing more. Once
// the installer has exited, the wrapper below, pid 1 of the sandbox, kills
// whatever it left running and says "done CODE" on the control socket; the
// server then copies the tree out through the sandbox's root with
// openat2(RESOLVE_BENEATH) (internal/workspace), bounded by the cache's
// size, and lets the wrapper exit.
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

// maxScratchFiles bounds the files an install may leave.
const maxScratchFiles = 100_000

// collect waits for the wrapper's "done", copies a successful install into
// bdir/site, and releases the wrapper. A sandbox that ends without saying
// done leaves nothing to copy; Wait then tells how it ended.
func (c *Cache) collect(ctx context.Context, sb sandbox.Sandbox, bdir string) error {
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
	ws, err := workspace.Open(f)
	if err != nil {
		f.Close()
		return fmt.Errorf("deps: %w", err)
	}
	defer ws.Close()
	return copyOut(ws, strings.TrimPrefix(scratchSite, "/work/"), filepath.Join(bdir, "site"), c.cfg.MaxBytes)
}

// copyOut copies the tree at src in ws to the new directory dst: files,
// directories and symlinks (made last, so nothing is written through
// one), at most maxBytes of file data.
func copyOut(ws *workspace.Dir, src, dst string, maxBytes int64) error {
	entries, truncated, err := ws.List(src, maxScratchFiles)
	if err != nil {
		return fmt.Errorf("deps: list the install: %w", err)
	}
	if truncated {
		return &InstallError{Lines: []string{fmt.Sprintf("the install left more than %d files, or a tree too deep to copy", maxScratchFiles)}}
	}
	if err := os.Mkdir(dst, 0o755); err != nil {
		return fmt.Errorf("deps: %w", err)
	}
	var total int64
	var links []workspace.FileInfo
	for _, e := range entries {
		rel, ok := strings.CutPrefix(e.Path, src+"/")
		if !ok {
			continue
		}
		p := filepath.Join(dst, filepath.FromSlash(rel))
		switch e.Type {
		case "dir":
			if err := os.Mkdir(p, 0o755); err != nil {
				return fmt.Errorf("deps: %w", err)
			}
		case "file":
			data, _, err := ws.Read(e.Path, maxBytes-total)
			if err != nil {
				if errors.Is(err, workspace.ErrTooLarge) {
					return &InstallError{Lines: []string{fmt.Sprintf("the installed packages take more than the whole cache may hold (%d bytes)", maxBytes)}}
				}
				return fmt.Errorf("deps: copy the install: %w", err)
			}
			total += int64(len(data))
			if err := writeNew(p, data); err != nil {
				return err
			}
		case "symlink":
			links = append(links, e)
		}
	}
	for _, e := range links {
		rel := strings.TrimPrefix(e.Path, src+"/")
		if err := os.Symlink(e.Target, filepath.Join(dst, filepath.FromSlash(rel))); err != nil {
			return fmt.Errorf("deps: %w", err)
		}
	}
	return nil
}

// writeNew creates a file that must not exist yet, following no symlink.
func writeNew(p string, data []byte) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|noFollow, 0o644)
	if err != nil {
		return fmt.Errorf("deps: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("deps: %w", err)
	}
	return f.Close()
}
