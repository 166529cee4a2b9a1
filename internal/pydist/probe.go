package pydist

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pysandbox/pysandbox/internal/sandbox"
)

const noFollow = syscall.O_NOFOLLOW

// probeCode asks an interpreter what it is. It also imports what the
// worker needs at start, so a build that lacks part of its standard
// library fails here, with its own message, rather than in every run.
const probeCode = `import sys, json, ast, asyncio, codeop, traceback, io, os, signal, socket, struct
print(json.dumps([list(sys.version_info[:3]), sys.base_prefix, sys.executable]))`

// probeTimeout bounds the check (an interpreter starts in milliseconds;
// this only guards against one that never does).
const probeTimeout = 60 * time.Second

// probe runs the unpacked interpreter in a sandbox, never on the host: it
// came from the network. It must start, relocated where it is, and say it
// is the version the metadata promised.
func (m *Manager) probe(ctx context.Context, root string, d *Download) error {
	bin := filepath.Join(root, "bin", "python"+d.MajorMinor())
	fi, err := os.Lstat(bin)
	if err != nil {
		return badArchive("has no python/bin/python%s", d.MajorMinor())
	}
	if !fi.Mode().IsRegular() {
		// A link inside the tree (unpack refused the others).
		real, err := filepath.EvalSymlinks(bin)
		if err != nil || !strings.HasPrefix(real, root+"/") {
			return badArchive("has a python/bin/python%s that is not a program in the tree", d.MajorMinor())
		}
		bin = real
	}
	if m.cfg.Backend == nil {
		return fmt.Errorf("pydist: no sandbox to check the interpreter in")
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	out := &capped{max: 4096}
	errOut := &capped{max: 4096}
	spec := &sandbox.Spec{
		Python: bin,
		Prefix: root,
		Args:   []string{"-I", "-S", "-c", probeCode},
		Env:    []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8", "HOME=/tmp", "TMPDIR=/tmp"},
		Limits: m.cfg.Limits,
		Stdout: out,
		Stderr: errOut,
	}
	sb, err := m.cfg.Backend.Start(ctx, spec)
	if err != nil {
		// The sandbox's init reports a program the kernel would not run
		// (not an executable of this machine) as execve's error.
		if msg := err.Error(); strings.Contains(msg, "execve: ") {
			return badArchive("holds an interpreter that does not run here (%s)", lastLine(msg[strings.Index(msg, "execve: "):]))
		}
		return fmt.Errorf("pydist: start a sandbox to check the interpreter: %w", err)
	}
	defer sb.Close()
	if p, ok := sb.(sandbox.Proxied); ok && p.ProxyListener() != nil {
		p.ProxyListener().Close()
	}
	stop := context.AfterFunc(ctx, sb.Kill)
	defer stop()
	exit := sb.Wait()
	if ctx.Err() != nil {
		return badArchive("holds an interpreter that did not start within %s", probeTimeout)
	}
	if exit.Code != 0 {
		msg := lastLine(errOut.String())
		if msg == "" {
			msg = fmt.Sprintf("exit code %d", exit.Code)
			if exit.Signal != 0 {
				msg = "killed by " + exit.Signal.String()
			}
		}
		return badArchive("holds an interpreter that does not run here (%s)", msg)
	}
	var raw []json.RawMessage
	var ver []int
	var prefix, exe string
	if json.Unmarshal(bytes.TrimSpace([]byte(out.String())), &raw) != nil || len(raw) != 3 ||
		json.Unmarshal(raw[0], &ver) != nil || json.Unmarshal(raw[1], &prefix) != nil || json.Unmarshal(raw[2], &exe) != nil || len(ver) != 3 {
		return badArchive("holds an interpreter that answered %.200q when asked its version", out.String())
	}
	if ver[0] != d.Major || ver[1] != d.Minor || ver[2] != d.Patch {
		return badArchive("holds Python %d.%d.%d, not the %s its download metadata names", ver[0], ver[1], ver[2], d.Version())
	}
	if filepath.Clean(prefix) != root {
		return badArchive("holds an interpreter that does not run relocated: its prefix is %.200q, not where it was unpacked", prefix)
	}
	return nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

// capped keeps the first max bytes written to it.
type capped struct {
	mu  sync.Mutex
	max int
	b   bytes.Buffer
}

func (c *capped) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if room := c.max - c.b.Len(); room > 0 {
		c.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (c *capped) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.b.String()
}
