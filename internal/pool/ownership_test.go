package pool

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/pysandbox/pysandbox/internal/engine"
)

// TestChildNamespaceOwnership checks, from inside a pooled run, the shape
// the zygote's design promises: the run's mount, network, UTS, IPC, pid
// and cgroup namespaces are owned by the zygote's user namespace, which is
// the parent of the run's own; in none of them, nor in its own, does the
// run hold a capability; and every attempt to use one fails.
func TestChildNamespaceOwnership(t *testing.T) {
	e, _ := newPooledEngine(t, 1, nil)
	code := `
import ctypes, errno, fcntl, json, os, socket
NS_GET_USERNS, NS_GET_PARENT = 0xb701, 0xb702
def ino(fd):
    try:
        return os.fstat(fd).st_ino
    finally:
        os.close(fd)
own = os.stat("/proc/self/ns/user").st_ino
res = {"own": own, "owners": {}}
def owner(path, op):
    fd = os.open(path, os.O_RDONLY)
    try:
        return ino(fcntl.ioctl(fd, op))
    except OSError as e:
        return errno.errorcode[e.errno]
    finally:
        os.close(fd)
for ns in ("mnt", "net", "uts", "ipc", "pid", "cgroup"):
    res["owners"][ns] = owner("/proc/self/ns/" + ns, NS_GET_USERNS)
res["parent"] = owner("/proc/self/ns/user", NS_GET_PARENT)
status = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
res["caps"] = [status[k].strip() for k in ("CapEff", "CapPrm", "CapBnd", "CapAmb")]
libc = ctypes.CDLL(None, use_errno=True)
def err(ret):
    return "ok" if ret == 0 else errno.errorcode[ctypes.get_errno()]
res["mount"] = err(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 0, None))
res["umount"] = err(libc.umount2(b"/proc", 2))
res["unshare_user"] = err(libc.unshare(0x10000000))
res["unshare_net"] = err(libc.unshare(0x40000000))
fd = os.open("/proc/1/ns/net", os.O_RDONLY)
res["setns"] = err(libc.setns(fd, 0))
try:
    socket.sethostname("evil")
    res["hostname"] = "ok"
except OSError as e:
    res["hostname"] = errno.errorcode[e.errno]
res["uid_map"] = open("/proc/self/uid_map").read().split()
print(json.dumps(res))
`
	r, err := e.Run(context.Background(), engine.RunRequest{Code: code})
	if err != nil || r.Status != engine.StatusSuccess {
		t.Fatalf("%v %+v", err, r)
	}
	var got struct {
		Own      uint64         `json:"own"`
		Owners   map[string]any `json:"owners"`
		Parent   any            `json:"parent"`
		Caps     []string       `json:"caps"`
		UIDMap   []string       `json:"uid_map"`
		Mount    string         `json:"mount"`
		Umount   string         `json:"umount"`
		UnshareU string         `json:"unshare_user"`
		UnshareN string         `json:"unshare_net"`
		Setns    string         `json:"setns"`
		Hostname string         `json:"hostname"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &got); err != nil {
		t.Fatalf("%v: %s", err, r.Stdout)
	}
	// The kernel names a namespace's owner only to a caller in that user
	// namespace or above it: EPERM says the owner is above the run's own
	// (the zygote's), where the run has no capability.
	if len(got.Owners) != 6 {
		t.Errorf("owners: %v", got.Owners)
	}
	for ns, owner := range got.Owners {
		if owner != "EPERM" {
			t.Errorf("the run's %s namespace: owner %v, want EPERM (owned above the run's user namespace)", ns, owner)
		}
	}
	if got.Parent != "EPERM" {
		t.Errorf("the run's user namespace: parent %v, want EPERM (outside the run's scope)", got.Parent)
	}
	for _, c := range got.Caps {
		if c != "0000000000000000" {
			t.Errorf("the run holds capabilities: %v", got.Caps)
			break
		}
	}
	if len(got.UIDMap) != 3 || got.UIDMap[0] != "1000" || got.UIDMap[2] != "1" {
		t.Errorf("uid_map %v: want uid 1000 mapped alone", got.UIDMap)
	}
	for name, v := range map[string]string{"mount": got.Mount, "umount": got.Umount, "unshare(user)": got.UnshareU,
		"unshare(net)": got.UnshareN, "setns": got.Setns, "sethostname": got.Hostname} {
		if v != "EPERM" {
			t.Errorf("%s from a run: %s, want EPERM", name, v)
		}
	}
}
