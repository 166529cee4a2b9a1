// Package egress is a sandbox's only way out to the network: an HTTP proxy
// in the server process that connects to the hosts the policy allows, and
// to nothing else.
//
// A sandbox has a network namespace of its own with only lo in it. The
// sandbox listens on 127.0.0.1:sandbox.ProxyPort inside that namespace
// before any code a caller controls runs, and hands the listening socket to
// the server, which accepts on it here. A run's HTTP_PROXY and HTTPS_PROXY
// point there, so requests, urllib, httpx, pip and pandas go through the
// proxy unchanged; code that ignores them finds no route at all, since lo
// is the only interface.
//
// The proxy speaks HTTP CONNECT (for TLS, decided on the CONNECT target,
// without interception) and plain HTTP in absolute form (decided on the
// URL's host, which is also the Host sent on). It resolves names itself and
// refuses internal addresses after resolution, so DNS rebinding to
// 127.0.0.1 or 169.254.169.254 fails; only a rule that names an address
// opens that address. Each connection is one Record, with the bytes each
// way, for the audit log and the metrics.
//
// The mechanics are Go's net/http: http.ReadRequest parses what a client
// sends (it is hostile: header size and read time are bounded before it
// sees a byte), Request.Write and http.ReadResponse carry a plain HTTP
// exchange, and a CONNECT tunnel is two io.Copy calls through counting
// connections.
package egress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pysandbox/pysandbox/internal/policy"
)

// Info says whom a grant's connections belong to, for their records.
type Info struct {
	Identity string
	Tool     string
	// CallID names the tool call in the audit log (its call record
	// carries the same id).
	CallID  string
	Session string
}

// Record is one connection a sandbox asked for, allowed or not.
type Record struct {
	Info
	Method   string // CONNECT, or the plain HTTP method
	Host     string
	Port     int
	Address  string // the address connected to ("" when none was)
	Decision string // allow, approved, deny, declined, limit, error
	Reason   string
	BytesIn  int64 // from the host to the sandbox
	BytesOut int64 // from the sandbox to the host
	Start    time.Time
	Duration time.Duration
	// Limit names the limit that ended or refused the connection:
	// bytes_in, bytes_out, connections, connection_time; "refusals" on a
	// summary record.
	Limit string
	// Unrecorded, on a summary record, counts the refusals (by decision)
	// past maxRefusalRecords that had no record of their own.
	Unrecorded map[string]int
}

// maxRefusalRecords bounds the refusals of one grant (one call of a
// session) that get a record each: a run that opens refused connections
// in a loop would otherwise write tens of thousands of audit records a
// second. The rest are counted, and one summary record carries the count.
const maxRefusalRecords = 64

// maxOpen bounds the connections of one grant that are open at once,
// whatever state they are in (reading a request, waiting for the user's
// approval, tunnelling): each holds a goroutine and two sockets.
const maxOpen = 512

// Decisions.
const (
	Allowed  = "allow"
	Approved = "approved"
	Denied   = "deny"
	Declined = "declined"
	Limited  = "limit"
	Failed   = "error"
)

// Config configures a Proxy.
type Config struct {
	// Rules returns the rules in force (a policy reload replaces them).
	Rules func() *policy.NetworkRules
	// Resolver resolves names; nil: Go's own resolver, never the C
	// library's, which would read "0x7f.1" as an address.
	Resolver *net.Resolver
	// DialTimeout bounds one connect (default 10 s).
	DialTimeout time.Duration
	// HeaderTimeout bounds the time a client may take to send a request's
	// header (default 10 s): a slow client holds nothing for longer.
	HeaderTimeout time.Duration
	// OnRecord receives every connection's record, once it is over.
	OnRecord func(Record)
	Log      *slog.Logger
}

// Proxy serves the grants of one server.
type Proxy struct {
	cfg       Config
	recorders atomic.Pointer[[]func(Record)]
}

// AddRecorder has f receive every record too (the MCP layer's audit log
// and metrics), from now on.
func (p *Proxy) AddRecorder(f func(Record)) {
	for {
		old := p.recorders.Load()
		var list []func(Record)
		if old != nil {
			list = append(list, *old...)
		}
		list = append(list, f)
		if p.recorders.CompareAndSwap(old, &list) {
			return
		}
	}
}

func (p *Proxy) record(r Record) {
	p.cfg.OnRecord(r)
	if list := p.recorders.Load(); list != nil {
		for _, f := range *list {
			f(r)
		}
	}
}

