package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/pysandbox/pysandbox/internal/policy"
)

// recorder collects a proxy's records.
type recorder struct {
	mu   sync.Mutex
	recs []Record
}

func (r *recorder) add(rec Record) {
	r.mu.Lock()
	r.recs = append(r.recs, rec)
	r.mu.Unlock()
}

func (r *recorder) all() []Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Record(nil), r.recs...)
}

// last waits for the n-th record (the proxy records a connection once it
// is over, after the client may have seen its end).
func (r *recorder) nth(t *testing.T, n int) Record {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if recs := r.all(); len(recs) >= n {
			return recs[n-1]
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no record %d; have %+v", n, r.all())
	return Record{}
}

func rules(t *testing.T, allow ...string) *policy.NetworkRules {
	t.Helper()
	r := &policy.NetworkRules{Limits: policy.DefaultNetLimits}
	for _, a := range allow {
		h, err := policy.ParseHostRule(a)
		if err != nil {
			t.Fatal(err)
		}
		r.Allow = append(r.Allow, h)
	}
	return r
}

// serve starts a grant on a loopback listener standing in for the one a
// sandbox hands over, and returns the proxy URL to reach it.
func serve(t *testing.T, p *Proxy, gc GrantConfig) (*Grant, *url.URL) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := p.NewGrant(gc)
	g.Serve(l)
	t.Cleanup(g.Close)
	return g, &url.URL{Scheme: "http", Host: l.Addr().String()}
}

func client(proxy *url.URL) *http.Client {
	return &http.Client{
		Transport: &http.Transport{Proxy: http.ProxyURL(proxy), TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DisableKeepAlives: true},
		Timeout:   20 * time.Second,
	}
}

func hostPort(t *testing.T, rawURL string) (string, int) {
	u, _ := url.Parse(rawURL)
	h, p, _ := net.SplitHostPort(u.Host)
	n, _ := strconv.Atoi(p)
	return h, n
}

func TestPlainAndConnect(t *testing.T) {
	body := strings.Repeat("x", 100_000)
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Host == "" || r.URL.IsAbs() {
			t.Errorf("upstream got Host %q, URI %q", r.Host, r.RequestURI)
		}
		if r.Header.Get("Proxy-Authorization") != "" {
			t.Error("Proxy-Authorization passed on")
		}
		io.WriteString(w, body)
	}))
	defer plain.Close()
	secure := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "secret") }))
	defer secure.Close()
	_, pport := hostPort(t, plain.URL)
	_, sport := hostPort(t, secure.URL)
	rec := &recorder{}
	p := New(Config{Rules: func() *policy.NetworkRules {
		return rules(t, "127.0.0.1:"+strconv.Itoa(pport), "127.0.0.1:"+strconv.Itoa(sport))
	}, OnRecord: rec.add})
	_, purl := serve(t, p, GrantConfig{Info: Info{Identity: "alice", CallID: "c1"}})
	c := client(purl)

	req, _ := http.NewRequest("GET", plain.URL+"/data", nil)
	req.Header.Set("Proxy-Authorization", "Basic eDp5")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(got) != body {
		t.Fatalf("plain: %d, %d bytes", resp.StatusCode, len(got))
	}
	r := rec.nth(t, 1)
	if r.Decision != Allowed || r.Method != "GET" || r.Host != "127.0.0.1" || r.Port != pport || r.Address != "127.0.0.1:"+strconv.Itoa(pport) ||
		r.BytesIn < int64(len(body)) || r.BytesOut == 0 || r.Identity != "alice" || r.CallID != "c1" {
		t.Errorf("plain record %+v", r)
	}

	resp, err = c.Get(secure.URL)
	if err != nil {
		t.Fatal(err)
	}
	got, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(got) != "secret" {
		t.Fatalf("connect: %q", got)
	}
	r = rec.nth(t, 2)
	if r.Decision != Allowed || r.Method != "CONNECT" || r.Port != sport || r.BytesIn == 0 || r.BytesOut == 0 {
		t.Errorf("connect record %+v", r)
	}
}

// rawRequest sends text to the proxy and returns its status line.
func rawRequest(t *testing.T, proxy *url.URL, text string) string {
	t.Helper()
	c, err := net.Dial("tcp", proxy.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	io.WriteString(c, text)
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("%q: %v", text, err)
	}
	return strings.TrimSpace(line)
}

