package egress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pysandbox/pysandbox/internal/policy"
)

// maxHeaderBytes bounds a request's header: a proxy request is a line and
// a few headers.
const maxHeaderBytes = 64 << 10

// refusal is an answer the proxy gives instead of a connection.
type refusal struct {
	status   int
	decision string
	limit    string
	msg      string
}

func (r *refusal) Error() string { return r.msg }

// handle serves one connection from the sandbox: one request, then either
// a tunnel (CONNECT) or one plain HTTP exchange.
func (g *Grant) handle(c net.Conn, headerDone func()) {
	c.SetReadDeadline(time.Now().Add(g.p.cfg.HeaderTimeout))
	lr := &io.LimitedReader{R: c, N: maxHeaderBytes}
	// A copy of the header as sent: ReadRequest drops the Host header,
	// which a CONNECT must be checked against.
	hdr := &headerCopy{}
	br := bufio.NewReaderSize(io.TeeReader(lr, hdr), 16<<10)
	req, err := http.ReadRequest(br)
	hdr.done = true
	headerDone()
	if err != nil {
		// A connection that closed before sending anything asked for
		// nothing; everything else is on the record (within the cap on
		// refusal records), since a client that never gets its request
		// through is exactly what an operator wants to see.
		if len(hdr.b) == 0 && (errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed)) {
			return
		}
		rec := Record{Info: g.currentInfo(), Decision: Failed, Start: time.Now()}
		var ne net.Error
		switch {
		case errors.As(err, &ne) && ne.Timeout():
			rec.Reason = fmt.Sprintf("no complete request within %s", g.p.cfg.HeaderTimeout)
		case lr.N <= 0:
			rec.Reason = fmt.Sprintf("a request header longer than %d bytes", maxHeaderBytes)
		case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
			rec.Reason = "the connection closed in the middle of a request"
		default:
			rec.Reason = "the proxy could not read a request: " + shortErr(err)
		}
		writeRefusal(c, &refusal{status: http.StatusBadRequest, msg: rec.Reason})
		c.Close()
		rec.Duration = time.Since(rec.Start)
		if g.noteRefusal(rec.Decision) {
			g.p.record(rec)
		}
		return
	}
	c.SetReadDeadline(time.Time{})
	lr.N = math.MaxInt64 // the body, if any, is the upstream's business
	rec := Record{Info: g.currentInfo(), Method: req.Method, Start: time.Now()}
	if req.Method == http.MethodConnect {
		g.connect(c, br, req, hdr.host(), &rec)
	} else {
		g.plain(c, br, req, &rec)
	}
	// The client's connection ends before the record is delivered: a
	// recorder may wait for the audit log's disk sync, and a client
	// that reads a response to the end of the connection (one without a
	// length) would wait for it too. Serve's untrack closes it again,
	// harmlessly.
	c.Close()
	rec.Duration = time.Since(rec.Start)
	if rec.Decision != Allowed && rec.Decision != Approved && !g.noteRefusal(rec.Decision) {
		return
	}
	g.p.record(rec)
}

// connect serves a CONNECT: the tunnel's target is the request's
// authority, and any Host header must name the same.
func (g *Grant) connect(c net.Conn, br *bufio.Reader, req *http.Request, hostHeader string, rec *Record) {
	host, port, err := policy.SplitHostPort(req.RequestURI, 0)
	if err != nil {
		g.refuse(c, rec, &refusal{status: http.StatusBadRequest, msg: "CONNECT wants HOST:PORT: " + err.Error()})
		return
	}
	rec.Host, rec.Port = host, port
	if h := hostHeader; h != "" && h != req.RequestURI {
		hh, hp, err := policy.SplitHostPort(h, port)
		if err != nil || hh != host || hp != port {
			g.refuse(c, rec, &refusal{status: http.StatusBadRequest, decision: Denied,
				msg: fmt.Sprintf("the Host header (%.100q) names another host than the CONNECT target %s", h, req.RequestURI)})
			return
		}
	}
	up, ref := g.open(rec)
	if ref != nil {
		g.refuse(c, rec, ref)
		return
	}
	defer up.Close()
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	// What the client sent after its request (a TLS hello, eagerly) is
	// already in br.
	if n := br.Buffered(); n > 0 {
		b, _ := br.Peek(n)
		if _, err := up.Write(b); err != nil {
			return
		}
		br.Discard(n)
	}
	relay(c, up)
}