// New returns a proxy.
func New(cfg Config) *Proxy {
	if cfg.Rules == nil {
		cfg.Rules = func() *policy.NetworkRules { return nil }
	}
	if cfg.Resolver == nil {
		cfg.Resolver = &net.Resolver{PreferGo: true}
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.HeaderTimeout <= 0 {
		cfg.HeaderTimeout = 10 * time.Second
	}
	if cfg.OnRecord == nil {
		cfg.OnRecord = func(Record) {}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Proxy{cfg: cfg}
}

// Rules are the rules in force now.
func (p *Proxy) Rules() *policy.NetworkRules { return p.cfg.Rules() }

// GrantConfig configures one grant.
type GrantConfig struct {
	Info
	// Ask asks the user about a host under an approve rule; nil refuses
	// such hosts. It returns nil when the user allowed it, or an error
	// whose text the run sees.
	Ask func(ctx context.Context, host string, port int) error
	// Rules, when set, replace the proxy's (the installer's grant).
	Rules *policy.NetworkRules
	// Trusted are targets (host:port, as in a URL) whose addresses are not
	// checked: the package indexes the operator configured by name.
	Trusted []string
}

// Usage is what a grant used so far.
type Usage struct {
	Connections int      `json:"connections"`
	Refused     int      `json:"refused,omitempty"`
	BytesIn     int64    `json:"bytes_in"`
	BytesOut    int64    `json:"bytes_out"`
	LimitsHit   []string `json:"limits_hit,omitempty"`
}

// Grant is the network of one run, or one session: the listeners it
// serves and the connections made through them.
type Grant struct {
	p   *Proxy
	cfg GrantConfig
	// ctx ends when the grant closes; every dial and approval waits on it.
	ctx    context.Context
	cancel context.CancelFunc

	mu        sync.Mutex
	info      Info
	limits    policy.NetLimits
	conns     map[net.Conn]struct{} // open, both sides
	listeners []net.Listener
	approved  map[string]bool
	closed    bool
	usage     Usage
	// recordedRefusals counts the refusals recorded one by one since the
	// grant started (or since SetCall); unrecorded counts the rest.
	recordedRefusals int
	unrecorded       map[string]int

	askMu sync.Mutex // one question to the user at a time
	// pending counts the connections still sending their request.
	pending atomic.Int32
	in      atomic.Int64
	out     atomic.Int64
	wg      sync.WaitGroup
}

// NewGrant starts a grant. Its limits are the rules' at this moment.
func (p *Proxy) NewGrant(gc GrantConfig) *Grant {
	ctx, cancel := context.WithCancel(context.Background())
	g := &Grant{p: p, cfg: gc, ctx: ctx, cancel: cancel, info: gc.Info,
		conns: map[net.Conn]struct{}{}, approved: map[string]bool{}}
	g.limits = policy.DefaultNetLimits
	if r := g.rules(); r != nil {
		g.limits = r.Limits
	}
	return g
}

func (g *Grant) rules() *policy.NetworkRules {
	if g.cfg.Rules != nil {
		return g.cfg.Rules
	}
	return g.p.cfg.Rules()
}

// SetCall moves a session's grant on to its next call: later connections
// are recorded under it, and the per-run limits count afresh. Approvals
// hold for the session's life.
func (g *Grant) SetCall(info Info) {
	g.mu.Lock()
	sum := g.takeSummary()
	g.info = info
	g.usage = Usage{}
	if r := g.rules(); r != nil {
		g.limits = r.Limits
	}
	g.mu.Unlock()
	g.in.Store(0)
	g.out.Store(0)
	if sum != nil {
		g.p.record(*sum)
	}
}

// takeSummary returns the summary record of the refusals that had none of
// their own, and starts counting afresh; nil when there were none. g.mu
// is held.
func (g *Grant) takeSummary() *Record {
	g.recordedRefusals = 0
	if len(g.unrecorded) == 0 {
		return nil
	}
	n, parts := 0, []string{}
	for _, d := range []string{Denied, Declined, Limited, Failed} {
		if c := g.unrecorded[d]; c > 0 {
			n += c
			parts = append(parts, fmt.Sprintf("%s %d", d, c))
		}
	}
	r := &Record{Info: g.info, Decision: Limited, Limit: "refusals", Start: time.Now(), Unrecorded: g.unrecorded,
		Reason: fmt.Sprintf("%d more refused connections (%s) have no record of their own: a run gets at most %d refusal records", n, strings.Join(parts, ", "), maxRefusalRecords)}
	g.unrecorded = nil
	return r
}

// noteRefusal counts a refusal, and reports whether it gets a record of
// its own.
func (g *Grant) noteRefusal(decision string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.usage.Refused++
	if g.recordedRefusals < maxRefusalRecords {
		g.recordedRefusals++
		return true
	}
	if g.unrecorded == nil {
		g.unrecorded = map[string]int{}
	}
	g.unrecorded[decision]++
	return false
}

// Info is whom the grant's connections are recorded under now.
func (g *Grant) Info() Info {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.info
}

// Usage returns what the grant used since it started (or since SetCall).
func (g *Grant) Usage() Usage {
	g.mu.Lock()
	defer g.mu.Unlock()
	u := g.usage
	u.LimitsHit = append([]string(nil), u.LimitsHit...)
	u.BytesIn, u.BytesOut = g.in.Load(), g.out.Load()
	return u
}

// maxPending bounds the connections of one grant that have not yet sent
// their request: each holds a goroutine and a buffer until HeaderTimeout.
const maxPending = 64

// Serve accepts connections on l until the grant closes. It returns at
// once; l is closed with the grant.
func (g *Grant) Serve(l net.Listener) {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		l.Close()
		return
	}
	g.listeners = append(g.listeners, l)
	g.wg.Add(1)
	g.mu.Unlock()
	go func() {
		defer g.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					continue
				}
				return
			}
			if g.pending.Load() >= maxPending || !g.track(c) {
				c.Close()
				continue
			}
			g.pending.Add(1)
			g.wg.Add(1)
			go func() {
				defer g.wg.Done()
				defer g.untrack(c)
				g.handle(c, func() { g.pending.Add(-1) })
			}()
		}
	}()
}

