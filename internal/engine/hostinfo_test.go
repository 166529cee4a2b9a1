package engine

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/sandbox"
)

// hostInfoCode reports, from inside, what the sandbox tells about the host
// and which channels to other tenants it opens.
const hostInfoCode = `
import ctypes, errno, fcntl, json, os
libc = ctypes.CDLL(None, use_errno=True)
def content(p):
    try:
        if os.path.isdir(p):
            return "dir:" + ",".join(sorted(os.listdir(p)))
        with open(p, "rb") as f:
            return "bytes:%d" % len(f.read(4096))
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
def call(fn, *a):
    r = fn(*a)
    return "ok" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")
out = {"masked": {p: content(p) for p in masked if os.path.lexists(p)}}
out["readonly"] = {p: bool(os.statvfs(p).f_flag & os.ST_RDONLY) for p in readonly if os.path.lexists(p)}
try:
    open("/proc/sys/kernel/core_pattern", "w").write("|/bin/false")
    out["core_pattern"] = "written"
except OSError as e:
    out["core_pattern"] = errno.errorcode.get(e.errno, "?")
out["mountinfo"] = open("/proc/self/mountinfo").read()
out["inotify_init1"] = call(libc.inotify_init1, 0)
out["fanotify_init"] = call(libc.fanotify_init, 0, 0)
# dnotify on a shared directory would signal every read by other runs.
d = os.open("/usr/lib", os.O_RDONLY | os.O_DIRECTORY)
try:
    fcntl.fcntl(d, fcntl.F_NOTIFY, fcntl.DN_ACCESS | fcntl.DN_MULTISHOT)
    out["dnotify"] = "ok"
except OSError as e:
    out["dnotify"] = errno.errorcode.get(e.errno, "?")
out["cachestat"] = call(libc.syscall, 451, d, None, None, 0)
out["usr_local"] = sorted(os.listdir("/usr/local")) if os.path.isdir("/usr/local") else []
out["usr_local_etc"] = os.path.exists("/usr/local/etc")
# flock on a shared read-only file works (a documented residual channel).
f = open(os.__file__, "rb")
try:
    fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
    out["flock_shared_file"] = "ok"
except OSError as e:
    out["flock_shared_file"] = errno.errorcode.get(e.errno, "?")
out
`

// hostInfo is what hostInfoCode returns.
type hostInfo struct {
	Masked          map[string]string `json:"masked"`
	ReadOnly        map[string]bool   `json:"readonly"`
	CorePattern     string            `json:"core_pattern"`
	Mountinfo       string            `json:"mountinfo"`
	Inotify         string            `json:"inotify_init1"`
	Fanotify        string            `json:"fanotify_init"`
	Dnotify         string            `json:"dnotify"`
	Cachestat       string            `json:"cachestat"`
	UsrLocal        []string          `json:"usr_local"`
	UsrLocalEtc     bool              `json:"usr_local_etc"`
	FlockSharedFile string            `json:"flock_shared_file"`
}

// TestEscapeHostInfo: /proc is masked as runc and Docker mask it (plus the
// kernel command line and symbols), /proc/sys is read-only, mountinfo
// names no host home directory, inotify and fanotify are refused, and
// /usr/local shows only the interpreter's site directories.
func TestEscapeHostInfo(t *testing.T) {
	e := escEngine(t, nil)
	got := runHostInfo(t, e)
	if _, ok := got.Masked["/proc/cmdline"]; !ok {
		t.Errorf("/proc/cmdline not checked: %v", got.Masked)
	}
	home, _ := os.UserHomeDir()
	for _, host := range []string{"/root/", "/home/", home + "/"} {
		if strings.Contains(got.Mountinfo, " "+host) {
			t.Errorf("mountinfo names a path under %s:\n%s", host, got.Mountinfo)
		}
	}
	if got.UsrLocalEtc || len(got.UsrLocal) > 1 || (len(got.UsrLocal) == 1 && got.UsrLocal[0] != "lib") {
		t.Errorf("/usr/local shows %v (etc: %v), want at most lib/python3.*", got.UsrLocal, got.UsrLocalEtc)
	}
	t.Logf("flock on a shared read-only file: %s (residual channel, see docs/security.md)", got.FlockSharedFile)
}

// runHostInfo runs hostInfoCode in e and checks what every backend must
// hold (checkHostInfo).
func runHostInfo(t *testing.T, e *Engine) *hostInfo {
	t.Helper()
	masks := sandbox.DefaultProcMasks()
	// A masked directory is an empty read-only tmpfs, or (in a pooled
	// run) a bind mount of the first one: read-only either way.
	r := escRun(t, e, hostInfoCode, map[string]any{"masked": slices.Concat(masks.Files, masks.Dirs), "readonly": slices.Concat(masks.ReadOnly, masks.Dirs)})
	escWant(t, r, StatusSuccess)
	var got hostInfo
	escReturn(t, r, &got)
	checkHostInfo(t, &got)
	return &got
}

func checkHostInfo(t *testing.T, got *hostInfo) {
	t.Helper()
	for p, v := range got.Masked {
		if v != "bytes:0" && v != "dir:" && v != "EACCES" && v != "EPERM" && v != "ENOENT" {
			t.Errorf("%s shows %s, want empty or unreadable", p, v)
		}
	}
	for p, ro := range got.ReadOnly {
		if !ro {
			t.Errorf("%s is on a writable mount", p)
		}
	}
	if got.CorePattern == "written" {
		t.Errorf("/proc/sys/kernel/core_pattern was written")
	}
	if got.Inotify != "EPERM" || got.Fanotify != "EPERM" || got.Dnotify != "EPERM" || got.Cachestat != "EPERM" {
		t.Errorf("inotify_init1 %s, fanotify_init %s, fcntl(F_NOTIFY) %s, cachestat %s: want EPERM", got.Inotify, got.Fanotify, got.Dnotify, got.Cachestat)
	}
}

// TestEscapeHostInfoBwrap: the same, on the bwrap backend.
func TestEscapeHostInfoBwrap(t *testing.T) {
	b, err := sandbox.NewBwrap()
	if err != nil {
		t.Skipf("bwrap not available: %v", err)
	}
	e := newEngine(t, func(c *Config) { c.Backend = b; c.MaxTimeout = time.Minute })
	runHostInfo(t, e)
}
