package httpserver

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/auth"
)

// Tokens are the bearer tokens of one role (agents, operators or metrics
// scrapers), each with a name that becomes the caller's identity: in the
// audit log, and for rate limits with scope "grant". Tokens of a Keyring
// follow its reloads: every call reads the tokens in force.
type Tokens struct {
	// Warning is set when the file is readable by every user; the server
	// logs it.
	Warning string
	set     *atomic.Pointer[tokenSet]
	role    int
}

// tokenList is one token file's content.
type tokenList struct {
	entries []tokenEntry
}

type tokenEntry struct {
	name string
	sum  [32]byte // SHA-256 of the token: compared in constant time
}

// The roles of a Keyring, in its tokenSet.
const (
	roleAgents = iota
	roleOperators
	roleMetrics
	roles
)

// tokenSet is every role's tokens at one moment: a reload replaces it
// whole, so no request ever sees one file's new tokens beside another's
// old ones (a token moved from one role to another is never in both).
type tokenSet [roles]*tokenList

var (
	roleFlag = [roles]string{"--auth-token-file", "--operator-token-file", "--metrics-token-file"}
	roleWho  = [roles]string{"an agent's", "an operator's", "a metrics scraper's"}
	roleKey  = [roles]string{"agents", "operators", "metrics"}
)

// MinTokenLength is the shortest token accepted: shorter ones could be
// guessed.
const MinTokenLength = 16

// MaxTokenFileBytes bounds a token file. A larger one is refused whole:
// cutting it would cut a token, whose first part would then be accepted
// as a token, and drop those after it.
const MaxTokenFileBytes = 1 << 20