// track registers an open connection so that Close can end it.
func (g *Grant) track(c net.Conn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed || len(g.conns) >= maxOpen {
		return false
	}
	g.conns[c] = struct{}{}
	return true
}

func (g *Grant) untrack(c net.Conn) {
	c.Close()
	g.mu.Lock()
	delete(g.conns, c)
	g.mu.Unlock()
}

// Close stops the grant: its listeners close, every connection through
// it ends, and Close returns once every record has been delivered.
func (g *Grant) Close() {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		g.wg.Wait()
		return
	}
	g.closed = true
	for _, l := range g.listeners {
		l.Close()
	}
	for c := range g.conns {
		c.Close()
	}
	g.mu.Unlock()
	g.cancel()
	g.wg.Wait()
	g.mu.Lock()
	sum := g.takeSummary()
	g.mu.Unlock()
	if sum != nil {
		g.p.record(*sum)
	}
}

// limitHit notes a limit in the usage, once.
func (g *Grant) limitHit(name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, l := range g.usage.LimitsHit {
		if l == name {
			return
		}
	}
	g.usage.LimitsHit = append(g.usage.LimitsHit, name)
}

// admit counts a new connection against the limit.
func (g *Grant) admit() (policy.NetLimits, Info, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.usage.Connections >= g.limits.Connections {
		return g.limits, g.info, false
	}
	g.usage.Connections++
	return g.limits, g.info, true
}

func (g *Grant) currentInfo() Info {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.info
}

// trusted reports whether host:port is one of the grant's trusted targets.
func (g *Grant) trusted(host string, port int) bool {
	hp := net.JoinHostPort(host, strconv.Itoa(port))
	for _, t := range g.cfg.Trusted {
		if t == hp {
			return true
		}
	}
	return false
}

// addrRule reports whether a rule of the decision names this very address.
func addrRule(rule *policy.HostRule, a netip.Addr) bool {
	return rule != nil && rule.Addr.IsValid() && rule.Addr == a.Unmap()
}

// installerLimits bound one install: far above a run's, since wheels are
// large, and still finite.
var installerLimits = policy.NetLimits{BytesIn: 8 << 30, BytesOut: 256 << 20, Connections: 10_000, ConnTime: 30 * time.Minute}

// Installer serves the listener of a dependency installer's sandbox (a
// deps.Config.Network): it may reach the trusted index and find-links
// targets, and the hosts the rules allow outright (for a requirement
// named by URL), nothing that needs approval and nothing else.
func (p *Proxy) Installer(l net.Listener, trusted []string) (stop func()) {
	rules := &policy.NetworkRules{Limits: installerLimits}
	if r := p.cfg.Rules(); r != nil {
		rules.Allow, rules.Deny = r.Allow, r.Deny
	}
	g := p.NewGrant(GrantConfig{Info: Info{Tool: "installer"}, Rules: rules, Trusted: trusted})
	g.Serve(l)
	return g.Close
}

// downloadLimits bound one download of the server's own (a managed
// interpreter, its metadata): archives are some tens of MB.
var downloadLimits = policy.NetLimits{BytesIn: 2 << 30, BytesOut: 16 << 20, Connections: 64, ConnTime: 30 * time.Minute}

// Download serves the listener of a download the server makes itself
// (internal/pydist): it may reach the trusted targets (the download host
// or mirror) and nothing else, not even what the rules allow for runs,
// unless a deny rule names the target, which still holds. Its connections
// are recorded for info, like a run's.
func (p *Proxy) Download(l net.Listener, trusted []string, info Info) (stop func()) {
	rules := &policy.NetworkRules{Limits: downloadLimits}
	if r := p.cfg.Rules(); r != nil {
		rules.Deny = r.Deny
	}
	g := p.NewGrant(GrantConfig{Info: info, Rules: rules, Trusted: trusted})
	g.Serve(l)
	return g.Close
}

// Target is the host:port a grant's Trusted list names for an http(s) URL,
// in the form the grant compares a request's target with: the host in
// lower case without a trailing dot, an address unmapped, the scheme's
// port when the URL names none.
func Target(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	host := strings.ToLower(strings.TrimSuffix(u.Hostname(), "."))
	if a, err := netip.ParseAddr(host); err == nil {
		host = a.Unmap().String()
	}
	return net.JoinHostPort(host, port)
}
