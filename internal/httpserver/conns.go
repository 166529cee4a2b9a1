package httpserver

import (
	"net"
	"syscall"
	"time"

	"golang.org/x/net/netutil"
)

// IdleTimeout ends a kept-alive connection that sends no new request for
// this long: an idle connection holds a descriptor, and a caller (with a
// token or without) could otherwise hold them all.
const IdleTimeout = 2 * time.Minute

// LimitConnections bounds the connections open at once to half the
// process's descriptor limit (at least 64, at most 16384), so that a flood
// of connections leaves descriptors for sandboxes, the audit log and the
// cache: past it, new connections wait in the kernel's queue until one
// closes, instead of the server failing to accept with EMFILE.
func LimitConnections(ln net.Listener) (net.Listener, int) {
	n := 1024
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err == nil {
		n = int(min(rl.Cur/2, 16384))
	}
	n = max(n, 64)
	return netutil.LimitListener(ln, n), n
}
