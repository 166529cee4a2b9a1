package policy

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path"
	"strconv"
	"strings"
	"time"
)

// NetworkRules say which hosts a run may connect to through the server's
// proxy (internal/egress), and how much. With no allow and no approve
// rule, a run has no network at all: that is the default.
//
// A rule is HOST or HOST:PORT, or NAME[:PORT]=ADDRESS, which pins a name
// to an address the way curl's --resolve does. HOST is a DNS name, a glob over DNS names
// ("*" matches any characters, dots included, so "*.example.com" matches
// every subdomain of example.com but not example.com itself), "*" for any
// host, or an IP address ("10.0.0.5", "[fd00::5]"). Without a port a rule
// matches every port. Deny wins over approve, and approve over allow.
//
// The proxy refuses loopback, private, link-local (cloud metadata among
// them), multicast and unspecified addresses after it resolves a name, so
// an allowed name cannot lead inside. The ways in are a rule that names
// the address itself (for a connection made to that address), and a rule
// that pins a name to an address ("files.corp:443=10.0.0.5": the name is
// not resolved at all, and the connection goes to that address).
type NetworkRules struct {
	Allow   []HostRule `json:"allow,omitempty"`
	Deny    []HostRule `json:"deny,omitempty"`
	Approve []HostRule `json:"approve,omitempty"`
	Limits  NetLimits  `json:"limits"`
}

// NetLimits bound the network use of one run (of one call, in a session).
type NetLimits struct {
	BytesIn     int64         `json:"bytes_in"`    // received from every host together
	BytesOut    int64         `json:"bytes_out"`   // sent to every host together
	Connections int           `json:"connections"` // connections opened (allowed ones)
	ConnTime    time.Duration `json:"-"`           // the longest a connection may stay open
}

// DefaultNetLimits apply where a policy or the flags set none.
var DefaultNetLimits = NetLimits{
	BytesIn:     256 << 20,
	BytesOut:    64 << 20,
	Connections: 256,
	ConnTime:    5 * time.Minute,
}

// maxNetBytes bounds the byte limits (1 TiB): beyond it they limit nothing.
const maxNetBytes = 1 << 40

// HostRule is one parsed rule.
type HostRule struct {
	// Host is the lowercased DNS name or glob, or the address's text.
	Host string
	// Addr is set when the rule names an IP address.
	Addr netip.Addr
	Port int // 0: any port
	// Pin is the address a NAME=ADDRESS rule connects NAME to.
	Pin netip.Addr
}

// String writes the rule back in its own syntax.
func (r HostRule) String() string {
	h := r.Host
	if r.Addr.Is6() {
		h = "[" + h + "]"
	}
	if r.Port != 0 {
		h += ":" + strconv.Itoa(r.Port)
	}
	if r.Pin.IsValid() {
		h += "=" + r.Pin.String()
	}
	return h
}

// MarshalText makes rules print as they are written.
func (r HostRule) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// Enabled reports whether any host can be reached at all.
func (r *NetworkRules) Enabled() bool {
	return r != nil && (len(r.Allow) > 0 || len(r.Approve) > 0)
}

// Decide returns what the rules say about host:port and the rule that
// decided; with no rule matching, the answer is deny and the rule is nil.
// host must be normalized (see NormalizeHost).
func (r *NetworkRules) Decide(host string, port int) (Action, *HostRule) {
	if r == nil {
		return Deny, nil
	}
	for _, set := range []struct {
		a     Action
		rules []HostRule
	}{{Deny, r.Deny}, {Approve, r.Approve}, {Allow, r.Allow}} {
		for i := range set.rules {
			if set.rules[i].Match(host, port) {
				return set.a, &set.rules[i]
			}
		}
	}
	return Deny, nil
}

// Match reports whether the rule covers host:port.
func (r HostRule) Match(host string, port int) bool {
	if r.Port != 0 && r.Port != port {
		return false
	}
	if r.Addr.IsValid() {
		a, err := netip.ParseAddr(host)
		return err == nil && a.Unmap() == r.Addr
	}
	if r.Host == "*" {
		return true
	}
	if _, err := netip.ParseAddr(host); err == nil {
		// A glob names hosts by name: an address is not a name, even
		// when it happens to match the pattern's characters.
		return false
	}
	ok, _ := path.Match(r.Host, host)
	return ok
}

