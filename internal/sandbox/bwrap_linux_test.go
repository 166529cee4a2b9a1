package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/testutil"
)

// requireBwrap skips the test only when bwrap is not installed; any other
// failure to set the backend up is a failure.
func requireBwrap(t *testing.T) *Bwrap {
	t.Helper()
	if _, err := exec.LookPath("bwrap"); err != nil {
		t.Skip("bwrap is not installed (apt-get install bubblewrap)")
	}
	b, err := NewBwrap()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var bwrapTestEnv = []string{"PATH=/usr/bin:/bin", "HOME=/work", "LANG=C.UTF-8", "PYSANDBOX_TEST=bwrap"}

func bwrapSpec(code string, lim Limits, out, errb *testutil.SyncBuffer) *Spec {
	return &Spec{
		Python: "/usr/bin/python3", Prefix: "/usr",
		Args:   []string{"-I", "-c", code},
		Env:    bwrapTestEnv,
		Files:  []File{{Path: "/.pysandbox/hello.txt", Content: []byte("hello from the host\n")}},
		Limits: lim,
		Stdout: out, Stderr: errb,
	}
}

func startBwrap(t *testing.T, b *Bwrap, code string, lim Limits) (*bwrapSandbox, *testutil.SyncBuffer, *testutil.SyncBuffer) {
	t.Helper()
	out, errb := &testutil.SyncBuffer{}, &testutil.SyncBuffer{}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb, err := b.Start(ctx, bwrapSpec(code, lim, out, errb))
	if err != nil {
		t.Fatal(err)
	}
	s := sb.(*bwrapSandbox)
	t.Cleanup(func() { s.Close() })
	return s, out, errb
}

// checkGone asserts that Close left nothing behind: no cgroup directory, no
// bwrap process, no pid 1 of the sandbox.
func checkGone(t *testing.T, s *bwrapSandbox) {
	t.Helper()
	var cgName string
	if s.cg != nil {
		cgName = filepath.Base(s.cg.Path())
		if len(cgroupDirs(cgName)) == 0 {
			t.Errorf("cgroup %s not found before Close", cgName)
		}
	}
	mon := s.cmd.Process.Pid
	s.mu.Lock()
	init := s.initPid
	s.mu.Unlock()
	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if cgName != "" {
		if dirs := cgroupDirs(cgName); len(dirs) > 0 {
			t.Errorf("cgroup directories left after Close: %v", dirs)
		}
	}
	for _, pid := range []int{mon, init} {
		if pid > 0 && alive(pid) {
			t.Errorf("process %d still alive after Close", pid)
		}
	}
}

// cgroupDirs finds the directories of the group name in every hierarchy.
func cgroupDirs(name string) []string {
	var out []string
	filepath.WalkDir("/sys/fs/cgroup", func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if d.Name() == name {
			out = append(out, p)
			return filepath.SkipDir
		}
		return nil
	})
	return out
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	st, ok := testutil.ReadProcStat(pid)
	return ok && !st.Dead()
}

const isolationProbe = `
import ctypes, json, os, pwd, resource, socket, stat, sys
r = {}
r['ids'] = [os.getuid(), os.geteuid(), os.getgid(), os.getegid(), os.getgroups()]
st = {}
for line in open('/proc/self/status'):
    k, _, v = line.partition(':')
    st[k] = v.strip()
r['status'] = {k: st.get(k) for k in ('CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb', 'NoNewPrivs', 'Seccomp')}
libc = ctypes.CDLL(None, use_errno=True)
def call(f, *a):
    ctypes.set_errno(0)
    rc = f(*a)
    return [rc, ctypes.get_errno()]
r['unshare_user'] = call(libc.unshare, 0x10000000)
r['unshare_mnt'] = call(libc.unshare, 0x00020000)
r['mount'] = call(libc.mount, b'none', b'/tmp', b'tmpfs', 0, None)
r['netdev'] = [l.split(':')[0].strip() for l in open('/proc/net/dev').read().splitlines()[2:]]
s = socket.socket()
s.settimeout(3)
try:
    s.connect(('127.0.0.1', PORT))
    r['connect'] = 'connected'
except OSError as e:
    r['connect'] = e.errno
s.close()
r['exists'] = {p: os.path.exists(p) for p in PATHS}
def write(p):
    try:
        with open(p, 'w') as f:
            f.write('x')
        return 0
    except OSError as e:
        return e.errno
r['write'] = {p: write(p) for p in ('/x', '/usr/x', '/etc/passwd', '/etc/x', '/proc/x', '/dev/x', '/.pysandbox/hello.txt', '/tmp/x', '/work/x', '/dev/shm/x')}
r['cwd'] = os.getcwd()
r['env'] = sorted(e.decode() for e in open('/proc/self/environ', 'rb').read().split(b'\0') if e)
fds = []
for fd in range(4096):
    try:
        os.fstat(fd)
        fds.append(fd)
    except OSError:
        pass
r['fds'] = fds
r['fd3_socket'] = stat.S_ISSOCK(os.fstat(3).st_mode)
r['hostname'] = socket.gethostname()
r['user'] = pwd.getpwuid(os.getuid()).pw_name
r['root'] = sorted(os.listdir('/'))
r['file'] = open('/.pysandbox/hello.txt').read()
r['nofile'] = list(resource.getrlimit(resource.RLIMIT_NOFILE))
r['core'] = list(resource.getrlimit(resource.RLIMIT_CORE))
r['cgroup'] = [l.split(':', 2)[2] for l in open('/proc/self/cgroup').read().splitlines()]
r['pid'] = os.getpid()
st1 = {}
for line in open('/proc/1/status'):
    k, _, v = line.partition(':')
    st1[k] = v.strip()
r['init'] = {k: st1.get(k) for k in ('Name', 'Uid', 'CapEff', 'CapPrm', 'CapBnd', 'NoNewPrivs', 'Seccomp')}
os.write(3, b'hello over fd 3')
print(json.dumps(r))
`

