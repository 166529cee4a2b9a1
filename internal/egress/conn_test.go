package egress

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/policy"
)

// host is a TCP server on loopback that runs serve on each connection it
// accepts.
func host(t *testing.T, serve func(net.Conn)) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(time.Minute))
				serve(c)
			}()
		}
	}()
	return l
}

// tunnel opens a CONNECT tunnel to target through the proxy, sending
// first along with the request, as a TLS client sends its hello.
func tunnel(t *testing.T, proxy, target string, first []byte) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", proxy)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	// A guard against a hang: the test moves some MiB on loopback.
	c.SetDeadline(time.Now().Add(60 * time.Second))
	msg := append([]byte("CONNECT "+target+" HTTP/1.1\r\nHost: "+target+"\r\n\r\n"), first...)
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT: %s", resp.Status)
	}
	return c, br
}

// pattern is n bytes that are not all alike, so that a byte lost or
// repeated at a chunk's edge shows.
func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/4093)
	}
	return b
}

// A tunnel moves its bytes through budgeted chunks the kernel splices
// (copyBudget): sizes that are no multiple of a chunk arrive whole, each
// way, and the record and the usage count every byte exactly, the ones
// sent along with the request included.
func TestTunnelCountsExactly(t *testing.T) {
	up, down := pattern(3*copyChunk+4321), pattern(5*copyChunk+77)
	got := make(chan []byte, 1)
	h := host(t, func(c net.Conn) {
		b := make([]byte, len(up))
		n, _ := io.ReadFull(c, b)
		got <- b[:n]
		c.Write(down)
	})
	rec := &recorder{}
	p := New(Config{Rules: func() *policy.NetworkRules { return rules(t, h.Addr().String()) }, OnRecord: rec.add})
	g, purl := serve(t, p, GrantConfig{})
	c, br := tunnel(t, purl.Host, h.Addr().String(), up[:1000])
	if _, err := c.Write(up[1000:]); err != nil {
		t.Fatal(err)
	}
	if b := <-got; !bytes.Equal(b, up) {
		t.Errorf("the host got %d bytes, not the %d sent", len(b), len(up))
	}
	c.(*net.TCPConn).CloseWrite()
	b, err := io.ReadAll(br)
	if err != nil || !bytes.Equal(b, down) {
		t.Fatalf("the client got %d bytes of %d: %v", len(b), len(down), err)
	}
	r := rec.nth(t, 1)
	if r.Decision != Allowed || r.BytesOut != int64(len(up)) || r.BytesIn != int64(len(down)) || r.Limit != "" {
		t.Errorf("record %+v, want %d bytes out and %d in", r, len(up), len(down))
	}
	if u := g.Usage(); u.BytesOut != int64(len(up)) || u.BytesIn != int64(len(down)) || u.Connections != 1 {
		t.Errorf("usage %+v", u)
	}
}

// The bytes_in limit stops a spliced download at the limit's very byte:
// the client gets exactly that many, and the record says so.
func TestTunnelStopsAtTheLimit(t *testing.T) {
	down := pattern(8 << 20)
	h := host(t, func(c net.Conn) { c.Write(down) })
	rec := &recorder{}
	// Not a multiple of a chunk: the last chunk is cut to the byte.
	lim := policy.NetLimits{BytesIn: 2*copyChunk + 12345, BytesOut: 1 << 20, Connections: 4, ConnTime: time.Minute}
	p := New(Config{Rules: func() *policy.NetworkRules {
		r := rules(t, h.Addr().String())
		r.Limits = lim
		return r
	}, OnRecord: rec.add})
	g, purl := serve(t, p, GrantConfig{})
	_, br := tunnel(t, purl.Host, h.Addr().String(), nil)
	b, _ := io.ReadAll(br)
	if int64(len(b)) != lim.BytesIn || !bytes.Equal(b, down[:len(b)]) {
		t.Errorf("the client got %d bytes through a limit of %d", len(b), lim.BytesIn)
	}
	r := rec.nth(t, 1)
	if r.Limit != "bytes_in" || r.BytesIn != lim.BytesIn {
		t.Errorf("record %+v, want bytes_in at %d", r, lim.BytesIn)
	}
	if u := g.Usage(); u.BytesIn != lim.BytesIn || len(u.LimitsHit) != 1 || u.LimitsHit[0] != "bytes_in" {
		t.Errorf("usage %+v", u)
	}
	// The budget is spent: the next tunnel gets nothing from the host.
	_, br = tunnel(t, purl.Host, h.Addr().String(), nil)
	if b, _ := io.ReadAll(br); len(b) != 0 {
		t.Errorf("%d bytes past a spent budget", len(b))
	}
	if u := g.Usage(); u.BytesIn != lim.BytesIn {
		t.Errorf("usage after the budget was spent: %+v", u)
	}
}

// A plain response without a length ends with its connection: the client
// sees that end before the record is delivered, so a recorder that waits
// for the audit log's disk sync (audit.Options.SyncEach) does not hold up
// the client.
func TestClientEndsBeforeTheRecord(t *testing.T) {
	h := host(t, func(c net.Conn) {
		if _, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
			io.WriteString(c, "HTTP/1.0 200 OK\r\n\r\nto the end")
		}
	})
	release := make(chan struct{})
	recorded := make(chan Record, 1)
	p := New(Config{Rules: func() *policy.NetworkRules { return rules(t, h.Addr().String()) }, OnRecord: func(r Record) {
		recorded <- r
		<-release
	}})
	_, purl := serve(t, p, GrantConfig{})
	// Registered after serve's cleanup, so it runs first: Close waits for
	// the recorder.
	defer close(release)
	c, err := net.Dial("tcp", purl.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// A guard against a hang: with the record first, the read below
	// would wait for the release, which comes only after it.
	c.SetDeadline(time.Now().Add(30 * time.Second))
	target := h.Addr().String()
	io.WriteString(c, "GET http://"+target+"/ HTTP/1.1\r\nHost: "+target+"\r\n\r\n")
	b, err := io.ReadAll(c)
	if err != nil || !strings.HasSuffix(string(b), "\r\n\r\nto the end") {
		t.Fatalf("response %q: %v", b, err)
	}
	if r := <-recorded; r.Decision != Allowed || r.BytesIn != int64(len(b)) {
		t.Errorf("record %+v", r)
	}
}

// TestAllowedList: a refusal names the hosts a run may reach, and names
// apart those that need an approval (a new user read "allowed" for a host
// that a human could still refuse).
func TestAllowedList(t *testing.T) {
	rule := func(s string) policy.HostRule {
		h, err := policy.ParseHostRule(s)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	for _, c := range []struct {
		rules *policy.NetworkRules
		want  string
	}{
		{nil, "none: the server gives runs no network"},
		{&policy.NetworkRules{Allow: []policy.HostRule{rule("api.github.com")}, Approve: []policy.HostRule{rule("*.internal.example")}},
			"allowed: api.github.com; with an approval: *.internal.example"},
		{&policy.NetworkRules{Approve: []policy.HostRule{rule("files.test")}}, "with an approval: files.test"},
	} {
		if got := allowedList(c.rules); got != c.want {
			t.Errorf("allowedList = %q, want %q", got, c.want)
		}
	}
}