// ParseHostRule parses HOST[:PORT] or NAME[:PORT]=ADDRESS.
func ParseHostRule(s string) (HostRule, error) {
	s = strings.TrimSpace(s)
	if name, addr, ok := strings.Cut(s, "="); ok {
		r, err := ParseHostRule(name)
		if err != nil {
			return HostRule{}, err
		}
		a, err := netip.ParseAddr(strings.Trim(strings.TrimSpace(addr), "[]"))
		if err != nil || a.Zone() != "" {
			return HostRule{}, fmt.Errorf("%q: after '=' comes the address the name is pinned to, e.g. files.corp:443=10.0.0.5", s)
		}
		if r.Addr.IsValid() || strings.ContainsAny(r.Host, "*?") {
			return HostRule{}, fmt.Errorf("%q: only a plain name can be pinned to an address", s)
		}
		// 0.0.0.0 and :: name no host: connecting to them reaches this
		// machine's own services, so a pin to them opens the loopback
		// the proxy otherwise refuses.
		if a.Unmap().IsUnspecified() {
			return HostRule{}, fmt.Errorf("%q: %s is the unspecified address, not a host (a connection to it reaches this machine itself); pin the name to the address of the host it should reach", s, a)
		}
		r.Pin = a.Unmap()
		return r, nil
	}
	if s == "" || len(s) > 300 {
		return HostRule{}, errors.New("want a host of 1 to 300 characters, optionally with :PORT")
	}
	if scheme, rest, ok := strings.Cut(s, "://"); ok {
		host, _, _ := strings.Cut(rest, "/")
		return HostRule{}, fmt.Errorf("%q: want HOST[:PORT], not a URL; e.g. %s (a %s URL's port is %s unless it names one)", s, host, scheme, map[bool]string{true: "443", false: "80"}[strings.EqualFold(scheme, "https")])
	}
	host, portText := s, ""
	if strings.HasPrefix(s, "[") {
		end := strings.Index(s, "]")
		if end < 0 {
			return HostRule{}, fmt.Errorf("%q: an IPv6 address must be closed with ]", s)
		}
		host, portText = s[1:end], strings.TrimPrefix(s[end+1:], ":")
		if rest := s[end+1:]; rest != "" && !strings.HasPrefix(rest, ":") {
			return HostRule{}, fmt.Errorf("%q: want [ADDRESS] or [ADDRESS]:PORT", s)
		}
	} else if i := strings.LastIndex(s, ":"); i >= 0 {
		if strings.Count(s, ":") > 1 {
			return HostRule{}, fmt.Errorf("%q: write an IPv6 address in brackets, e.g. [%s]:443", s, s)
		}
		host, portText = s[:i], s[i+1:]
	}
	r := HostRule{}
	if portText != "" && portText != "*" {
		p, err := strconv.Atoi(portText)
		if err != nil || p < 1 || p > 65535 {
			return HostRule{}, fmt.Errorf("%q: the port must be a number from 1 to 65535", s)
		}
		r.Port = p
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if a.Zone() != "" {
			return HostRule{}, fmt.Errorf("%q: an address with a zone cannot be reached from a sandbox", s)
		}
		if a.Unmap().IsUnspecified() {
			// A rule names the addresses it allows, and the proxy does
			// not check those for being this machine's: 0.0.0.0 and ::
			// would reach the host's own services.
			return HostRule{}, fmt.Errorf("%q: %s is the unspecified address, not a host (a connection to it reaches this machine itself)", s, a)
		}
		r.Addr = a.Unmap()
		r.Host = r.Addr.String()
		return r, nil
	}
	if strings.HasPrefix(s, "[") {
		return HostRule{}, fmt.Errorf("%q: not an IPv6 address", s)
	}
	h := strings.TrimSuffix(strings.ToLower(host), ".")
	if h == "*" {
		r.Host = h
		return r, nil
	}
	for _, c := range h {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '*' || c == '?') {
			return HostRule{}, fmt.Errorf("%q: a host pattern may hold only letters, digits, '-', '.', '*' and '?'", s)
		}
	}
	if _, err := path.Match(h, ""); err != nil || h == "" || strings.Contains(h, "..") {
		return HostRule{}, fmt.Errorf("%q: not a host name or pattern", s)
	}
	if !strings.ContainsAny(h, "*?") {
		if _, err := NormalizeHost(h); err != nil {
			return HostRule{}, fmt.Errorf("%q: %v", s, err)
		}
	}
	r.Host = h
	return r, nil
}