func TestBwrapIsolation(t *testing.T) {
	b := requireBwrap(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan struct{}, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
			accepted <- struct{}{}
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port

	hostTmp, err := os.CreateTemp("/tmp", "pysandbox-bwrap-secret-*")
	if err != nil {
		t.Fatal(err)
	}
	hostTmp.WriteString("secret")
	hostTmp.Close()
	defer os.Remove(hostTmp.Name())
	cwd, _ := os.Getwd()
	paths := []string{"/root", "/home", cwd, hostTmp.Name(), "/etc/shadow", "/etc/ssh", "/sys", "/var", "/run"}
	pathsJSON, _ := json.Marshal(paths)
	code := strings.NewReplacer("PORT", strconv.Itoa(port), "PATHS", string(pathsJSON)).Replace(isolationProbe)

	s, out, errb := startBwrap(t, b, code, Limits{MemoryBytes: 256 << 20, MaxProcs: 32, TmpBytes: 16 << 20})
	s.Control().SetReadDeadline(time.Now().Add(30 * time.Second))
	msg := make([]byte, 64)
	n, err := s.Control().Read(msg)
	if err != nil || string(msg[:n]) != "hello over fd 3" {
		t.Errorf("control socket: read %q, %v", msg[:n], err)
	}
	e := s.Wait()
	if e.Code != 0 || e.Signal != 0 {
		t.Fatalf("exit %+v\nstdout: %s\nstderr: %s", e, out, errb)
	}
	var r struct {
		IDs       []any             `json:"ids"`
		Status    map[string]string `json:"status"`
		UnshareU  []int             `json:"unshare_user"`
		UnshareM  []int             `json:"unshare_mnt"`
		Mount     []int             `json:"mount"`
		NetDev    []string          `json:"netdev"`
		Connect   any               `json:"connect"`
		Exists    map[string]bool   `json:"exists"`
		Write     map[string]int    `json:"write"`
		Cwd       string            `json:"cwd"`
		Env       []string          `json:"env"`
		FDs       []int             `json:"fds"`
		FD3Socket bool              `json:"fd3_socket"`
		Hostname  string            `json:"hostname"`
		User      string            `json:"user"`
		Root      []string          `json:"root"`
		File      string            `json:"file"`
		NoFile    []int             `json:"nofile"`
		Core      []int             `json:"core"`
		Cgroup    []string          `json:"cgroup"`
		Pid       int               `json:"pid"`
		Init      map[string]string `json:"init"`
	}
	if err := json.Unmarshal([]byte(out.String()), &r); err != nil {
		t.Fatalf("probe output: %v\nstdout: %s\nstderr: %s", err, out, errb)
	}
	t.Logf("probe: %s", out)

	if got := fmt.Sprint(r.IDs); got != "[1000 1000 1000 1000 []]" {
		t.Errorf("uid/euid/gid/egid/groups = %s, want 1000s and no groups", got)
	}
	for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		if strings.Trim(r.Status[k], "0") != "" {
			t.Errorf("%s = %s, want all zero", k, r.Status[k])
		}
	}
	if r.Status["NoNewPrivs"] != "1" {
		t.Errorf("NoNewPrivs = %s, want 1", r.Status["NoNewPrivs"])
	}
	if r.Status["Seccomp"] != "2" {
		t.Errorf("Seccomp = %s, want 2 (filter)", r.Status["Seccomp"])
	}
	for name, res := range map[string][]int{"unshare(CLONE_NEWUSER)": r.UnshareU, "unshare(CLONE_NEWNS)": r.UnshareM, "mount": r.Mount} {
		if len(res) != 2 || res[0] != -1 || res[1] != int(syscall.EPERM) {
			t.Errorf("%s = %v, want [-1 EPERM]", name, res)
		}
	}
	if !slices.Equal(r.NetDev, []string{"lo"}) {
		t.Errorf("/proc/net/dev lists %v, want only lo", r.NetDev)
	}
	if r.Connect != float64(syscall.ECONNREFUSED) {
		t.Errorf("connect to the host's 127.0.0.1:%d: %v, want ECONNREFUSED", port, r.Connect)
	}
	select {
	case <-accepted:
		t.Errorf("the host listener accepted a connection from the sandbox")
	default:
	}
	for p, ok := range r.Exists {
		if ok {
			t.Errorf("host path %s is visible inside", p)
		}
	}
	for p, errno := range r.Write {
		want := int(syscall.EROFS)
		if p == "/tmp/x" || p == "/work/x" || p == "/dev/shm/x" {
			want = 0
		}
		// /proc refuses creation with its own errno; it only must fail.
		if p == "/proc/x" && errno != 0 {
			continue
		}
		if errno != want {
			t.Errorf("write %s: errno %d, want %d", p, errno, want)
		}
	}
	if r.Cwd != "/work" {
		t.Errorf("cwd %s, want /work", r.Cwd)
	}
	wantEnv := append(slices.Clone(bwrapTestEnv), "PWD=/work")
	slices.Sort(wantEnv)
	if !slices.Equal(r.Env, wantEnv) {
		t.Errorf("environment %q, want %q", r.Env, wantEnv)
	}
	if !slices.Equal(r.FDs, []int{0, 1, 2, 3}) || !r.FD3Socket {
		t.Errorf("open descriptors %v (fd 3 socket: %v), want [0 1 2 3] with the control socket on 3", r.FDs, r.FD3Socket)
	}
	if r.Hostname != "pysandbox" || r.User != "sandbox" {
		t.Errorf("hostname %q user %q", r.Hostname, r.User)
	}
	if r.File != "hello from the host\n" {
		t.Errorf("spec file content %q", r.File)
	}
	if !slices.Equal(r.NoFile, []int{1024, 1024}) || !slices.Equal(r.Core, []int{0, 0}) {
		t.Errorf("RLIMIT_NOFILE %v RLIMIT_CORE %v", r.NoFile, r.Core)
	}
	for _, c := range r.Cgroup {
		if c != "/" {
			t.Errorf("/proc/self/cgroup shows %q, want / (own cgroup namespace)", r.Cgroup)
			break
		}
	}
	if r.Pid != 2 {
		t.Errorf("interpreter is pid %d, want 2 (bwrap's reaper is 1)", r.Pid)
	}
	// bwrap's reaper, pid 1, is as confined as the interpreter.
	if r.Init["Name"] != "bwrap" || r.Init["Seccomp"] != "2" || r.Init["NoNewPrivs"] != "1" ||
		!strings.HasPrefix(r.Init["Uid"], "1000\t") || strings.Trim(r.Init["CapEff"]+r.Init["CapPrm"]+r.Init["CapBnd"], "0") != "" {
		t.Errorf("pid 1 inside: %v", r.Init)
	}
	for _, d := range []string{"proc", "dev", "tmp", "work", "etc", "usr", ".pysandbox"} {
		if !slices.Contains(r.Root, d) {
			t.Errorf("/ lacks %s: %v", d, r.Root)
		}
	}
	if errb.String() != "" {
		t.Errorf("stderr: %s", errb)
	}
	checkGone(t, s)
}

func TestBwrapSeccompBytes(t *testing.T) {
	requireBwrap(t)
	raw, err := seccompBytes()
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) == 0 || len(raw)%8 != 0 {
		t.Fatalf("filter is %d bytes, want a non-empty multiple of 8", len(raw))
	}
	// The first instruction loads seccomp_data.arch: BPF_LD|BPF_W|BPF_ABS (0x20), k=4.
	if want := []byte{0x20, 0, 0, 0, 4, 0, 0, 0}; !bytes.Equal(raw[:8], want) {
		t.Errorf("first instruction % x, want % x", raw[:8], want)
	}
}