var tokenName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$`)

// LoadTokens reads a token file: one token per line, as "NAME TOKEN" or
// "NAME:TOKEN"; blank lines and lines starting with # are ignored. A file
// others could write to, one over MaxTokenFileBytes, or one with a line
// that is not a token is refused whole.
func LoadTokens(path string) (*Tokens, error) {
	l, warning, err := readTokenFile(path)
	if err != nil {
		return nil, err
	}
	t := fixed(l)
	t.Warning = warning
	return t, nil
}

// fixed is a Tokens of one list that nothing reloads.
func fixed(l *tokenList) *Tokens {
	t := &Tokens{set: &atomic.Pointer[tokenSet]{}}
	t.set.Store(&tokenSet{roleAgents: l})
	return t
}

func readTokenFile(path string) (*tokenList, string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, "", fmt.Errorf("auth token file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, "", fmt.Errorf("auth token file: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, "", fmt.Errorf("auth token file %s: not a regular file", path)
	}
	if st.Mode().Perm()&0o022 != 0 {
		return nil, "", fmt.Errorf("auth token file %s: writable by other users (mode %#o), so anyone could add a token; chmod 600 it", path, st.Mode().Perm())
	}
	// One byte more than the bound tells a file at the bound from a
	// larger one, whatever its size on disk said when it was opened.
	data, err := io.ReadAll(io.LimitReader(f, MaxTokenFileBytes+1))
	if err != nil {
		return nil, "", fmt.Errorf("auth token file %s: %w", path, err)
	}
	if len(data) > MaxTokenFileBytes {
		line := bytes.Count(data[:MaxTokenFileBytes], []byte("\n")) + 1
		return nil, "", fmt.Errorf("auth token file %s:%d: the file is larger than 1 MiB, and this line crosses that bound; nothing in the file was loaded", path, line)
	}
	l, err := parseTokens(data, path)
	if err != nil {
		return nil, "", err
	}
	warning := ""
	if st.Mode().Perm()&0o004 != 0 {
		warning = fmt.Sprintf("auth token file %s is readable by every user on this machine (mode %#o); chmod 600 it", path, st.Mode().Perm())
	}
	return l, warning, nil
}

// ParseTokens parses a token file's content; name labels errors.
func ParseTokens(data []byte, name string) (*Tokens, error) {
	l, err := parseTokens(data, name)
	if err != nil {
		return nil, err
	}
	return fixed(l), nil
}

func parseTokens(data []byte, name string) (*tokenList, error) {
	l := &tokenList{}
	names := map[string]bool{}
	sums := map[[32]byte]bool{}
	// Split by hand rather than with a bufio.Scanner, whose error on a
	// line over 64 KiB names no line.
	for n, raw := range bytes.Split(data, []byte("\n")) {
		n++
		line := strings.TrimSpace(string(raw))
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		id, tok, ok := strings.Cut(line, ":")
		if !ok || strings.ContainsAny(id, " \t") {
			fields := strings.Fields(line)
			if len(fields) != 2 {
				return nil, fmt.Errorf("auth token file %s:%d: want NAME TOKEN (or NAME:TOKEN)", name, n)
			}
			id, tok = fields[0], fields[1]
		}
		id, tok = strings.TrimSpace(id), strings.TrimSpace(tok)
		switch {
		case !tokenName.MatchString(id):
			return nil, fmt.Errorf("auth token file %s:%d: name %q: use 1 to 64 letters, digits, '.', '_', '@' or '-'", name, n, id)
		case id == "stdio":
			// A stdio client's identity: a token of that name would own
			// its sessions, paused ones in a shared state directory among
			// them.
			return nil, fmt.Errorf("auth token file %s:%d: the name %q is reserved (it is the identity of a stdio client); choose another", name, n, id)
		case len(tok) < MinTokenLength || strings.ContainsAny(tok, " \t") || !printable(tok):
			return nil, fmt.Errorf("auth token file %s:%d: the token for %q must be at least %d printable characters without spaces (try: openssl rand -hex 32)", name, n, id, MinTokenLength)
		case names[id]:
			return nil, fmt.Errorf("auth token file %s:%d: name %q appears twice", name, n, id)
		}
		sum := sha256.Sum256([]byte(tok))
		if sums[sum] {
			return nil, fmt.Errorf("auth token file %s:%d: the token for %q is also another name's token", name, n, id)
		}
		names[id], sums[sum] = true, true
		l.entries = append(l.entries, tokenEntry{name: id, sum: sum})
	}
	if len(l.entries) == 0 {
		return nil, fmt.Errorf("auth token file %s: no tokens", name)
	}
	return l, nil
}

func printable(s string) bool {
	for _, r := range s {
		if r < 0x21 || r > 0x7e {
			return false
		}
	}
	return true
}

func (t *Tokens) list() *tokenList { return t.set.Load()[t.role] }

// Names lists the token names, for the log.
func (t *Tokens) Names() []string {
	var out []string
	for _, e := range t.list().entries {
		out = append(out, e.name)
	}
	return out
}

// Credential names one token without holding it: its name and its
// digest. A console sign-in keeps one to check, on every request, that
// the token it was made with is still in force.
type Credential struct {
	Name string
	sum  [32]byte
}

// Find returns the credential of token, if it is one of t's.
func (t *Tokens) Find(token string) (Credential, bool) {
	sum := sha256.Sum256([]byte(token))
	found := -1
	entries := t.list().entries
	// Compare against every entry, so the time taken does not say which
	// (or whether any) matched.
	for i, e := range entries {
		if subtle.ConstantTimeCompare(sum[:], e.sum[:]) == 1 {
			found = i
		}
	}
	if found < 0 {
		return Credential{}, false
	}
	return Credential{Name: entries[found].name, sum: sum}, true
}

// Holds reports whether c's token is still one of t's under the same
// name: false once it was removed from the file (or renamed, or moved to
// another role) and the file reloaded.
func (t *Tokens) Holds(c Credential) bool {
	for _, e := range t.list().entries {
		if e.sum == c.sum && e.name == c.Name {
			return true
		}
	}
	return false
}

// Verify is an auth.TokenVerifier: the token's name is the identity.
func (t *Tokens) Verify(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
	c, ok := t.Find(token)
	if !ok {
		return nil, auth.ErrInvalidToken
	}
	return &auth.TokenInfo{UserID: c.Name}, nil
}

// TokenFiles are a server's token files, "" for one not given.
type TokenFiles struct {
	// Agents' tokens (--auth-token-file) run code at /mcp.
	Agents string
	// Operators' tokens (--operator-token-file) open the console.
	Operators string
	// Metrics scrapers' tokens (--metrics-token-file) open /metrics and
	// nothing else.
	Metrics string
}

// Keyring holds the tokens of a server's token files, each role apart,
// and reads them all again on Reload (the server does on SIGHUP). A token
// belongs to one role only, so an agent's token never opens the console,
// and an operator's or a scraper's never runs code.
type Keyring struct {
	// Agents, Operators and Metrics are each role's tokens in force; nil
	// for a file not given.
	Agents, Operators, Metrics *Tokens
	files                      [roles]string
	set                        atomic.Pointer[tokenSet]
	mu                         sync.Mutex // one reload at a time
}

// OpenKeyring reads the token files, returning what the server should
// warn about (files every user can read). Any error refuses them all: a
// bad file, or a token in two of them.
func OpenKeyring(files TokenFiles) (*Keyring, []string, error) {
	k := &Keyring{files: [roles]string{files.Agents, files.Operators, files.Metrics}}
	set, warnings, err := k.read()
	if err != nil {
		return nil, nil, err
	}
	k.set.Store(set)
	for role, dst := range [roles]**Tokens{&k.Agents, &k.Operators, &k.Metrics} {
		if k.files[role] != "" {
			*dst = &Tokens{set: &k.set, role: role}
		}
	}
	return k, warnings, nil
}

// Reload reads every token file again and puts the new tokens in force
// at once, for every role together: a removed token stops opening
// anything from the next request on. A reload that fails changes
// nothing.
func (k *Keyring) Reload() ([]string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	set, warnings, err := k.read()
	if err != nil {
		return nil, err
	}
	k.set.Store(set)
	return warnings, nil
}

// Names lists each role's token names ("agents": "alice,bob"), for the
// log and the audit log; roles without a file are left out.
func (k *Keyring) Names() map[string]string {
	set := k.set.Load()
	out := map[string]string{}
	for role, l := range set {
		if l == nil {
			continue
		}
		var names []string
		for _, e := range l.entries {
			names = append(names, e.name)
		}
		out[roleKey[role]] = strings.Join(names, ",")
	}
	return out
}

func (k *Keyring) read() (*tokenSet, []string, error) {
	var set tokenSet
	var warnings []string
	for role, path := range k.files {
		if path == "" {
			continue
		}
		l, warning, err := readTokenFile(path)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", roleFlag[role], err)
		}
		if warning != "" {
			warnings = append(warnings, warning)
		}
		set[role] = l
	}
	for a := range roles {
		for b := a + 1; b < roles; b++ {
			if set[a] == nil || set[b] == nil {
				continue
			}
			if na, nb, ok := overlap(set[a], set[b]); ok {
				return nil, nil, fmt.Errorf("a token is both %s (%q in %s) and %s (%q in %s); give each role tokens of its own",
					roleWho[a], na, k.files[a], roleWho[b], nb, k.files[b])
			}
		}
	}
	return &set, warnings, nil
}

// overlap finds a token in both lists, by the names it has in each.
func overlap(a, b *tokenList) (string, string, bool) {
	for _, x := range a.entries {
		for _, y := range b.entries {
			if x.sum == y.sum {
				return x.name, y.name, true
			}
		}
	}
	return "", "", false
}