// NormalizeHost checks a host a run asked to connect to, and returns it
// lowercased, without a trailing dot, and an address in its canonical
// form. Anything that is neither a DNS name nor an address in standard
// notation is refused: "2130706433", "0x7f.1" or "0177.0.0.1" are
// addresses to a C resolver but not to a policy author, so they never
// reach a resolver at all.
func NormalizeHost(host string) (string, error) {
	if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
		a, err := netip.ParseAddr(host)
		if err != nil || !a.Is6() {
			return "", fmt.Errorf("%q is not an IPv6 address", host)
		}
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if a.Zone() != "" {
			return "", fmt.Errorf("%q: an address with a zone cannot be reached from a sandbox", host)
		}
		return a.Unmap().String(), nil
	}
	h := strings.TrimSuffix(strings.ToLower(host), ".")
	if h == "" || len(h) > 253 {
		return "", fmt.Errorf("%q is not a host name", host)
	}
	labels := strings.Split(h, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return "", fmt.Errorf("%q is not a host name", host)
		}
		for _, c := range l {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return "", fmt.Errorf("%q is not a host name", host)
			}
		}
	}
	// A name whose last label is all digits or hex is a number in
	// disguise (inet_aton reads "1.2.3", "0x7f.1", "017700000001").
	last := labels[len(labels)-1]
	if _, err := strconv.ParseUint(last, 0, 64); err == nil || strings.HasPrefix(last, "0x") {
		return "", fmt.Errorf("%q looks like an IP address in a non-standard form; write addresses as 1.2.3.4 or [::1]", host)
	}
	return h, nil
}

// SplitHostPort splits a request's HOST:PORT (a CONNECT target, or a URL's
// host with its scheme's default port) and normalizes the host.
func SplitHostPort(hostport string, defaultPort int) (string, int, error) {
	host, portText, err := net.SplitHostPort(hostport)
	if err != nil {
		if defaultPort == 0 || strings.Count(hostport, ":") > 1 && !strings.HasPrefix(hostport, "[") {
			return "", 0, fmt.Errorf("%q is not HOST:PORT", hostport)
		}
		host, portText = strings.TrimSuffix(strings.TrimPrefix(hostport, "["), "]"), strconv.Itoa(defaultPort)
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("%q: the port must be a number from 1 to 65535", hostport)
	}
	h, err := NormalizeHost(host)
	if err != nil {
		return "", 0, err
	}
	return h, port, nil
}

func (v *validator) network(field string, x any) *NetworkRules {
	m := v.object(field, x, "allow", "deny", "approve", "limits")
	r := &NetworkRules{Limits: DefaultNetLimits}
	if m == nil {
		return r
	}
	r.Allow = v.hostRules(field+".allow", m["allow"])
	r.Deny = v.hostRules(field+".deny", m["deny"])
	r.Approve = v.hostRules(field+".approve", m["approve"])
	if l, ok := m["limits"]; ok {
		lm := v.object(field+".limits", l, "bytes_in", "bytes_out", "connections", "connection_seconds")
		for key, max := range map[string]int64{"bytes_in": maxNetBytes, "bytes_out": maxNetBytes, "connections": 100_000, "connection_seconds": 86_400} {
			x, ok := lm[key]
			if !ok {
				continue
			}
			n, ok := integer(x)
			if !ok || n < 1 || n > max {
				v.fail(joinField(field+".limits", key), "want a whole number from 1 to %d", max)
				continue
			}
			switch key {
			case "bytes_in":
				r.Limits.BytesIn = n
			case "bytes_out":
				r.Limits.BytesOut = n
			case "connections":
				r.Limits.Connections = int(n)
			case "connection_seconds":
				r.Limits.ConnTime = time.Duration(n) * time.Second
			}
		}
	}
	return r
}

func (v *validator) hostRules(field string, x any) []HostRule {
	if x == nil {
		return nil
	}
	list, ok := x.([]any)
	if !ok {
		v.fail(field, "want a list of hosts (HOST or HOST:PORT), got %s", kind(x))
		return nil
	}
	var out []HostRule
	for i, item := range list {
		f := fmt.Sprintf("%s[%d]", field, i)
		s, ok := v.str(f, item)
		if !ok {
			continue
		}
		r, err := ParseHostRule(s)
		if err != nil {
			v.fail(f, "%v", err)
			continue
		}
		out = append(out, r)
	}
	return out
}
