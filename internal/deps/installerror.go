package deps

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/pysandbox/pysandbox/internal/pep"
	"github.com/pysandbox/pysandbox/internal/sandbox"
)

// InstallError is a failed install.
type InstallError struct {
	// Requirement is the one that failed, when the installer said which:
	// one of the request's canonical requirements, or a dependency of one
	// as the installer spelled it.
	Requirement string
	// Lines are the useful lines: the installer's error lines without their
	// "ERROR: " prefix, then notes of ours.
	Lines []string
	// Output is the installer's whole output, capped.
	Output string
	// Unreachable, when set, is why the package index could not be
	// reached (the index and the error): the installer then reports
	// packages it found nowhere, which is not the cause.
	Unreachable string
}

func (e *InstallError) Error() string { return "deps: " + e.Summary() }

// UnreachableAdvice is Advice when no index answered, in an agent's
// terms (pysandbox run says it in its own).
const UnreachableAdvice = "The server cannot reach its package index. Use packages the server's Python already has (importlib.metadata.distributions() in run_python lists them), or ask the server's operator for one it can reach: --index-url, or --find-links with a wheel directory (--no-index to work offline)."

// Advice is the next step for whoever asked for the install, to follow
// Summary in a tool's answer: an unreachable index is the operator's to
// fix, and nothing about the requirement is wrong.
func (e *InstallError) Advice() string {
	if e.Unreachable != "" {
		return UnreachableAdvice
	}
	return "Check the requirement's name and version, or that the package index has it."
}

// Summary is Error without the package's prefix, for a tool's answer: what
// failed and why, and below it the installer's other lines, at most 400
// bytes of them.
func (e *InstallError) Summary() string {
	text, _ := e.summary()
	return text
}

// Cut tells whether Summary left out some of the installer's lines, which
// a caller may then show whole.
func (e *InstallError) Cut() bool {
	_, cut := e.summary()
	return cut
}

// maxSummaryLines bounds the installer's lines in Summary.
const maxSummaryLines = 400

// summary is Summary, and whether it cut the installer's lines.
func (e *InstallError) summary() (text string, cut bool) {
	reason := "the installer failed"
	rest := e.Lines
	// The most specific line leads; pip puts it last.
	for i, l := range e.Lines {
		if strings.Contains(l, "No matching distribution") {
			reason = l
			rest = append(append([]string(nil), e.Lines[:i]...), e.Lines[i+1:]...)
			break
		}
	}
	if reason == "the installer failed" && len(rest) > 0 {
		reason, rest = rest[0], rest[1:]
	}
	if e.Unreachable != "" {
		// What the installer said follows from it: no package was found
		// because no index answered.
		reason, rest = "the package index could not be reached ("+e.Unreachable+")", nil
	}
	var head string
	if e.Requirement != "" {
		head = fmt.Sprintf("cannot install %s: %s", e.Requirement, reason)
	} else {
		head = "install failed: " + reason
	}
	if len(rest) == 0 {
		return head, false
	}
	more := strings.Join(rest, "; ")
	if len(more) > maxSummaryLines {
		more, cut = more[:maxSummaryLines]+"...", true
	}
	return head + "\n" + more, cut
}

var (
	// pip: "Could not find a version that satisfies the requirement X (from
	// versions: none)", "No matching distribution found for X".
	pipReqRE = regexp.MustCompile(`(?:satisfies the requirement|No matching distribution found for) (\S+)`)
	// uv: "Because nosuchpkg was not found in the package registry ...".
	uvReqRE = regexp.MustCompile(`Because (\S+) was not found`)
)

// installError turns the installer's output into an InstallError.
func (c *Cache) installError(out *output, exit sandbox.Exit, canon []string, pyVersion string) *InstallError {
	text, errLines, tail := out.result()
	e := &InstallError{Output: text}
	lines := errLines
	if len(lines) == 0 {
		lines = tail
	}
	e.Lines = append(e.Lines, lines...)
	for _, l := range errLines {
		m := pipReqRE.FindStringSubmatch(l)
		if m == nil {
			m = uvReqRE.FindStringSubmatch(l)
		}
		if m != nil {
			e.Requirement = matchRequirement(m[1], canon)
			break
		}
	}
	switch {
	case exit.OOMKilled:
		e.Lines = append(e.Lines, "the installer ran out of memory")
	case exit.Signal != 0:
		e.Lines = append(e.Lines, fmt.Sprintf("the installer was killed by signal %d", exit.Signal))
	}
	if strings.Contains(text, "No module named pip") {
		e.Lines = append(e.Lines, fmt.Sprintf("note: Python %s has no pip (install python3-pip, or uv under /usr)", pyVersion))
	}
	if notFound(text) {
		e.Unreachable = c.unreachableIndex(text)
	}
	if e.Unreachable == "" && !c.cfg.Index.AllowSdist && strings.Contains(text, "No matching distribution") {
		e.Lines = append(e.Lines, fmt.Sprintf("note: only wheels are accepted (building from source is disabled); a package may exist but have no wheel for Python %s", pyVersion))
	}
	return e
}