// hopHeaders are a connection's own business, never passed on.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authorization",
	"Proxy-Authenticate", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// plain serves one plain HTTP request in absolute form, over a connection
// of its own that closes after the response.
func (g *Grant) plain(c net.Conn, br *bufio.Reader, req *http.Request, rec *Record) {
	if req.URL == nil || req.URL.Host == "" || !strings.EqualFold(req.URL.Scheme, "http") {
		msg := "send requests to this proxy as absolute http:// URLs"
		if req.URL != nil && strings.EqualFold(req.URL.Scheme, "https") {
			msg = "https:// goes through CONNECT (set HTTPS_PROXY, as the sandbox does)"
		}
		g.refuse(c, rec, &refusal{status: http.StatusBadRequest, msg: msg})
		return
	}
	host, port, err := policy.SplitHostPort(req.URL.Host, 80)
	if err != nil {
		g.refuse(c, rec, &refusal{status: http.StatusBadRequest, msg: err.Error()})
		return
	}
	rec.Host, rec.Port = host, port
	up, ref := g.open(rec)
	if ref != nil {
		g.refuse(c, rec, ref)
		return
	}
	defer up.Close()
	// The request goes on in origin form, with the Host the decision was
	// made on, whatever Host header the client also sent.
	req.RequestURI = ""
	req.Host = req.URL.Host
	for _, h := range hopHeaders {
		req.Header.Del(h)
	}
	req.Close = true
	if err := req.Write(up); err != nil {
		writeRefusal(c, upstreamFailure(up, "sending the request failed", err))
		return
	}
	// The host answers once and closes (Connection: close): its answer
	// goes back as it is, to its end, spliced where the kernel can.
	up.(*counted).copyIn(c)
}

// open decides on rec's target and connects to it: the connection
// returned counts its bytes against the grant and ends at the grant's
// limits.
func (g *Grant) open(rec *Record) (net.Conn, *refusal) {
	rules := g.rules()
	act, rule := rules.Decide(rec.Host, rec.Port)
	trusted := g.trusted(rec.Host, rec.Port)
	target := net.JoinHostPort(rec.Host, strconv.Itoa(rec.Port))
	rec.Decision = Allowed
	switch {
	case act == policy.Deny && rule != nil:
		return nil, &refusal{status: http.StatusForbidden, decision: Denied,
			msg: fmt.Sprintf("the network policy denies %s (rule %q); do not retry", target, rule.String())}
	case act == policy.Deny && !trusted:
		return nil, &refusal{status: http.StatusForbidden, decision: Denied,
			msg: fmt.Sprintf("%s is not among the hosts the network policy allows (%s); ask the user to allow it", target, allowedList(rules))}
	case act == policy.Approve:
		if ref := g.approve(rec.Host, rec.Port); ref != nil {
			return nil, ref
		}
		rec.Decision = Approved
	}
	lim, info, ok := g.admit()
	rec.Info = info
	if !ok {
		g.limitHit("connections")
		return nil, &refusal{status: http.StatusTooManyRequests, decision: Limited, limit: "connections",
			msg: fmt.Sprintf("this run has used its %d connections", lim.Connections)}
	}
	raw, addr, ref := g.dial(rec.Host, rec.Port, rule, trusted)
	if ref != nil {
		return nil, ref
	}
	rec.Address = addr
	cc := &counted{Conn: raw, g: g, lim: lim, rec: rec}
	// The grant's end ends the connection to the host too: a host that
	// never answers a plain request would otherwise hold the handler,
	// and with it Close, for as long as connection_time allows.
	cc.unwatch = context.AfterFunc(g.ctx, func() { cc.Conn.Close() })
	if lim.ConnTime > 0 {
		cc.timer = time.AfterFunc(lim.ConnTime, func() {
			cc.hit("connection_time")
			cc.Conn.Close()
		})
	}
	return cc, nil
}