func TestRefusals(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "inside") }))
	defer up.Close()
	_, port := hostPort(t, up.URL)
	ps := strconv.Itoa(port)
	dns := startDNS(t, map[string]string{
		"meta.test.":      "169.254.169.254",
		"private.test.":   "10.1.2.3",
		"loop.test.":      "127.0.0.1",
		"mapped.test.":    "::ffff:127.0.0.1",
		"rebind.test.":    "127.0.0.1",
		"cgnat.test.":     "100.100.100.200",
		"ula.test.":       "fd00:ec2::254",
		"public.test.":    "203.0.113.9", // documentation range: reserved too
		"linklocal.test.": "fe80::1",
	})
	rec := &recorder{}
	p := New(Config{
		Rules: func() *policy.NetworkRules {
			r := rules(t, "*.test", "localhost", "allowed.example:"+ps, "127.0.0.1:"+ps, "pinned.example:"+ps+"=127.0.0.1")
			deny, _ := policy.ParseHostRule("evil.test")
			r.Deny = []policy.HostRule{deny}
			return r
		},
		Resolver: dns,
		OnRecord: rec.add,
	})
	_, purl := serve(t, p, GrantConfig{})
	for _, c := range []struct{ req, want string }{
		{"CONNECT nothere.example:443 HTTP/1.1\r\nHost: nothere.example:443\r\n\r\n", "403 pysandbox network proxy: nothere.example:443 is not among the hosts"},
		{"CONNECT evil.test:443 HTTP/1.1\r\n\r\n", `403 pysandbox network proxy: the network policy denies evil.test:443 (rule "evil.test")`},
		{"CONNECT meta.test:80 HTTP/1.1\r\n\r\n", "403 pysandbox network proxy: meta.test leads inside (169.254.169.254 is the cloud metadata address)"},
		{"CONNECT private.test:" + ps + " HTTP/1.1\r\n\r\n", "10.1.2.3 is a private address"},
		{"CONNECT loop.test:" + ps + " HTTP/1.1\r\n\r\n", "127.0.0.1 is a loopback address"},
		{"CONNECT mapped.test:" + ps + " HTTP/1.1\r\n\r\n", "127.0.0.1 is a loopback address"},
		{"CONNECT cgnat.test:80 HTTP/1.1\r\n\r\n", "reserved address (100.64.0.0/10)"},
		{"CONNECT ula.test:80 HTTP/1.1\r\n\r\n", "cloud metadata"},
		{"CONNECT linklocal.test:80 HTTP/1.1\r\n\r\n", "link-local"},
		{"CONNECT public.test:80 HTTP/1.1\r\n\r\n", "reserved address (203.0.113.0/24)"},
		{"CONNECT localhost:" + ps + " HTTP/1.1\r\n\r\n", "localhost leads inside (127.0.0.1 is a loopback address"},
		// A rule naming the address opens that address and port only.
		{"CONNECT 127.0.0.1:" + strconv.Itoa(port+1) + " HTTP/1.1\r\n\r\n", "403"},
		{"CONNECT [::ffff:127.0.0.1]:" + strconv.Itoa(port+1) + " HTTP/1.1\r\n\r\n", "403"},
		{"CONNECT [::1]:" + ps + " HTTP/1.1\r\n\r\n", "403"},
		// Addresses in other spellings are refused before any lookup.
		{"CONNECT 2130706433:" + ps + " HTTP/1.1\r\n\r\n", "400 pysandbox network proxy: CONNECT wants HOST:PORT: \"2130706433\" looks like an IP address"},
		{"CONNECT 0177.0.0.1:" + ps + " HTTP/1.1\r\n\r\n", "looks like an IP address"},
		{"CONNECT 0x7f.1:" + ps + " HTTP/1.1\r\n\r\n", "looks like an IP address"},
		{"CONNECT 127.1:" + ps + " HTTP/1.1\r\n\r\n", "looks like an IP address"},
		// The Host header must name the CONNECT target.
		{"CONNECT allowed.example:" + ps + " HTTP/1.1\r\nHost: evil.test:443\r\n\r\n", "400 pysandbox network proxy: the Host header"},
		{"GET https://allowed.example/ HTTP/1.1\r\nHost: allowed.example\r\n\r\n", "400 pysandbox network proxy: https:// goes through CONNECT"},
		{"GET / HTTP/1.1\r\nHost: allowed.example\r\n\r\n", "400 pysandbox network proxy: send requests to this proxy as absolute http:// URLs"},
		{"GET http://evil.test/ HTTP/1.1\r\nHost: allowed.example\r\n\r\n", "403 pysandbox network proxy: the network policy denies evil.test:80"},
		{"CONNECT rebind.test:" + ps + " HTTP/1.1\r\n\r\n", "loopback"},
		{"garbage\r\n\r\n", "400"},
	} {
		if got := rawRequest(t, purl, c.req); !strings.Contains(got, c.want) {
			t.Errorf("%q:\n got %q\nwant %q", strings.SplitN(c.req, "\r\n", 2)[0], got, c.want)
		}
	}
	// A name pinned to an address is not looked up, nor checked.
	if got := rawRequest(t, purl, "GET http://pinned.example:"+ps+"/ HTTP/1.1\r\n\r\n"); !strings.HasPrefix(got, "HTTP/1.1 200") {
		t.Errorf("pinned: %q", got)
	}
	// The address rule itself works.
	if got := rawRequest(t, purl, "GET http://127.0.0.1:"+ps+"/ HTTP/1.1\r\nHost: evil.test\r\n\r\n"); !strings.HasPrefix(got, "HTTP/1.1 200") {
		t.Errorf("allowed address: %q", got)
	}
	for _, r := range rec.all() {
		if r.Decision == Allowed && r.Host != "127.0.0.1" && r.Host != "pinned.example" {
			t.Errorf("allowed %+v", r)
		}
	}
}

