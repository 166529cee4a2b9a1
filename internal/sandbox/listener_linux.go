package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// ProxyPort is where a sandbox started with Spec.Proxy finds the server's
// network proxy: 127.0.0.1:ProxyPort inside its own network namespace.
const ProxyPort = 3128

// ProxyEnv is the environment that sends HTTP clients to the proxy.
// NO_PROXY keeps the sandbox's own loopback (a server the code starts)
// out of it. Both spellings: curl and some libraries read only one.
func ProxyEnv() []string {
	u := fmt.Sprintf("http://127.0.0.1:%d", ProxyPort)
	no := "localhost,127.0.0.1,::1"
	return []string{
		"HTTP_PROXY=" + u, "HTTPS_PROXY=" + u, "ALL_PROXY=" + u, "NO_PROXY=" + no,
		"http_proxy=" + u, "https_proxy=" + u, "all_proxy=" + u, "no_proxy=" + no,
	}
}

// listenerMark is the one byte that carries the listening socket.
const listenerMark = 'L'

// sendProxyListener listens on 127.0.0.1:ProxyPort in the calling
// process's network namespace and sends the socket over the Unix socket
// fd, keeping no copy: nothing that runs in the sandbox later can accept
// on it.
func sendProxyListener(fd int) error {
	s, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("proxy listener: %w", os.NewSyscallError("socket", err))
	}
	defer unix.Close(s)
	if err := unix.Bind(s, &unix.SockaddrInet4{Port: ProxyPort, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		return fmt.Errorf("proxy listener: %w", os.NewSyscallError("bind", err))
	}
	if err := unix.Listen(s, 128); err != nil {
		return fmt.Errorf("proxy listener: %w", os.NewSyscallError("listen", err))
	}
	if err := unix.Sendmsg(fd, []byte{listenerMark}, unix.UnixRights(s), nil, 0); err != nil {
		return fmt.Errorf("proxy listener: %w", os.NewSyscallError("sendmsg", err))
	}
	return nil
}

// errNoListener means the sandbox's first byte was not the listener: it
// is the start of an error message, returned as the error's text.
type errNoListener struct{ first []byte }

func (e *errNoListener) Error() string { return string(e.first) }

// RecvProxyListener receives the listening socket a sandbox sends before
// anything else on conn (see recvProxyListener).
func RecvProxyListener(ctx context.Context, conn *net.UnixConn) (net.Listener, error) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(10 * time.Second)
	}
	conn.SetReadDeadline(deadline)
	defer conn.SetReadDeadline(time.Time{})
	buf := make([]byte, 1)
	oob := make([]byte, listenerOOB)
	n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
	if err != nil && n == 0 {
		return nil, fmt.Errorf("proxy listener: %w", err)
	}
	return listenerFrom(buf[:n], oob[:oobn])
}

// listenerOOB has room for a few descriptors and credentials (a pool
// child's socket passes them).
var listenerOOB = unix.CmsgSpace(4*4) + unix.CmsgSpace(unix.SizeofUcred)

// recvProxyListenerFD is RecvProxyListener on a blocking descriptor (the
// native init's setup socket); killing the sandbox ends the wait.
func recvProxyListenerFD(fd int) (net.Listener, error) {
	buf := make([]byte, 1)
	oob := make([]byte, listenerOOB)
	for {
		n, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("proxy listener: %w", os.NewSyscallError("recvmsg", err))
		}
		return listenerFrom(buf[:n], oob[:oobn])
	}
}

// listenerFrom checks what a sandbox sent for its proxy listener: one
// TCP socket, listening, on 127.0.0.1:ProxyPort. The sandbox's setup sends
// it before any code a caller controls runs, but it is checked all the
// same.
func listenerFrom(data, oob []byte) (net.Listener, error) {
	var fds []int
	if len(oob) > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob)
		if err != nil {
			return nil, fmt.Errorf("proxy listener: %w", err)
		}
		for i := range msgs {
			if r, err := unix.ParseUnixRights(&msgs[i]); err == nil {
				fds = append(fds, r...)
			}
		}
	}
	if len(data) == 0 {
		closeAll(fds)
		return nil, errors.New("proxy listener: the sandbox exited during setup")
	}
	if data[0] != listenerMark || len(fds) != 1 {
		closeAll(fds)
		return nil, &errNoListener{first: data}
	}
	if err := checkListener(fds[0]); err != nil {
		unix.Close(fds[0])
		return nil, err
	}
	f := os.NewFile(uintptr(fds[0]), "proxy")
	l, err := net.FileListener(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("proxy listener: %w", err)
	}
	return l, nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// checkListener checks a received descriptor.
func checkListener(fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return errors.New("proxy listener: the sandbox sent something that is not a socket")
	}
	for _, o := range []struct {
		opt, want int
		what      string
	}{{unix.SO_DOMAIN, unix.AF_INET, "an IPv4 socket"}, {unix.SO_TYPE, unix.SOCK_STREAM, "a stream socket"},
		{unix.SO_PROTOCOL, unix.IPPROTO_TCP, "a TCP socket"}, {unix.SO_ACCEPTCONN, 1, "listening"}} {
		v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, o.opt)
		if err != nil || v != o.want {
			return fmt.Errorf("proxy listener: the socket the sandbox sent is not %s", o.what)
		}
	}
	sa, err := unix.Getsockname(fd)
	in4, ok := sa.(*unix.SockaddrInet4)
	if err != nil || !ok || in4.Port != ProxyPort || in4.Addr != [4]byte{127, 0, 0, 1} {
		return errors.New("proxy listener: the socket the sandbox sent is not bound to 127.0.0.1:" + fmt.Sprint(ProxyPort))
	}
	return nil
}