// approve asks the user about a host under an approve rule, once per
// grant.
func (g *Grant) approve(host string, port int) *refusal {
	key := net.JoinHostPort(host, strconv.Itoa(port))
	g.askMu.Lock()
	defer g.askMu.Unlock()
	g.mu.Lock()
	ok := g.approved[key]
	g.mu.Unlock()
	if ok {
		return nil
	}
	if g.cfg.Ask == nil {
		return &refusal{status: http.StatusForbidden, decision: Declined,
			msg: fmt.Sprintf("%s needs the user's approval under the network policy, and this run cannot ask for it; ask the user to allow the host", key)}
	}
	if err := g.cfg.Ask(g.ctx, host, port); err != nil {
		return &refusal{status: http.StatusForbidden, decision: Declined, msg: err.Error()}
	}
	g.mu.Lock()
	g.approved[key] = true
	g.mu.Unlock()
	return nil
}

// dial resolves host (unless it is an address) and connects to the first
// address that may be reached and answers.
func (g *Grant) dial(host string, port int, rule *policy.HostRule, trusted bool) (net.Conn, string, *refusal) {
	ctx, cancel := context.WithTimeout(g.ctx, g.p.cfg.DialTimeout)
	defer cancel()
	var addrs []netip.Addr
	pinned := rule != nil && rule.Pin.IsValid()
	if pinned {
		// The operator named the address: no lookup, no check.
		addrs = []netip.Addr{rule.Pin}
	} else if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a.Unmap()}
	} else {
		addrs, err = g.p.cfg.Resolver.LookupNetIP(ctx, "ip", host)
		if err != nil || len(addrs) == 0 {
			return nil, "", &refusal{status: http.StatusBadGateway, decision: Failed,
				msg: fmt.Sprintf("cannot resolve %s: %s", host, shortErr(err))}
		}
	}
	var why []string
	var lastErr error
	d := net.Dialer{}
	for _, a := range addrs {
		a = a.Unmap()
		if !trusted && !pinned && !addrRule(rule, a) {
			if r := internal(a); r != "" {
				why = append(why, fmt.Sprintf("%s is %s", a, r))
				continue
			}
		}
		ap := netip.AddrPortFrom(a, uint16(port)).String()
		c, err := d.DialContext(ctx, "tcp", ap)
		if err == nil {
			return c, ap, nil
		}
		lastErr = err
	}
	if lastErr == nil {
		return nil, "", &refusal{status: http.StatusForbidden, decision: Denied,
			msg: fmt.Sprintf("%s leads inside (%s): the proxy connects only to public addresses, unless the policy names the address itself", host, strings.Join(why, ", "))}
	}
	status := http.StatusBadGateway
	if errors.Is(lastErr, context.DeadlineExceeded) {
		status = http.StatusGatewayTimeout
	}
	return nil, "", &refusal{status: status, decision: Failed, msg: fmt.Sprintf("cannot connect to %s: %s", net.JoinHostPort(host, strconv.Itoa(port)), shortErr(lastErr))}
}

// refuse answers with the refusal and records it.
func (g *Grant) refuse(c net.Conn, rec *Record, r *refusal) {
	rec.Decision, rec.Reason, rec.Limit = r.decision, r.msg, r.limit
	if rec.Decision == "" {
		rec.Decision = Denied
	}
	writeRefusal(c, r)
}

