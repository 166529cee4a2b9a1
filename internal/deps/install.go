package deps

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pysandbox/pysandbox/internal/interp"
	"github.com/pysandbox/pysandbox/internal/sandbox"
)

const noFollow = syscall.O_NOFOLLOW

// findLinksMount is where local wheelhouses are inside the installer's
// sandbox, under /.pysandbox, the one reserved tree a bind may go into.
const findLinksMount = "/.pysandbox/find-links"

// maxOutput caps the installer output kept for an InstallError.
const maxOutput = 1 << 20

// build runs the installer for key and publishes the result in envs/.
func (c *Cache) build(st *buildState, key string, py *interp.Interpreter, canon []string) (err error) {
	ctx, cancel := context.WithTimeout(st.ctx, c.cfg.Timeout)
	defer cancel()
	// An earlier flight of ours, or another process, may have finished it
	// between our caller's miss and now.
	if _, err := c.readMeta(key); err == nil {
		return nil
	}
	// The room the build holds in the cache, given back (when the build
	// is not published) only once its directory is deleted.
	res := c.newReservation()
	defer res.release()
	bdir, err := os.MkdirTemp(c.buildDir, key+"-")
	if err != nil {
		return fmt.Errorf("deps: %w", err)
	}
	published := false
	defer func() {
		if !published {
			removeTree(bdir)
		}
	}()
	// World-writable so that the sandbox's uid (a host uid of its own when
	// the server is root) can write; build/ itself is 0700, so no other host
	// user can reach it.
	if err := os.Chmod(bdir, 0o777); err != nil {
		return fmt.Errorf("deps: %w", err)
	}
	spec, err := c.installSpec(py, canon, bdir)
	if err != nil {
		return err
	}
	out := newOutput(maxOutput, st.emit)
	spec.Stdout, spec.Stderr = out, out
	// The installer's output goes with every refusal of ours too.
	start := time.Now()
	defer func() {
		var ie *InstallError
		if errors.As(err, &ie) && ie.Output == "" {
			ie.Output = out.text()
		}
		// The operator's log has the failure too, not only the agent.
		switch {
		case ie != nil:
			// The caller's requirement or the index, not the server: the
			// operator's record, not a warning (run, whose level is warn,
			// prints the error itself).
			c.log.Info("deps: install failed", "key", key, "requirements", canon, "python", py.Version, "why", ie.Summary(), "took", time.Since(start).Round(time.Millisecond))
		case err != nil && !errors.Is(err, errAbandoned):
			c.log.Warn("deps: install failed", "key", key, "requirements", canon, "python", py.Version, "err", err)
		}
	}()
	c.log.Info("deps: installing", "key", key, "requirements", canon, "python", py.Version, "network", spec.Proxy)
	c.installs.Add(1)
	exit, err := c.run(ctx, spec, bdir, res)
	if st.ctx.Err() != nil {
		return errAbandoned
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		ie := c.installError(out, exit, canon, py.Version)
		ie.Lines = append([]string{fmt.Sprintf("the installer did not finish within %s", c.cfg.Timeout)}, ie.Lines...)
		return ie
	}
	if err != nil {
		return err
	}
	if exit.Code != 0 {
		return c.installError(out, exit, canon, py.Version)
	}
	size, err := sanitize(bdir, c.uid, c.gid, c.log)
	if err != nil {
		return err
	}
	env := Env{Key: key, Requirements: canon, Python: py.Version}
	if published, err = c.store(bdir, &env, size, res); err != nil {
		return err
	}
	c.log.Info("deps: installed", "key", key, "requirements", canon, "size", size, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// store publishes a finished build: bdir holds the entry's content (of
// size bytes as the cache charges it) under env's content directory; env
// gets its place, its figure and its dates, its meta.json is written, the
// reservation settled to what it measures, and bdir renamed into envs/.
// It reports whether it was published (see publish).
func (c *Cache) store(bdir string, env *Env, size int64, res *reservation) (bool, error) {
	var bst unix.Stat_t
	if err := unix.Lstat(bdir, &bst); err != nil {
		return false, fmt.Errorf("deps: %w", os.NewSyscallError("lstat", err))
	}
	now := time.Now()
	env.Site = filepath.Join(c.envDir(env.Key), contentDir(env.Kind))
	env.Accounting, env.Created, env.LastUsed = diskAccounting, now, now
	meta, err := sizeMeta(env, size+inodeCharge(&bst))
	if err != nil {
		return false, err
	}
	// What it measures, reserved before it is written (a copy reserved an
	// estimate; the none backend's installer wrote to the host).
	if err := res.settle(env.SizeBytes); err != nil {
		return false, err
	}
	if err := writeMeta(filepath.Join(bdir, metaName), meta); err != nil {
		return false, err
	}
	// Readable by the sandboxes it will be mounted into; nothing is
	// writable by anyone but the server.
	if err := os.Chmod(bdir, 0o755); err != nil {
		return false, fmt.Errorf("deps: %w", err)
	}
	return c.publish(bdir, env.Key, res)
}

// run starts the installer's sandbox and waits for it, killing it when ctx
// ends. The sandbox is always closed.
func (c *Cache) run(ctx context.Context, spec *sandbox.Spec, bdir string, res *reservation) (sandbox.Exit, error) {
	sb, err := c.cfg.Backend.Start(ctx, spec)
	if err != nil {
		return sandbox.Exit{}, fmt.Errorf("deps: start installer sandbox: %w", err)
	}
	defer sb.Close()
	// The installer's only way out: the proxy, to the index hosts (and
	// what the operator allowed, for direct URL requirements).
	if p, ok := sb.(sandbox.Proxied); ok && p.ProxyListener() != nil {
		if c.cfg.Network != nil {
			defer c.cfg.Network(p.ProxyListener(), c.cfg.Index.Targets())()
		} else {
			p.ProxyListener().Close()
		}
	}
	if c.cfg.Backend.Kind() != sandbox.KindNone {
		if err := c.collect(ctx, sb, bdir, res); err != nil {
			return sandbox.Exit{}, err
		}
	}
	stop := context.AfterFunc(ctx, sb.Kill)
	defer stop()
	return sb.Wait(), nil
}

// publish renames the finished build to envs/<key>, where it counts
// against the cap instead of res, and reports whether it did. When the key
// already exists as a good env (another process won the race), that one
// is kept and ours is dropped by the caller.
func (c *Cache) publish(bdir, key string, res *reservation) (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	dst := c.envDir(key)
	for try := 0; ; try++ {
		err := os.Rename(bdir, dst)
		if err == nil {
			c.releaseLocked(res)
			return true, nil
		}
		if _, merr := c.readMeta(key); merr == nil {
			return false, nil
		}
		if _, serr := os.Lstat(dst); serr != nil || try > 0 {
			return false, fmt.Errorf("deps: publish environment: %w", err)
		}
		// Something unreadable sits at the key: move it aside and retry.
		trash, terr := os.MkdirTemp(c.trashDir, key+"-")
		if terr != nil {
			return false, fmt.Errorf("deps: %w", terr)
		}
		if rerr := os.Rename(dst, filepath.Join(trash, "env")); rerr != nil {
			removeTree(trash)
			return false, fmt.Errorf("deps: publish environment: %w", rerr)
		}
		go removeTree(trash)
	}
}

// sizeMeta sets env.SizeBytes to base, the charge of everything but
// meta.json, plus meta.json's own, and returns meta.json's content. Its
// charge is reckoned from its length (an inode and whole blocks) since it
// holds the figure itself.
func sizeMeta(env *Env, base int64) ([]byte, error) {
	// From the least it can be, the figure only grows (a longer number
	// never makes the file shorter), so this ends.
	env.SizeBytes = base + InodeCost + blockSize
	for {
		data, err := json.MarshalIndent(env, "", "  ")
		if err != nil {
			return nil, fmt.Errorf("deps: %w", err)
		}
		data = append(data, '\n')
		size := base + InodeCost + roundBlock(int64(len(data)))
		if size == env.SizeBytes {
			return data, nil
		}
		env.SizeBytes = size
	}
}

func writeMeta(path string, data []byte) error {
	// O_EXCL|O_NOFOLLOW: sanitize has cleared the build's top level, so
	// nothing may be there; if something is, refuse rather than write
	// through it.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|noFollow, 0o644)
	if err != nil {
		return fmt.Errorf("deps: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("deps: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("deps: %w", err)
	}
	return nil
}

// installSpec builds the installer's sandbox: the install goes into the
// sandbox's own size-capped scratch space (/work/site), and is copied out
// once the installer is done (see scratch.go), so no build code writes to
// the host's disk; local find-links read-only below /.pysandbox/find-links,
// and a way out through the server's proxy only when an index must be
// reached (never the host's network).
func (c *Cache) installSpec(py *interp.Interpreter, canon []string, bdir string) (*sandbox.Spec, error) {
	ix := c.cfg.Index
	// The none backend has no mounts: the installer sees host paths.
	direct := c.cfg.Backend.Kind() == sandbox.KindNone
	target := scratchSite
	if direct {
		target = filepath.Join(bdir, "site")
	}
	spec := &sandbox.Spec{
		Python: py.Path,
		Prefix: py.Prefix,
		Env: []string{
			"PATH=/usr/local/bin:/usr/bin:/bin",
			"HOME=/tmp",
			"TMPDIR=/tmp",
			"LANG=C.UTF-8",
			"NO_COLOR=1",
		},
		Limits: c.cfg.Limits,
	}
	var args []string
	if c.uv != "" {
		spec.Python = c.uv
		args = []string{"pip", "install", "--target", target, "--python", py.Path, "--no-cache"}
		spec.Env = append(spec.Env, fmt.Sprintf("UV_HTTP_RETRIES=%d", installRetries))
	} else {
		// -I: no user site, no PYTHON* variables, no cwd on sys.path.
		args = []string{"-I", "-m", "pip", "install", "--target", target,
			"--no-cache-dir", "--disable-pip-version-check", "--no-input",
			"--progress-bar", "off", "--no-color", "--retries", strconv.Itoa(installRetries)}
	}
	if !ix.AllowSdist {
		// Building an sdist runs its setup code; a wheel is only unpacked.
		args = append(args, "--only-binary", ":all:")
	}
	network := false
	if ix.NoIndex {
		args = append(args, "--no-index")
	} else {
		network = true // the default index (PyPI) or the configured ones
		if ix.IndexURL != "" {
			args = append(args, "--index-url", ix.IndexURL)
		}
		for _, u := range ix.ExtraIndexURLs {
			args = append(args, "--extra-index-url", u)
		}
	}
	for i, fl := range ix.FindLinks {
		switch {
		case isHTTPURL(fl):
			network = true
			args = append(args, "--find-links", fl)
		case direct:
			args = append(args, "--find-links", fl)
		default:
			t := findLinksMount + "/" + strconv.Itoa(i)
			spec.Binds = append(spec.Binds, sandbox.Bind{Source: fl, Target: t})
			args = append(args, "--find-links", t)
		}
	}
	if network && !direct {
		spec.Proxy = true
		// No NO_PROXY: nothing in the installer's sandbox is worth
		// reaching directly, and an index on the host's 127.0.0.1 is
		// reached through the proxy like any other.
		u := fmt.Sprintf("http://127.0.0.1:%d", sandbox.ProxyPort)
		spec.Env = append(spec.Env, "HTTP_PROXY="+u, "HTTPS_PROXY="+u, "http_proxy="+u, "https_proxy="+u)
	}
	// "--" ends the options: nothing in a requirement can become a flag.
	args = append(args, "--")
	spec.Args = append(args, canon...)
	if !direct {
		// The interpreter runs the installer under the wrapper that hands
		// the result over (scratch.go).
		spec.Args = append([]string{"-I", "-S", "-c", scratchWrapper, spec.Python}, spec.Args...)
		spec.Python = py.Path
	}
	return spec, nil
}

// installRetries is how often the installer retries a failed connection.
// pip's default, 5 with a doubling back-off, kept a caller waiting 8.7 s
// for the answer that the index cannot be reached (the proxy refuses at
// once when it cannot connect); two still ride out a dropped connection.
const installRetries = 2

// sanitize makes a finished build safe to publish and returns what site/
// takes on disk (InodeCost and the blocks of each distinct inode). The
// installer was untrusted, so whatever it left is checked without
// following a single symlink: only site/ is kept at the top; every file and
// directory becomes the server's, with no setuid/setgid/sticky bits and
// nothing writable by group or others (dirs 0755, files 0644 or 0755);
// anything that is not a regular file, directory or symlink is refused (an
// InstallError), and every symlink that is absolute or resolves outside
// site/ is removed. The sandbox is gone by now (its pid namespace died with
// it), so nothing changes the tree while we look.
func sanitize(bdir string, uid, gid int, log interface{ Warn(string, ...any) }) (int64, error) {
	ents, err := os.ReadDir(bdir)
	if err != nil {
		return 0, fmt.Errorf("deps: %w", err)
	}
	for _, e := range ents {
		if e.Name() != "site" {
			removeTree(filepath.Join(bdir, e.Name()))
		}
	}
	site := filepath.Join(bdir, "site")
	fi, err := os.Lstat(site)
	if errors.Is(err, fs.ErrNotExist) {
		// Nothing to install (every requirement's marker was false): pip
		// then never creates its target. An empty env is still an answer.
		err = os.Mkdir(site, 0o755)
		if err == nil {
			fi, err = os.Lstat(site)
		}
	}
	if err != nil || !fi.IsDir() {
		return 0, errors.New("deps: the installer left no site directory")
	}
	var size int64
	linked := map[devIno]bool{}
	// charge adds what path takes; a hard-linked file counts once.
	charge := func(path string) error {
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return os.NewSyscallError("lstat", err)
		}
		if st.Nlink > 1 && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			k := devIno{st.Dev, st.Ino}
			if linked[k] {
				return nil
			}
			linked[k] = true
		}
		size += inodeCharge(&st)
		return nil
	}
	err = filepath.WalkDir(site, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		typ := d.Type()
		switch {
		case typ.IsDir():
			// Before WalkDir reads it: a mode-0 dir would stop an
			// unprivileged server.
			if err := os.Lchown(path, uid, gid); err != nil {
				return err
			}
			if err := os.Chmod(path, 0o755); err != nil {
				return err
			}
			return charge(path)
		case typ.IsRegular():
			info, err := d.Info()
			if err != nil {
				return err
			}
			if err := os.Lchown(path, uid, gid); err != nil {
				return err
			}
			mode := os.FileMode(0o644)
			if info.Mode().Perm()&0o111 != 0 {
				mode = 0o755
			}
			if err := os.Chmod(path, mode); err != nil {
				return err
			}
			return charge(path)
		case typ&fs.ModeSymlink != 0:
			if !symlinkInside(site, path) {
				log.Warn("deps: removing a symlink that leaves the environment", "path", path)
				return os.Remove(path)
			}
			if err := os.Lchown(path, uid, gid); err != nil {
				return err
			}
			return charge(path)
		default:
			var st unix.Stat_t
			if err := unix.Lstat(path, &st); err != nil {
				return os.NewSyscallError("lstat", err)
			}
			rel, _ := filepath.Rel(site, path)
			return specialFile(filepath.ToSlash(rel), st.Mode)
		}
	})
	var ie *InstallError
	if errors.As(err, &ie) {
		return 0, ie
	}
	if err != nil {
		return 0, fmt.Errorf("deps: check the installed files: %w", err)
	}
	if err := os.Lchown(bdir, uid, gid); err != nil {
		return 0, fmt.Errorf("deps: %w", err)
	}
	return size, nil
}