func TestLimits(t *testing.T) {
	big := strings.Repeat("y", 1<<20)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		switch r.URL.Path {
		case "/slow":
			select {
			case <-r.Context().Done():
			case <-time.After(time.Minute):
			}
		case "/small":
			return
		}
		io.WriteString(w, big)
	}))
	defer up.Close()
	_, port := hostPort(t, up.URL)
	rec := &recorder{}
	// The connection time is long enough for a small request on a busy
	// machine (300 ms once cut one short under a loaded CI run); /slow
	// outlasts it by far.
	lim := policy.NetLimits{BytesIn: 300 << 10, BytesOut: 200 << 10, Connections: 3, ConnTime: 3 * time.Second}
	// The connection time is checked with /slow; the connections after
	// it get a time no busy machine reaches, since a small request was
	// cut short once under a loaded race-detector run. The rules are read
	// for each connection.
	var limMu sync.Mutex
	p := New(Config{Rules: func() *policy.NetworkRules {
		r := rules(t, "127.0.0.1:"+strconv.Itoa(port))
		limMu.Lock()
		r.Limits = lim
		limMu.Unlock()
		return r
	}, OnRecord: rec.add})
	g, purl := serve(t, p, GrantConfig{})
	c := client(purl)
	resp, err := c.Get(up.URL + "/big")
	if err == nil {
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if n >= int64(len(big)) {
			t.Errorf("read %d bytes past the 300 KiB limit", n)
		}
	}
	if r := rec.nth(t, 1); r.Limit != "bytes_in" || r.BytesIn > lim.BytesIn {
		t.Errorf("bytes_in record %+v", r)
	}
	// Sending: the grant's byte count starts over only with SetCall.
	g.SetCall(Info{CallID: "c2"})
	_, err = c.Post(up.URL+"/up", "text/plain", strings.NewReader(strings.Repeat("z", 1<<20)))
	if r := rec.nth(t, 2); r.Limit != "bytes_out" || r.BytesOut > lim.BytesOut || r.CallID != "c2" {
		t.Errorf("bytes_out record %+v (%v)", r, err)
	}
	// The connection time.
	g.SetCall(Info{CallID: "c3"})
	start := time.Now()
	resp, err = c.Get(up.URL + "/slow")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway {
			t.Errorf("a connection outlived its time: %s", resp.Status)
		}
	}
	if time.Since(start) > 30*time.Second {
		t.Errorf("a connection outlived its time by far")
	}
	if r := rec.nth(t, 3); r.Limit != "connection_time" {
		t.Errorf("connection_time record %+v", r)
	}
	limMu.Lock()
	lim.ConnTime = 10 * time.Minute
	limMu.Unlock()
	// The connection count: three used.
	for i := 0; i < 2; i++ {
		if got := rawRequest(t, purl, "GET "+up.URL+"/small HTTP/1.1\r\n\r\n"); !strings.HasPrefix(got, "HTTP/1.1 200") {
			t.Errorf("connection %d: %q", i+2, got)
		}
	}
	if got := rawRequest(t, purl, "GET "+up.URL+"/ HTTP/1.1\r\n\r\n"); !strings.HasPrefix(got, "HTTP/1.1 429 pysandbox network proxy: this run has used its 3 connections") {
		t.Errorf("4th connection: %q", got)
	}
	// The refusal is counted once the client's connection has ended, just
	// before its record is delivered (the small requests' records may
	// come after it): wait for that record.
	refused := func(r Record) bool { return r.Decision == Limited }
	for deadline := time.Now().Add(10 * time.Second); !slices.ContainsFunc(rec.all(), refused); {
		if time.Now().After(deadline) {
			t.Fatalf("no record of the refusal: %+v", rec.all())
		}
		time.Sleep(5 * time.Millisecond)
	}
	u := g.Usage()
	if u.Connections != 3 || u.Refused != 1 || len(u.LimitsHit) != 2 {
		t.Errorf("usage %+v", u)
	}
}

