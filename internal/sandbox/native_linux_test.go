package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/sandbox/cgroup"
	"github.com/pysandbox/pysandbox/internal/testutil"
)

// startPy runs /usr/bin/python3 -I -c code in a native sandbox, with no
// worker: these tests look at the sandbox itself.
func startPy(t *testing.T, lim Limits, code string) (Exit, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	sb, err := NewNative().Start(context.Background(), &Spec{
		Python: "/usr/bin/python3", Prefix: "/usr",
		Args:   []string{"-I", "-c", code},
		Env:    []string{"PATH=/usr/bin:/bin", "ONLY=this"},
		Limits: lim,
		Stdout: &out, Stderr: &errb,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	// Remember the sandbox's pid namespace: after Wait, no process on the
	// host may still be in it.
	pidNS, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", sb.(*nativeSandbox).cmd.Process.Pid))
	switch {
	case err == nil:
		t.Cleanup(func() { assertNamespaceEmpty(t, pidNS) })
	case !os.IsNotExist(err):
		t.Fatal(err)
	}
	// (Otherwise a short program had already ended, pid 1 of its
	// namespace, and took the namespace with it.)
	done := make(chan Exit, 1)
	go func() { done <- sb.Wait() }()
	select {
	case e := <-done:
		return e, out.String(), errb.String()
	case <-time.After(30 * time.Second):
		sb.Kill()
		t.Fatal("sandbox did not exit")
	}
	return Exit{}, "", ""
}

var small = Limits{MemoryBytes: 128 << 20, MaxProcs: 32, TmpBytes: 16 << 20}

func TestNativeIdentityAndLayout(t *testing.T) {
	code := `
import json, os, socket
st = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
print(json.dumps({
  "uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(), "pid": os.getpid(),
  "cwd": os.getcwd(), "host": socket.gethostname(), "root": sorted(os.listdir("/")),
  "env": dict(os.environ), "caps": [st[k].strip() for k in ("CapInh","CapPrm","CapEff","CapBnd","CapAmb")],
  "nnp": st["NoNewPrivs"].strip(), "seccomp": st["Seccomp"].strip(),
  "ifaces": [n for _, n in socket.if_nameindex()],
  "fds": sorted(os.listdir("/proc/self/fd")),
}))`
	e, out, errOut := startPy(t, small, code)
	if e.Code != 0 {
		t.Fatalf("exit %+v: %s", e, errOut)
	}
	var got struct {
		UID, GID, PID int
		Groups        []int
		Cwd, Host     string
		Root, Caps    []string
		Env           map[string]string
		NNP, Seccomp  string
		Ifaces, FDs   []string
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v: %q", err, out)
	}
	if got.UID != sandboxUID || got.GID != sandboxGID || got.PID != 1 {
		t.Errorf("uid %d gid %d pid %d", got.UID, got.GID, got.PID)
	}
	if len(got.Groups) != 0 && os.Geteuid() == 0 {
		t.Errorf("supplementary groups leaked in: %v", got.Groups)
	}
	if got.Cwd != "/work" || got.Host != "pysandbox" {
		t.Errorf("cwd %q host %q", got.Cwd, got.Host)
	}
	for _, c := range got.Caps {
		if strings.Trim(c, "0") != "" {
			t.Errorf("capabilities not all dropped: %v", got.Caps)
		}
	}
	if got.NNP != "1" || got.Seccomp != "2" {
		t.Errorf("no_new_privs %s seccomp %s", got.NNP, got.Seccomp)
	}
	if len(got.Ifaces) != 1 || got.Ifaces[0] != "lo" {
		t.Errorf("interfaces %v", got.Ifaces)
	}
	// Python itself sets LC_CTYPE (PEP 538 locale coercion); nothing else
	// but the spec's environment may be there.
	delete(got.Env, "LC_CTYPE")
	if len(got.Env) != 2 || got.Env["ONLY"] != "this" {
		t.Errorf("environment %v", got.Env)
	}
	for _, bad := range []string{"home", "root", "sys", "srv", "opt", "var", "mnt", "boot"} {
		for _, d := range got.Root {
			if d == bad {
				t.Errorf("/%s is visible inside: %v", bad, got.Root)
			}
		}
	}
	// stdin, stdout, stderr, the control socket (fd 3), and the fd listdir
	// itself opened; nothing else of the server's.
	if strings.Join(got.FDs, ",") != "0,1,2,3,4" {
		t.Errorf("open fds %v", got.FDs)
	}
}

func TestNativeNoLeftovers(t *testing.T) {
	before := mountCount(t)
	e, _, _ := startPy(t, small, "import subprocess; subprocess.Popen(['sleep', '300']); print('bye')")
	if e.Code != 0 {
		t.Fatalf("exit %+v", e)
	}
	if after := mountCount(t); after != before {
		t.Errorf("host mounts went from %d to %d", before, after)
	}
}

func TestNativeMemoryLimit(t *testing.T) {
	e, _, _ := startPy(t, Limits{MemoryBytes: 64 << 20, MaxProcs: 16, TmpBytes: 16 << 20},
		"x = bytearray(512 * 1024 * 1024)\nfor i in range(0, len(x), 4096): x[i] = 1\nprint('survived')")
	n := NewNative()
	if n.cgroups.Memory {
		if !e.OOMKilled {
			t.Errorf("not reported as OOM-killed: %+v", e)
		}
	} else if e.Code == 0 {
		t.Errorf("memory bomb survived: %+v", e)
	}
}

func TestNativeStartErrors(t *testing.T) {
	_, err := NewNative().Start(context.Background(), &Spec{Python: "relative/python3"})
	if err == nil || !strings.Contains(err.Error(), "not absolute") {
		t.Errorf("relative interpreter: %v", err)
	}
	_, err = NewNative().Start(context.Background(), &Spec{Python: "/nonexistent/python3", Prefix: "/nonexistent", Limits: small})
	if err == nil {
		t.Error("missing interpreter: no error")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := NewNative().Start(ctx, &Spec{Python: "/usr/bin/python3"}); err == nil {
		t.Error("cancelled context: no error")
	}
	// A deadline that passes during setup ends Start with the context's
	// error, and leaves nothing behind.
	before := mountCount(t)
	ctx, cancel = context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	if _, err := NewNative().Start(ctx, &Spec{Python: "/usr/bin/python3", Prefix: "/usr", Limits: small}); err == nil {
		t.Error("expired deadline during setup: no error")
	}
	if after := mountCount(t); after != before {
		t.Errorf("host mounts went from %d to %d", before, after)
	}
}

func mountCount(t *testing.T) int {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Count(b, []byte("\n"))
}

// assertNamespaceEmpty fails if any process on the host is still in the
// given pid namespace.
func assertNamespaceEmpty(t *testing.T, pidNS string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		var left []string
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			if ns, err := os.Readlink("/proc/" + e.Name() + "/ns/pid"); err == nil && ns == pidNS {
				left = append(left, e.Name())
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes of the sandbox (%s) left on the host: %v", pidNS, left)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func startSpec(t *testing.T, spec *Spec) (Exit, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	spec.Python, spec.Prefix, spec.Stdout, spec.Stderr = "/usr/bin/python3", "/usr", &out, &errb
	if spec.Env == nil {
		spec.Env = []string{"PATH=/usr/bin:/bin"}
	}
	spec.Limits = small
	sb, err := NewNative().Start(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	e := sb.Wait()
	return e, out.String(), errb.String()
}

func TestNativeExtraBinds(t *testing.T) {
	ro, rw := t.TempDir(), t.TempDir()
	os.WriteFile(ro+"/in.txt", []byte("read me"), 0o644)
	// The sandbox user is another host uid when the server is root.
	os.Chmod(rw, 0o777)
	e, out, errOut := startSpec(t, &Spec{
		Args: []string{"-I", "-c", `
print(open('/opt/ro/in.txt').read())
try:
    open('/opt/ro/new', 'w')
except OSError as e:
    print('ro:', e.strerror)
open('/opt/rw/out.txt', 'w').write('written inside')
`},
		Binds: []Bind{{Source: ro, Target: "/opt/ro"}, {Source: rw, Target: "/opt/rw", Writable: true}},
	})
	if e.Code != 0 || out != "read me\nro: Read-only file system\n" {
		t.Fatalf("exit %+v stdout %q stderr %q", e, out, errOut)
	}
	if b, _ := os.ReadFile(rw + "/out.txt"); string(b) != "written inside" {
		t.Errorf("writable bind: %q", b)
	}
}

func TestNativeBindValidation(t *testing.T) {
	for _, b := range []Bind{
		{Source: "relative", Target: "/opt/x"},
		{Source: "/tmp", Target: "/proc/x"},
		{Source: "/tmp", Target: "/work"},
		{Source: "/tmp", Target: "/opt/../etc"},
		{Source: "/tmp", Target: "/"},
	} {
		if _, err := NewNative().Start(context.Background(), &Spec{Python: "/usr/bin/python3", Prefix: "/usr", Binds: []Bind{b}, Limits: small}); err == nil {
			t.Errorf("bind %+v accepted", b)
		}
	}
}

// A sandbox has no route to the host's loopback. With Spec.Proxy it
// listens on 127.0.0.1:ProxyPort in its own namespace, and the socket is
// the server's: a connection made inside is accepted outside.
func TestNativeProxyListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	code := "import socket\nfor port in (" + strconv.Itoa(ln.Addr().(*net.TCPAddr).Port) + ", 3128):\n    try:\n        print(socket.create_connection(('127.0.0.1', port), timeout=5).recv(5).decode())\n    except OSError as e:\n        print('refused', e.errno)"
	var out, errb bytes.Buffer
	sb, err := NewNative().Start(context.Background(), &Spec{Python: "/usr/bin/python3", Prefix: "/usr", Args: []string{"-I", "-c", code},
		Env: []string{"PATH=/usr/bin:/bin"}, Limits: small, Stdout: &out, Stderr: &errb, Proxy: true})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	l := sb.(Proxied).ProxyListener()
	if l == nil {
		t.Fatal("no proxy listener")
	}
	go func() {
		c, err := l.Accept()
		if err == nil {
			c.Write([]byte("proxy"))
			c.Close()
		}
	}()
	sb.Wait()
	if out.String() != "refused 111\nproxy\n" {
		t.Errorf("output %q %q", out.String(), errb.String())
	}
	_, plain, _ := startSpec(t, &Spec{Args: []string{"-I", "-c", code}})
	if plain != "refused 111\nrefused 111\n" {
		t.Errorf("without Proxy: %q", plain)
	}
}

// Without a memory cgroup the memory limit is RLIMIT_AS, which is far below
// the address space the Go init has already reserved. The init must then
// not grow its heap between setting the limit and the exec, or the Go
// runtime dies with "fatal error: runtime: out of memory" instead of
// starting the interpreter. A large environment makes that growth certain
// when the exec's arguments are built late (it was first seen under load,
// with an ordinary environment).
func TestNativeRlimitASStartsWithLargeEnvironment(t *testing.T) {
	n := NewNative()
	n.cgroups = cgroup.Info{} // as for a user without cgroup delegation
	env := []string{"PATH=/usr/bin:/bin"}
	for i := range 12 {
		env = append(env, fmt.Sprintf("BIG%d=%s", i, strings.Repeat("x", 100<<10)))
	}
	for range 3 {
		wantOutput(t, n, &Spec{
			Python: "/usr/bin/python3", Prefix: "/usr",
			Args:   []string{"-I", "-c", "import os, resource; print(len(os.environ['BIG11']), resource.getrlimit(resource.RLIMIT_AS)[0] >> 20)"},
			Env:    env,
			Limits: Limits{MemoryBytes: 96 << 20, MaxProcs: 16, TmpBytes: 16 << 20},
		}, "102400 96\n")
	}
}

// wantOutput runs spec on b to its end and wants a clean exit with stdout
// want.
func wantOutput(t *testing.T, b Backend, spec *Spec, want string) {
	t.Helper()
	out, errb := &testutil.SyncBuffer{}, &testutil.SyncBuffer{}
	spec.Stdout, spec.Stderr = out, errb
	sb, err := b.Start(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	e := sb.Wait()
	sb.Close()
	if e.Code != 0 || out.String() != want {
		t.Fatalf("exit %+v stdout %q (want %q) stderr %.2000s", e, out.String(), want, errb.String())
	}
}

// TestNativeLandlock narrows Landlock to /work: a write to /tmp, which the
// mounts allow, is then refused, so the layer is really in force; with the
// default list both work.
func TestNativeLandlock(t *testing.T) {
	if landlockABI() == 0 {
		t.Skip("this kernel has no Landlock")
	}
	code := `
import errno
def w(p):
    try:
        open(p, "w").write("x")
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
print(w("/tmp/x"), w("/work/x"), w("/dev/null"))`
	for _, tc := range []struct {
		landlock []string
		want     string
	}{{nil, "ok ok ok"}, {[]string{"/work", "/dev/null"}, "EACCES ok ok"}} {
		n := NewNative()
		n.landlock = tc.landlock
		var out, errb bytes.Buffer
		sb, err := n.Start(context.Background(), &Spec{Python: "/usr/bin/python3", Prefix: "/usr",
			Args: []string{"-I", "-c", code}, Limits: small, Stdout: &out, Stderr: &errb})
		if err != nil {
			t.Fatal(err)
		}
		e := sb.Wait()
		sb.Close()
		if e.Code != 0 || strings.TrimSpace(out.String()) != tc.want {
			t.Errorf("landlock %v: exit %+v, got %q want %q: %s", tc.landlock, e, out.String(), tc.want, errb.String())
		}
	}
}