// maxHops bounds symlink resolution, like the kernel's 40.
const maxHops = 40

// symlinkInside reports whether the symlink at link (inside root) resolves
// to a path inside root. It resolves the way the kernel would, component by
// component, following symlinks inside the tree: a lexical check alone can
// be fooled ("d/../..", where d is itself a link to "sub/x"). A component
// that does not exist ends the walk harmlessly: the env is read-only, so
// it never will.
func symlinkInside(root, link string) bool {
	rel, err := filepath.Rel(root, filepath.Dir(link))
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return false
	}
	var cur []string
	if rel != "." {
		cur = strings.Split(rel, "/")
	}
	target, err := os.Readlink(link)
	if err != nil || filepath.IsAbs(target) {
		return false
	}
	todo := strings.Split(target, "/")
	hops := 1
	for len(todo) > 0 {
		p := todo[0]
		todo = todo[1:]
		switch p {
		case "", ".":
			continue
		case "..":
			if len(cur) == 0 {
				return false
			}
			cur = cur[:len(cur)-1]
			continue
		}
		cur = append(cur, p)
		full := filepath.Join(append([]string{root}, cur...)...)
		fi, err := os.Lstat(full)
		if err != nil {
			return true
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			continue
		}
		if hops++; hops > maxHops {
			return false
		}
		t, err := os.Readlink(full)
		if err != nil || filepath.IsAbs(t) {
			return false
		}
		cur = cur[:len(cur)-1]
		todo = append(strings.Split(t, "/"), todo...)
	}
	return true
}

// removeTree removes path and everything below it. An unprivileged server
// owns what its installer wrote but cannot delete from directories the
// installer made read-only, so on failure it restores u+rwx on every
// directory (never following symlinks) and tries again.
func removeTree(path string) {
	if err := os.RemoveAll(path); err == nil {
		return
	}
	filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			os.Chmod(p, 0o700)
		}
		return nil
	})
	os.RemoveAll(path)
}