// Two connections of one grant near its bytes_in limit both get through:
// the one whose answer is still coming holds part of what is left of the
// budget, not all of it. (Holding all of it ended the other at once, as
// if the limit had been reached: a small request beside a slow one.)
func TestConcurrentConnectionsShareTheBudget(t *testing.T) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			io.WriteString(w, "first part\n")
			w.(http.Flusher).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		io.WriteString(w, "small")
	}))
	defer up.Close()
	defer close(release)
	_, port := hostPort(t, up.URL)
	p := New(Config{Rules: func() *policy.NetworkRules {
		r := rules(t, "127.0.0.1:"+strconv.Itoa(port))
		r.Limits = policy.NetLimits{BytesIn: 300 << 10, BytesOut: 300 << 10, Connections: 10, ConnTime: 10 * time.Minute}
		return r
	}})
	g, purl := serve(t, p, GrantConfig{})
	g.SetCall(Info{CallID: "c1"})
	held, err := net.Dial("tcp", purl.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	held.SetDeadline(time.Now().Add(20 * time.Second))
	io.WriteString(held, "GET "+up.URL+"/hold HTTP/1.1\r\n\r\n")
	// Its status line is through: the proxy is copying its answer, and
	// holds its part of the budget until the host ends it.
	if line, err := bufio.NewReader(held).ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 200") {
		t.Fatalf("the held request: %q, %v", line, err)
	}
	for i := range 3 {
		if got := rawRequest(t, purl, "GET "+up.URL+"/small HTTP/1.1\r\n\r\n"); !strings.HasPrefix(got, "HTTP/1.1 200") {
			t.Errorf("small request %d beside the held one: %q", i, got)
		}
	}
	if u := g.Usage(); len(u.LimitsHit) != 0 {
		t.Errorf("limits hit %v, well below them", u.LimitsHit)
	}
}