// writeRefusal answers with an HTTP error whose reason phrase, and body,
// say what happened: an HTTP client shows the status line of a refused
// CONNECT ("Tunnel connection failed: 403 ..."), and the body of a refused
// plain request.
func writeRefusal(c net.Conn, r *refusal) {
	msg := "pysandbox network proxy: " + r.msg
	phrase := strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7e {
			return '?'
		}
		return r
	}, msg)
	if len(phrase) > 300 {
		phrase = phrase[:300]
	}
	body := msg + "\n"
	c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		r.status, phrase, len(body), body)
}

func allowedList(r *policy.NetworkRules) string {
	if r == nil || len(r.Allow)+len(r.Approve) == 0 {
		return "none: the server gives runs no network"
	}
	// Hosts that need an approval are named apart: "allowed" would
	// promise a connection that a human may refuse.
	list := func(rules []policy.HostRule) string {
		var names []string
		for _, h := range rules {
			names = append(names, h.String())
		}
		if len(names) > 10 {
			names = append(names[:10], fmt.Sprintf("and %d more", len(names)-10))
		}
		return strings.Join(names, ", ")
	}
	var parts []string
	if len(r.Allow) > 0 {
		parts = append(parts, "allowed: "+list(r.Allow))
	}
	if len(r.Approve) > 0 {
		parts = append(parts, "with an approval: "+list(r.Approve))
	}
	return strings.Join(parts, "; ")
}

func shortErr(err error) string {
	if err == nil {
		return "no address"
	}
	s := err.Error()
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		s = dnsErr.Err
	}
	if len(s) > 200 {
		s = s[:200]
	}
	return s
}

// counted is a connection to a host: it counts bytes into the grant and
// the record, and fails once a limit is reached.
type counted struct {
	net.Conn
	g     *Grant
	lim   policy.NetLimits
	timer *time.Timer
	// unwatch stops closing the connection when its grant closes.
	unwatch func() bool

	mu  sync.Mutex
	rec *Record
	in  atomic.Int64
	out atomic.Int64
}

func (c *counted) hit(limit string) {
	c.g.limitHit(limit)
	c.mu.Lock()
	if c.rec.Limit == "" {
		c.rec.Limit = limit
	}
	c.mu.Unlock()
}

var errLimit = errors.New("egress: network limit reached")

func (c *counted) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		total := c.g.in.Add(int64(n))
		if over := total - c.lim.BytesIn; over > 0 {
			keep := max(int64(n)-over, 0)
			c.g.in.Add(keep - int64(n))
			c.in.Add(keep)
			c.hit("bytes_in")
			c.Conn.Close()
			return int(keep), errLimit
		}
		c.in.Add(int64(n))
	}
	return n, err
}

func (c *counted) Write(p []byte) (int, error) {
	total := c.g.out.Add(int64(len(p)))
	if over := total - c.lim.BytesOut; over > 0 {
		keep := max(int64(len(p))-over, 0)
		c.g.out.Add(keep - int64(len(p)))
		n, _ := c.Conn.Write(p[:keep])
		c.out.Add(int64(n))
		c.hit("bytes_out")
		c.Conn.Close()
		return n, errLimit
	}
	n, err := c.Conn.Write(p)
	c.out.Add(int64(n))
	if n < len(p) {
		c.g.out.Add(int64(n - len(p)))
	}
	return n, err
}

func (c *counted) Close() error {
	if c.timer != nil {
		c.timer.Stop()
	}
	if c.unwatch != nil {
		c.unwatch()
	}
	err := c.Conn.Close()
	c.mu.Lock()
	c.rec.BytesIn, c.rec.BytesOut = c.in.Load(), c.out.Load()
	if c.rec.Limit != "" && c.rec.Reason == "" {
		c.rec.Reason = "ended at the limit " + c.rec.Limit
	}
	c.mu.Unlock()
	return err
}

