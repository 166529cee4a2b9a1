package workspace

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The tests in this file play the hostile sandbox: they plant links and
// special files in the workspace (as the sandbox could) and check that no
// Dir method ever reads or writes outside it.

// rel is the relative symlink target from dir ws/<sub> to path p.
func rel(t *testing.T, from, p string) string {
	t.Helper()
	r, err := filepath.Rel(from, p)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// openRead reads path through Open, as a streaming caller would.
func openRead(d *Dir, p string, max int64) ([]byte, FileInfo, error) {
	f, info, err := d.Open(p)
	if err != nil {
		return nil, info, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max))
	return b, info, err
}

// writeFrom is WriteFrom of a string.
func writeFrom(d *Dir, p, content string, max int64) error {
	_, err := d.WriteFrom(p, strings.NewReader(content), max)
	return err
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func TestReadRefusesEscapingSymlinks(t *testing.T) {
	d, ws, out := newWS(t)
	secret := filepath.Join(out, "secret")
	symlink(t, "/etc/passwd", filepath.Join(ws, "passwd"))
	symlink(t, secret, filepath.Join(ws, "abs"))
	symlink(t, rel(t, ws, secret), filepath.Join(ws, "relative"))
	symlink(t, "/etc", filepath.Join(ws, "etc"))
	symlink(t, out, filepath.Join(ws, "outdir"))
	symlink(t, rel(t, ws, out), filepath.Join(ws, "reldir"))
	symlink(t, "/proc/self/root", filepath.Join(ws, "procroot"))
	symlink(t, strings.Repeat("../", 40)+"proc/self/root", filepath.Join(ws, "relprocroot"))
	// A chain: an in-workspace link to a link that escapes.
	symlink(t, "abs", filepath.Join(ws, "chain"))
	os.Mkdir(filepath.Join(ws, "sub"), 0o755)
	symlink(t, "../../../../../../../../../../"+strings.TrimPrefix(secret, "/"), filepath.Join(ws, "sub", "deep"))

	for _, p := range []string{
		"passwd", "abs", "relative", "etc/passwd", "outdir/secret", "reldir/secret",
		"procroot/etc/passwd", "relprocroot/etc/passwd", "chain", "sub/deep",
	} {
		b, _, err := d.Read(p, 1<<20)
		if err == nil || !errors.Is(err, ErrSymlink) {
			t.Errorf("Read(%q) = %q, %v; want ErrSymlink", p, b, err)
		}
		if len(b) != 0 {
			t.Errorf("Read(%q) returned data", p)
		}
		f, _, err := d.Open(p)
		if f != nil || !errors.Is(err, ErrSymlink) {
			t.Errorf("Open(%q) = %v, %v; want ErrSymlink", p, f, err)
		}
	}
	// Stat and List go no further either.
	for _, p := range []string{"etc/passwd", "outdir/secret", "procroot/etc", "reldir/secret"} {
		if info, err := d.Stat(p); !errors.Is(err, ErrSymlink) {
			t.Errorf("Stat(%q) = %+v, %v; want ErrSymlink", p, info, err)
		}
	}
	for _, p := range []string{"etc", "outdir", "reldir", "procroot"} {
		if e, _, err := d.List(p, 0); !errors.Is(err, ErrSymlink) {
			t.Errorf("List(%q) = %v, %v; want ErrSymlink", p, e, err)
		}
	}
	// Stat reports a final symlink as such, with its target.
	info, err := d.Stat("passwd")
	if err != nil || info.Type != "symlink" || info.Target != "/etc/passwd" || info.Size != int64(len("/etc/passwd")) {
		t.Errorf("Stat(passwd) = %+v, %v", info, err)
	}
	t.Log(func() error { _, _, err := d.Read("passwd", 100); return err }())
	checkOutside(t, out)
}

// TestReadFollowsInsideSymlinks documents the policy: links that stay in
// the workspace are followed by Read, Stat (parents) and List (start).
func TestReadFollowsInsideSymlinks(t *testing.T) {
	d, ws, _ := newWS(t)
	mustWrite(t, d, "run3/out.csv", "x,y\n")
	symlink(t, "run3/out.csv", filepath.Join(ws, "latest"))
	symlink(t, "run3", filepath.Join(ws, "rundir"))
	symlink(t, "../run3/out.csv", filepath.Join(ws, "run3", "self"))
	symlink(t, filepath.Join(ws, "run3/out.csv"), filepath.Join(ws, "absinside")) // absolute: refused even though it points inside
	for _, p := range []string{"latest", "rundir/out.csv", "run3/self", "rundir/self"} {
		if got := mustRead(t, d, p); got != "x,y\n" {
			t.Errorf("Read(%q) = %q", p, got)
		}
		if b, info, err := openRead(d, p, 100); err != nil || string(b) != "x,y\n" || info.Size != 4 || info.Type != "file" {
			t.Errorf("Open(%q) = %q, %+v, %v", p, b, info, err)
		}
	}
	if _, _, err := d.Read("absinside", 100); !errors.Is(err, ErrSymlink) {
		t.Errorf("absolute link: %v", err)
	}
	if _, _, err := d.Open("absinside"); !errors.Is(err, ErrSymlink) {
		t.Errorf("Open, absolute link: %v", err)
	}
	if info, err := d.Stat("rundir/out.csv"); err != nil || info.Type != "file" {
		t.Errorf("Stat via link: %+v, %v", info, err)
	}
	if e, _, err := d.List("rundir", 0); err != nil || len(e) != 2 || e[0].Path != "rundir/out.csv" {
		t.Errorf("List(rundir) = %+v, %v", e, err)
	}
}

func TestWriteRefusesSymlinks(t *testing.T) {
	d, ws, out := newWS(t)
	secret := filepath.Join(out, "secret")
	os.Mkdir(filepath.Join(ws, "sub"), 0o755)
	symlink(t, out, filepath.Join(ws, "up"))
	symlink(t, rel(t, ws, out), filepath.Join(ws, "relup"))
	symlink(t, "sub", filepath.Join(ws, "inside")) // stays inside, still refused for writes
	symlink(t, "/proc/self/root"+out, filepath.Join(ws, "proc"))
	symlink(t, secret, filepath.Join(ws, "f"))
	symlink(t, filepath.Join(out, "new"), filepath.Join(ws, "dangling"))
	symlink(t, "../up", filepath.Join(ws, "sub", "back"))

	for _, p := range []string{
		"up/x", "up/new/deeper/x", "relup/x", "relup/secret", "inside/x", "proc/x",
		"f", "dangling", "sub/back/x", "sub/back/secret",
	} {
		err := d.Write(p, []byte("PWNED"), 100)
		if !errors.Is(err, ErrSymlink) {
			t.Errorf("Write(%q) = %v; want ErrSymlink", p, err)
		}
		if err := writeFrom(d, p, "PWNED", 100); !errors.Is(err, ErrSymlink) {
			t.Errorf("WriteFrom(%q) = %v; want ErrSymlink", p, err)
		}
	}
	t.Log(d.Write("up/x", nil, 1))
	t.Log(d.Write("f", nil, 1))
	// The links are still links; nothing was created through them.
	for _, p := range []string{"f", "dangling", "up"} {
		if st, err := os.Lstat(filepath.Join(ws, p)); err != nil || st.Mode()&os.ModeSymlink == 0 {
			t.Errorf("%s is no longer a symlink: %v", p, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(ws, "sub", "x")); err == nil {
		t.Error("write through an inside link created sub/x")
	}
	checkOutside(t, out)
}

func TestWriteRefusesNonDirectories(t *testing.T) {
	d, ws, _ := newWS(t)
	mustWrite(t, d, "a.txt", "text")
	os.Mkdir(filepath.Join(ws, "dir"), 0o755)
	if err := unix.Mkfifo(filepath.Join(ws, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]error{
		"a.txt/b":   ErrNotDir,
		"a.txt/b/c": ErrNotDir,
		"fifo/x":    ErrNotDir,
		"dir":       ErrNotRegular,
		"fifo":      ErrNotRegular,
	} {
		if err := d.Write(p, []byte("x"), 10); !errors.Is(err, want) {
			t.Errorf("Write(%q) = %v, want %v", p, err, want)
		}
		if err := writeFrom(d, p, "x", 10); !errors.Is(err, want) {
			t.Errorf("WriteFrom(%q) = %v, want %v", p, err, want)
		}
	}
	if got := mustRead(t, d, "a.txt"); got != "text" {
		t.Errorf("a.txt = %q", got)
	}
}

func TestHardLink(t *testing.T) {
	d, ws, out := newWS(t)
	// Made by root in the test; the sandbox could only link files it can
	// already see and own (protected_hardlinks), so Read exposes nothing
	// new by reading it. What matters is that Write never writes into the
	// shared inode.
	outFile := filepath.Join(out, "linked")
	os.WriteFile(outFile, []byte("ORIGINAL"), 0o644)
	if err := os.Link(outFile, filepath.Join(ws, "hl")); err != nil {
		t.Skipf("cannot hard-link across the two temp dirs: %v", err)
	}
	if got := mustRead(t, d, "hl"); got != "ORIGINAL" {
		t.Errorf("Read(hl) = %q", got)
	}
	mustWrite(t, d, "hl", "NEW")
	if got := mustRead(t, d, "hl"); got != "NEW" {
		t.Errorf("after Write, hl = %q", got)
	}
	if err := os.Link(outFile, filepath.Join(ws, "hl2")); err != nil {
		t.Fatal(err)
	}
	if err := writeFrom(d, "hl2", "NEWER", 100); err != nil {
		t.Fatal(err)
	}
	if got := mustRead(t, d, "hl2"); got != "NEWER" {
		t.Errorf("after WriteFrom, hl2 = %q", got)
	}
	b, _ := os.ReadFile(outFile)
	st, _ := os.Stat(outFile)
	if string(b) != "ORIGINAL" || st.Sys().(*syscall.Stat_t).Nlink != 1 {
		t.Errorf("outside file changed: %q, nlink %d", b, st.Sys().(*syscall.Stat_t).Nlink)
	}
}

func TestSpecialFiles(t *testing.T) {
	d, ws, _ := newWS(t)
	if err := unix.Mkfifo(filepath.Join(ws, "fifo"), 0o666); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(ws, "sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	os.Mkdir(filepath.Join(ws, "dir"), 0o755)
	symlink(t, "fifo", filepath.Join(ws, "tofifo"))

	for _, p := range []string{"fifo", "tofifo", "sock", "dir"} {
		for _, op := range []string{"Read", "Open"} {
			done := make(chan error, 1)
			go func() {
				var err error
				var info FileInfo
				if op == "Read" {
					_, info, err = d.Read(p, 100)
				} else {
					var f *os.File
					f, info, err = d.Open(p)
					if f != nil {
						f.Close()
						err = fmt.Errorf("Open gave a file")
					}
				}
				if err == nil || info.Type == "file" {
					err = fmt.Errorf("info %+v, %w", info, err)
				}
				done <- err
			}()
			select {
			case err := <-done:
				if !errors.Is(err, ErrNotRegular) {
					t.Errorf("%s(%q) = %v, want ErrNotRegular", op, p, err)
				}
				t.Log(err)
			case <-time.After(30 * time.Second):
				t.Fatalf("%s(%q) blocked", op, p)
			}
		}
	}
	for p, typ := range map[string]string{"fifo": "other", "sock": "other", "dir": "dir", "tofifo": "symlink"} {
		if info, err := d.Stat(p); err != nil || info.Type != typ {
			t.Errorf("Stat(%q) = %+v, %v", p, info, err)
		}
	}
	// List must not block on the FIFO either.
	if e, _, err := d.List("", 0); err != nil || len(e) != 4 {
		t.Errorf("List = %+v, %v", e, err)
	}
}

// TestMagicLinks opens /proc/self as if it were a workspace: it is full
// of magic links (root, cwd, exe, fd/N), and none may be followed.
func TestMagicLinks(t *testing.T) {
	d := openDir(t, "/proc/self")
	for _, p := range []string{"root/etc/passwd", "cwd/workspace.go", "exe", "fd/0", "root"} {
		if b, _, err := d.Read(p, 1<<20); !errors.Is(err, ErrSymlink) {
			t.Errorf("Read(%q) = %d bytes, %v; want ErrSymlink", p, len(b), err)
		}
		if b, _, err := openRead(d, p, 1<<20); !errors.Is(err, ErrSymlink) {
			t.Errorf("Open(%q) = %d bytes, %v; want ErrSymlink", p, len(b), err)
		}
	}
	if _, err := d.Stat("root/etc"); !errors.Is(err, ErrSymlink) {
		t.Errorf("Stat(root/etc) = %v", err)
	}
	if _, _, err := d.List("root", 0); !errors.Is(err, ErrSymlink) {
		t.Errorf("List(root) = %v", err)
	}
	if err := d.Write("root/tmp/pwned", []byte("x"), 10); err == nil {
		t.Error("Write through /proc/self/root succeeded")
		os.Remove("/tmp/pwned")
	}
	if err := writeFrom(d, "root/tmp/pwned", "x", 10); err == nil {
		t.Error("WriteFrom through /proc/self/root succeeded")
		os.Remove("/tmp/pwned")
	}
	// Stat of the link itself is fine: it reports, not follows.
	if info, err := d.Stat("root"); err != nil || info.Type != "symlink" {
		t.Errorf("Stat(root) = %+v, %v", info, err)
	}
}

// TestMountPoint: a mount inside the workspace (which a sandbox with its
// own mount namespace might make) is not crossed.
func TestMountPoint(t *testing.T) {
	d, ws, _ := newWS(t)
	mnt := filepath.Join(ws, "mnt")
	os.Mkdir(mnt, 0o755)
	tryMount(t, mnt, "size=1m")
	os.WriteFile(filepath.Join(mnt, "f"), []byte("on another mount"), 0o644)
	if _, _, err := d.Read("mnt/f", 100); !errors.Is(err, ErrSymlink) || !errors.Is(err, syscall.EXDEV) {
		t.Errorf("Read across a mount = %v", err)
	}
	if _, _, err := d.Open("mnt/f"); !errors.Is(err, ErrSymlink) || !errors.Is(err, syscall.EXDEV) {
		t.Errorf("Open across a mount = %v", err)
	}
	if err := d.Write("mnt/g", []byte("x"), 10); err == nil {
		t.Error("Write across a mount succeeded")
	}
	if err := writeFrom(d, "mnt/g", "x", 10); err == nil {
		t.Error("WriteFrom across a mount succeeded")
	}
	e, _, err := d.List("", 0)
	if err != nil || len(e) != 1 || e[0].Path != "mnt" {
		t.Errorf("List = %+v, %v; want just mnt, not entered", e, err)
	}
}

// TestRace swaps ws/d between a real directory and symlinks to the outside
// directory (absolute and relative) as fast as it can, atomically with
// RENAME_EXCHANGE, while other goroutines write, read, stat and list
// through d. Nothing may ever appear in, or be read from, the outside.
func TestRace(t *testing.T) {
	d, ws, out := newWS(t)
	real := filepath.Join(ws, "d")
	links := []string{filepath.Join(ws, "alt1"), filepath.Join(ws, "alt2")}
	os.Mkdir(real, 0o755)
	symlink(t, out, links[0])
	symlink(t, rel(t, ws, out), links[1])

	dur := 2 * time.Second
	if testing.Short() {
		dur = 300 * time.Millisecond
	}
	stop := make(chan struct{})
	var swaps atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := unix.Renameat2(unix.AT_FDCWD, real, unix.AT_FDCWD, links[rand.IntN(2)], unix.RENAME_EXCHANGE); err != nil {
				t.Error(err)
				return
			}
			swaps.Add(1)
		}
	}()

	var wrote, refused, read atomic.Int64
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				p := []string{"d/x", "d/sub/y", "d/secret"}[i%3]
				content := fmt.Sprintf("inside %d %d", g, i)
				write := func() error { return d.Write(p, []byte(content), 100) }
				readf := func() ([]byte, FileInfo, error) { return d.Read(p, 100) }
				if i%2 == 1 {
					write = func() error { return writeFrom(d, p, content, 100) }
					readf = func() ([]byte, FileInfo, error) { return openRead(d, p, 100) }
				}
				if err := write(); err == nil {
					wrote.Add(1)
				} else if errors.Is(err, ErrSymlink) || errors.Is(err, ErrNotFound) || errors.Is(err, ErrNotDir) {
					refused.Add(1)
				} else {
					t.Errorf("Write(%q): unexpected error %v", p, err)
				}
				if b, _, err := readf(); err == nil {
					read.Add(1)
					if strings.Contains(string(b), "SECRET") {
						t.Errorf("Read(%q) returned the outside secret", p)
					}
				}
				if info, err := d.Stat("d/secret"); err == nil && info.Size == int64(len("SECRET")) {
					t.Errorf("Stat(d/secret) saw the outside file: %+v", info)
				}
				if e, _, err := d.List("d", 0); err == nil {
					for _, x := range e {
						if x.Path == "d/secret" && x.Size == int64(len("SECRET")) {
							t.Errorf("List(d) saw the outside file: %+v", x)
						}
					}
				}
			}
		}()
	}
	time.Sleep(dur)
	close(stop)
	wg.Wait()
	t.Logf("%d swaps, %d writes succeeded, %d refused, %d reads succeeded", swaps.Load(), wrote.Load(), refused.Load(), read.Load())
	if wrote.Load() == 0 || refused.Load() == 0 {
		t.Errorf("the race was not exercised both ways")
	}
	checkOutside(t, out)
}