func TestSlowClientAndClose(t *testing.T) {
	echo := host(t, func(c net.Conn) { io.Copy(c, c) })
	p := New(Config{Rules: func() *policy.NetworkRules { return rules(t, echo.Addr().String()) }, HeaderTimeout: 300 * time.Millisecond})
	g, purl := serve(t, p, GrantConfig{})
	// A slow loris: a header that never ends is cut off.
	c, err := net.Dial("tcp", purl.Host)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(c, "CONNECT "+echo.Addr().String()+" HTTP/1.1\r\nX: ")
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	line, _ := bufio.NewReader(c).ReadString('\n')
	if !strings.Contains(line, "400 pysandbox network proxy: no complete request within 300ms") {
		t.Errorf("slow header: %q", line)
	}
	c.Close()
	// Many at once: beyond maxPending they are closed at once.
	var held []net.Conn
	for i := 0; i < maxPending+10; i++ {
		c, err := net.Dial("tcp", purl.Host)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	last := held[len(held)-1]
	last.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := last.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("a connection beyond %d pending ones was kept: %v", maxPending, err)
	}
	for _, c := range held {
		c.Close()
	}
	// (The pending ones end at their EOF, or at the header timeout.)
	time.Sleep(3 * 300 * time.Millisecond)
	// A tunnel ends when the grant closes.
	tun, err := net.Dial("tcp", purl.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer tun.Close()
	io.WriteString(tun, "CONNECT "+echo.Addr().String()+" HTTP/1.1\r\n\r\nping")
	tun.SetReadDeadline(time.Now().Add(20 * time.Second))
	br := bufio.NewReader(tun)
	for {
		l, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if l == "\r\n" {
			break
		}
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo: %q %v", buf, err)
	}
	g.Close()
	if _, err := br.ReadByte(); err == nil {
		t.Error("the tunnel outlived its grant")
	}
	// A closed grant serves nothing more.
	if c, err := net.Dial("tcp", purl.Host); err == nil {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(buf); err == nil {
			t.Error("a closed grant answered")
		}
		c.Close()
	}
}

func TestApproval(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer up.Close()
	host, port := hostPort(t, up.URL)
	hp := net.JoinHostPort(host, strconv.Itoa(port))
	rule, _ := policy.ParseHostRule(hp)
	rec := &recorder{}
	p := New(Config{Rules: func() *policy.NetworkRules {
		return &policy.NetworkRules{Approve: []policy.HostRule{rule}, Limits: policy.DefaultNetLimits}
	}, OnRecord: rec.add})
	// No way to ask: refused, saying so.
	_, purl := serve(t, p, GrantConfig{})
	if got := rawRequest(t, purl, "GET "+up.URL+"/ HTTP/1.1\r\n\r\n"); !strings.Contains(got, "403 pysandbox network proxy: "+hp+" needs the user's approval") {
		t.Errorf("no ask: %q", got)
	}
	// Asked once per grant; the answer holds.
	var asks int
	var mu sync.Mutex
	answer := error(nil)
	_, purl = serve(t, p, GrantConfig{Ask: func(ctx context.Context, h string, pt int) error {
		mu.Lock()
		defer mu.Unlock()
		asks++
		if h != host || pt != port {
			t.Errorf("asked about %s:%d", h, pt)
		}
		return answer
	}})
	for i := 0; i < 3; i++ {
		if got := rawRequest(t, purl, "GET "+up.URL+"/ HTTP/1.1\r\n\r\n"); !strings.HasPrefix(got, "HTTP/1.1 200") {
			t.Errorf("approved: %q", got)
		}
	}
	if asks != 1 {
		t.Errorf("asked %d times", asks)
	}
	answer = errors.New("the user declined " + hp)
	_, purl = serve(t, p, GrantConfig{Ask: func(ctx context.Context, h string, pt int) error { return answer }})
	if got := rawRequest(t, purl, "GET "+up.URL+"/ HTTP/1.1\r\n\r\n"); !strings.Contains(got, "403 pysandbox network proxy: the user declined") {
		t.Errorf("declined: %q", got)
	}
	decisions := map[string]int{}
	rec.nth(t, 5)
	for _, r := range rec.all() {
		decisions[r.Decision]++
	}
	if decisions[Declined] != 2 || decisions[Approved] != 3 {
		t.Errorf("decisions %v", decisions)
	}
}

func TestInternal(t *testing.T) {
	for addr, want := range map[string]string{
		"8.8.8.8": "", "2606:4700::1111": "", "1.1.1.1": "",
		"127.0.0.1": "loopback", "::1": "loopback", "10.0.0.1": "private", "172.16.0.1": "private", "192.168.1.1": "private",
		"fc00::1": "private", "169.254.1.1": "link-local", "fe80::1": "link-local", "224.0.0.1": "multicast",
		"ff02::1": "multicast", "0.0.0.0": "unspecified", "::": "unspecified", "255.255.255.255": "broadcast",
		"0.1.2.3": "reserved", "64:ff9b::a00:1": "reserved", "2002:a00:1::": "reserved", "::ffff:10.0.0.1": "private",
		// IPv4-compatible, SIIT and site-local forms of inside addresses.
		"::7f00:1": "reserved address (::/96)", "::10.0.0.1": "reserved address (::/96)", "::ffff:0:a00:1": "reserved address (::ffff:0:0:0/96)",
		"::ffff:0:7f00:1": "reserved", "fec0::1": "reserved address (fec0::/10)",
	} {
		got := internal(mustAddr(addr))
		if want == "" && got != "" || !strings.Contains(got, want) {
			t.Errorf("%s: %q, want %q", addr, got, want)
		}
	}
}

// startDNS serves A and AAAA answers for names on 127.0.0.1 and returns a
// resolver that asks it (the Go resolver, as the proxy uses).
func startDNS(t *testing.T, names map[string]string) *net.Resolver {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			var m dnsmessage.Message
			if m.Unpack(buf[:n]) != nil || len(m.Questions) != 1 {
				continue
			}
			q := m.Questions[0]
			m.Header.Response, m.Header.Authoritative = true, true
			m.Answers = nil
			if v, ok := names[strings.ToLower(q.Name.String())]; ok {
				a := mustAddr(v)
				h := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 1}
				switch {
				case q.Type == dnsmessage.TypeA && a.Is4():
					h.Type = dnsmessage.TypeA
					m.Answers = append(m.Answers, dnsmessage.Resource{Header: h, Body: &dnsmessage.AResource{A: a.As4()}})
				case q.Type == dnsmessage.TypeAAAA && a.Is6():
					h.Type = dnsmessage.TypeAAAA
					m.Answers = append(m.Answers, dnsmessage.Resource{Header: h, Body: &dnsmessage.AAAAResource{AAAA: a.As16()}})
				}
			} else {
				m.Header.RCode = dnsmessage.RCodeNameError
			}
			if out, err := m.Pack(); err == nil {
				pc.WriteTo(out, from)
			}
		}
	}()
	addr := pc.LocalAddr().String()
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", addr)
	}}
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