// relay copies both ways until both directions are done, passing on a
// half-close, then closes both.
func relay(client, up net.Conn) {
	cc := up.(*counted)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		halfDone(cc.Conn, client, cc.copyOut(client))
	}()
	halfDone(client, up, cc.copyIn(client))
	wg.Wait()
}

// halfDone ends one direction of a tunnel: a clean end passes on as a
// half-close, a failure ends the tunnel.
func halfDone(dst, src net.Conn, err error) {
	if err != nil {
		dst.Close()
		src.Close()
		return
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	} else {
		dst.Close()
	}
}

// copyChunk bounds what one copy may move before the grant's budget is
// checked again.
const copyChunk = 1 << 20

// copyIn copies from the host to dst until the host's end or the grant's
// bytes_in budget. Each chunk is taken from the budget before it moves,
// so connections sharing it never overshoot; between two TCP sockets
// io.Copy splices, and the bytes never enter this process.
func (c *counted) copyIn(dst net.Conn) error {
	return c.copyBudget(dst, c.Conn, &c.g.in, &c.in, c.lim.BytesIn, "bytes_in")
}

// copyOut copies from src (the sandbox) to the host, against bytes_out.
func (c *counted) copyOut(src net.Conn) error {
	return c.copyBudget(c.Conn, src, &c.g.out, &c.out, c.lim.BytesOut, "bytes_out")
}

func (c *counted) copyBudget(dst io.Writer, src io.Reader, budget, mine *atomic.Int64, limit int64, name string) error {
	for {
		// Near the limit a connection takes half of what is left, not all
		// of it: a whole chunk would leave nothing to the grant's other
		// connections, which would then end at once at a limit that was
		// only held, not reached (two small requests at once, each waiting
		// for the other's chunk).
		want := int64(copyChunk)
		if left := limit - budget.Load(); left < 2*want {
			want = max(left/2, 1)
		}
		if over := budget.Add(want) - limit; over > 0 {
			budget.Add(-min(over, want))
			want -= over
			if want <= 0 {
				c.hit(name)
				return errLimit
			}
		}
		n, err := io.Copy(dst, &io.LimitedReader{R: src, N: want})
		budget.Add(n - want)
		mine.Add(n)
		if err != nil {
			return err
		}
		if n < want {
			return nil // the end of src
		}
	}
}

// upstreamFailure explains a plain exchange that failed on the host's
// side: a limit of the run's, or the host.
func upstreamFailure(up net.Conn, what string, err error) *refusal {
	if errors.Is(err, errLimit) {
		cc := up.(*counted)
		cc.mu.Lock()
		limit := cc.rec.Limit
		cc.mu.Unlock()
		n := cc.lim.BytesOut
		if limit == "bytes_in" {
			n = cc.lim.BytesIn
		}
		return &refusal{status: http.StatusTooManyRequests, msg: fmt.Sprintf("this run reached its network limit %s (%d bytes)", limit, n)}
	}
	return &refusal{status: http.StatusBadGateway, msg: what + ": " + shortErr(err)}
}

// headerCopy keeps the bytes of a request's header (up to
// maxHeaderBytes, which the reader before it enforces).
type headerCopy struct {
	b    []byte
	done bool
}

func (h *headerCopy) Write(p []byte) (int, error) {
	if !h.done {
		h.b = append(h.b, p...)
	}
	return len(p), nil
}

// host returns the value of the header's Host field ("" when none).
func (h *headerCopy) host() string {
	text := string(h.b)
	if i := strings.Index(text, "\r\n\r\n"); i >= 0 {
		text = text[:i]
	} else if i := strings.Index(text, "\n\n"); i >= 0 {
		text = text[:i]
	}
	lines := strings.Split(text, "\n")
	for _, l := range lines[min(1, len(lines)):] {
		name, value, ok := strings.Cut(strings.TrimRight(l, "\r"), ":")
		if ok && strings.EqualFold(strings.TrimSpace(name), "host") {
			return strings.TrimSpace(value)
		}
	}
	return ""
}