// notFound is installer output that says a package was found nowhere,
// or that an index could not be fetched.
func notFound(text string) bool {
	for _, s := range []string{"No matching distribution", "from versions: none", "was not found in the package registry", "Failed to fetch", "error sending request"} {
		if strings.Contains(text, s) {
			return true
		}
	}
	return false
}

// netFailures are what pip (urllib3, requests) and uv (reqwest) write
// when a host cannot be reached, and what each means.
var netFailures = []struct{ pattern, means string }{
	{"Connection refused", "connection refused"},
	{"Temporary failure in name resolution", "name resolution failed"},
	{"Name or service not known", "name resolution failed"},
	{"No address associated with hostname", "name resolution failed"},
	{"failed to lookup address", "name resolution failed"},
	{"dns error", "name resolution failed"},
	{"Network is unreachable", "network unreachable"},
	{"No route to host", "no route to host"},
	{"ConnectTimeoutError", "timed out"},
	{"Read timed out", "timed out"},
	{"operation timed out", "timed out"},
	{"Tunnel connection failed: 502", "the proxy could not connect"},
	{"Tunnel connection failed: 504", "timed out"},
}

// unreachableIndex says why the package index could not be reached, from
// the installer's output (a direct connection, or an HTTPS index through
// the proxy, whose refused CONNECT pip retries and reports) or, since pip
// keeps quiet about a plain HTTP index the proxy answered with an error,
// by connecting to each such index from here, as the proxy does; "" when
// neither shows it.
func (c *Cache) unreachableIndex(text string) string {
	indexes := c.indexURLs()
	for _, f := range netFailures {
		if strings.Contains(text, f.pattern) {
			if len(indexes) == 1 {
				return withoutCredentials(indexes[0]) + ": " + f.means
			}
			return f.means
		}
	}
	for _, u := range indexes {
		if !strings.HasPrefix(u, "http://") {
			continue
		}
		if why := probe(u); why != "" {
			return withoutCredentials(u) + ": " + why
		}
	}
	return ""
}

// indexURLs are the indexes (and find-links pages) the installer reads
// over the network: pip's and uv's default, PyPI, when none is set.
func (c *Cache) indexURLs() []string {
	ix := c.cfg.Index
	var out []string
	if !ix.NoIndex {
		if ix.IndexURL != "" {
			out = append(out, ix.IndexURL)
		} else {
			out = append(out, "https://pypi.org/simple/")
		}
		out = append(out, ix.ExtraIndexURLs...)
	}
	for _, fl := range ix.FindLinks {
		if isHTTPURL(fl) {
			out = append(out, fl)
		}
	}
	return out
}

// probe connects to the host of an index URL, as the proxy would; it
// returns why it could not, or "".
func probe(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Hostname() == "" {
		return ""
	}
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(u.Hostname(), port), 5*time.Second)
	if err == nil {
		conn.Close()
		return ""
	}
	var dnsErr *net.DNSError
	var netErr net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.As(err, &dnsErr):
		return "name resolution failed: " + dnsErr.Err
	case errors.As(err, &netErr) && netErr.Timeout():
		return "timed out"
	case errors.Is(err, syscall.ENETUNREACH):
		return "network unreachable"
	}
	return err.Error()
}

// matchRequirement maps the installer's spelling of a requirement to the
// request's canonical one when they name the same project; a transitive
// dependency stays as the installer wrote it.
func matchRequirement(tok string, canon []string) string {
	tok = strings.Trim(tok, `"'`)
	r, err := pep.ParseRequirement(tok)
	if err != nil {
		return tok
	}
	for _, s := range canon {
		if cr, err := pep.ParseRequirement(s); err == nil && cr.Normalized == r.Normalized {
			return s
		}
	}
	return tok
}

// withoutCredentials is an index URL as an agent may see it: a message
// names the index that could not be reached, and an index URL may carry
// the operator's credentials (https://user:token@host/simple/, or a token
// as the user name), which no run may learn.
func withoutCredentials(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "the configured index"
	}
	u.User = nil
	return u.String()
}