// TestRefusalRecordsAreCapped floods a grant with refused connections, and
// requests the proxy cannot read: every one is answered, the first
// maxRefusalRecords have a record each, and one summary counts the rest, so
// a run cannot fill the audit log.
func TestRefusalRecordsAreCapped(t *testing.T) {
	rec := &recorder{}
	p := New(Config{Rules: func() *policy.NetworkRules { return rules(t, "allowed.example") }, OnRecord: rec.add, HeaderTimeout: 300 * time.Millisecond})
	g, purl := serve(t, p, GrantConfig{Info: Info{CallID: "c1"}})
	// Requests the proxy cannot read are on the record.
	if got := rawRequest(t, purl, "garbage\r\n\r\n"); !strings.Contains(got, "400") {
		t.Errorf("garbage: %q", got)
	}
	if got := rawRequest(t, purl, "CONNECT a:1 HTTP/1.1\r\nX: "+strings.Repeat("x", maxHeaderBytes)+"\r\n\r\n"); !strings.Contains(got, "longer than") {
		t.Errorf("long header: %q", got)
	}
	if got := rawRequest(t, purl, "CONNECT a:1 HTTP/1.1\r\n"); !strings.Contains(got, "no complete request within 300ms") {
		t.Errorf("slow header: %q", got)
	}
	// A connection that sends nothing asked for nothing.
	if c, err := net.Dial("tcp", purl.Host); err == nil {
		c.Close()
	}
	for i, r := range []Record{rec.nth(t, 1), rec.nth(t, 2), rec.nth(t, 3)} {
		if r.Decision != Failed || r.CallID != "c1" || r.Reason == "" {
			t.Errorf("unreadable request %d: %+v", i, r)
		}
	}
	const flood = 300
	for i := 0; i < flood; i++ {
		if got := rawRequest(t, purl, "CONNECT nothere.example:443 HTTP/1.1\r\n\r\n"); !strings.Contains(got, "403") {
			t.Fatalf("refusal %d: %q", i, got)
		}
	}
	rec.nth(t, maxRefusalRecords)
	// A refusal is counted just after its answer is written: wait for the
	// last before the call changes (a guard against a hang, not a timing).
	for deadline := time.Now().Add(time.Minute); g.Usage().Refused < flood+3 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if u := g.Usage(); u.Refused != flood+3 {
		t.Errorf("usage counts %d refusals, want %d", u.Refused, flood+3)
	}
	// A session's next call gets the summary of the one before, and a
	// fresh allowance.
	g.SetCall(Info{CallID: "c2"})
	if got := rawRequest(t, purl, "CONNECT nothere.example:443 HTTP/1.1\r\n\r\n"); !strings.Contains(got, "403") {
		t.Fatalf("after SetCall: %q", got)
	}
	g.Close()
	recs := rec.all()
	if len(recs) != maxRefusalRecords+2 {
		t.Fatalf("%d records, want %d", len(recs), maxRefusalRecords+2)
	}
	sum := recs[maxRefusalRecords]
	want := flood + 3 - maxRefusalRecords
	if sum.Decision != Limited || sum.Limit != "refusals" || sum.CallID != "c1" || sum.Unrecorded[Denied] != want ||
		!strings.Contains(sum.Reason, strconv.Itoa(want)+" more refused connections (deny "+strconv.Itoa(want)+")") {
		t.Errorf("summary %+v", sum)
	}
	if last := recs[len(recs)-1]; last.Decision != Denied || last.CallID != "c2" {
		t.Errorf("after SetCall: %+v", last)
	}
}

// TestOpenConnectionsAreCapped holds connections waiting for an approval
// that never comes: past maxOpen, the proxy closes new ones at once.
func TestOpenConnectionsAreCapped(t *testing.T) {
	rule, _ := policy.ParseHostRule("ask.example")
	p := New(Config{Rules: func() *policy.NetworkRules {
		return &policy.NetworkRules{Approve: []policy.HostRule{rule}, Limits: policy.DefaultNetLimits}
	}})
	g, purl := serve(t, p, GrantConfig{Ask: func(ctx context.Context, h string, pt int) error {
		<-ctx.Done()
		return ctx.Err()
	}})
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	open := func() int {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.conns)
	}
	for i := 0; i < maxOpen; i++ {
		c, err := net.Dial("tcp", purl.Host)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		io.WriteString(c, "CONNECT ask.example:443 HTTP/1.1\r\n\r\n")
		// Past maxPending requests being read, connections are closed
		// too: let each batch get to the approval first.
		for end := time.Now().Add(30 * time.Second); time.Now().Before(end) &&
			((i+1)%32 == 0 && g.pending.Load() > 0 || open() < i+1-maxPending/2); {
			time.Sleep(time.Millisecond)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for open() < maxOpen && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := open(); n != maxOpen {
		t.Fatalf("%d connections open, want %d", n, maxOpen)
	}
	extra, err := net.Dial("tcp", purl.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	io.WriteString(extra, "CONNECT ask.example:443 HTTP/1.1\r\n\r\n")
	extra.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := extra.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("a connection beyond %d open ones was kept: %v", maxOpen, err)
	}
	if n := open(); n > maxOpen {
		t.Errorf("%d connections open", n)
	}
}

// A host that takes a plain request and never answers: closing the grant
// ends the connection to it, so Close returns (it waited for the host
// before, as long as connection_time allowed).
func TestCloseEndsASilentHost(t *testing.T) {
	silent, _ := net.Listen("tcp", "127.0.0.1:0")
	defer silent.Close()
	held := make(chan net.Conn, 1)
	go func() {
		c, err := silent.Accept()
		if err == nil {
			held <- c
		}
	}()
	p := New(Config{Rules: func() *policy.NetworkRules { return rules(t, silent.Addr().String()) }})
	g, purl := serve(t, p, GrantConfig{})
	c, err := net.Dial("tcp", purl.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET http://"+silent.Addr().String()+"/ HTTP/1.1\r\nHost: "+silent.Addr().String()+"\r\n\r\n")
	up := <-held
	defer up.Close()
	done := make(chan struct{})
	go func() { g.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second): // a guard against a hang: Close takes milliseconds
		t.Fatal("Close waited for a host that never answers")
	}
}

func TestTarget(t *testing.T) {
	for raw, want := range map[string]string{
		"https://GitHub.com./x":         "github.com:443",
		"http://mirror.example/pbs":     "mirror.example:80",
		"http://127.0.0.1:8080/a":       "127.0.0.1:8080",
		"https://[::ffff:10.0.0.5]/i":   "10.0.0.5:443",
		"https://[fd00::5]:8443/simple": "[fd00::5]:8443",
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		if got := Target(u); got != want {
			t.Errorf("Target(%s) = %s, want %s", raw, got, want)
		}
	}
}
