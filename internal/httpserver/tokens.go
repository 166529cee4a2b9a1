package httpserver

import (
	"bufio"
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

	"github.com/modelcontextprotocol/go-sdk/auth"
)

// Tokens are the bearer tokens a server accepts, each with a name that
// becomes the caller's identity: in the audit log, and for rate limits
// with scope "grant".
type Tokens struct {
	entries []tokenEntry
	// Warning is set when the file is readable by every user; the server
	// logs it.
	Warning string
}

type tokenEntry struct {
	name string
	sum  [32]byte // SHA-256 of the token: compared in constant time
}

// MinTokenLength is the shortest token accepted: shorter ones could be
// guessed.
const MinTokenLength = 16

var tokenName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$`)

// LoadTokens reads a token file: one token per line, as "NAME TOKEN" or
// "NAME:TOKEN"; blank lines and lines starting with # are ignored. A file
// others could write to is refused.
func LoadTokens(path string) (*Tokens, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("auth token file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("auth token file: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("auth token file %s: not a regular file", path)
	}
	if st.Mode().Perm()&0o022 != 0 {
		return nil, fmt.Errorf("auth token file %s: writable by other users (mode %#o), so anyone could add a token; chmod 600 it", path, st.Mode().Perm())
	}
	data, err := io.ReadAll(io.LimitReader(f, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("auth token file: %w", err)
	}
	t, err := ParseTokens(data, path)
	if err != nil {
		return nil, err
	}
	if st.Mode().Perm()&0o004 != 0 {
		t.Warning = fmt.Sprintf("auth token file %s is readable by every user on this machine (mode %#o); chmod 600 it", path, st.Mode().Perm())
	}
	return t, nil
}

// ParseTokens parses a token file's content; name labels errors.
func ParseTokens(data []byte, name string) (*Tokens, error) {
	t := &Tokens{}
	names := map[string]bool{}
	sums := map[[32]byte]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
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
		t.entries = append(t.entries, tokenEntry{name: id, sum: sum})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("auth token file %s: %w", name, err)
	}
	if len(t.entries) == 0 {
		return nil, fmt.Errorf("auth token file %s: no tokens", name)
	}
	return t, nil
}

func printable(s string) bool {
	for _, r := range s {
		if r < 0x21 || r > 0x7e {
			return false
		}
	}
	return true
}

// Names lists the token names, for the startup log.
func (t *Tokens) Names() []string {
	var out []string
	for _, e := range t.entries {
		out = append(out, e.name)
	}
	return out
}

// Verify is an auth.TokenVerifier: the token's name is the identity.
func (t *Tokens) Verify(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
	sum := sha256.Sum256([]byte(token))
	found := ""
	// Compare against every entry, so the time taken does not say which
	// (or whether any) matched.
	for _, e := range t.entries {
		if subtle.ConstantTimeCompare(sum[:], e.sum[:]) == 1 {
			found = e.name
		}
	}
	if found == "" {
		return nil, auth.ErrInvalidToken
	}
	return &auth.TokenInfo{UserID: found}, nil
}

// Overlaps reports whether a token is in both t and o.
func (t *Tokens) Overlaps(o *Tokens) bool {
	for _, a := range t.entries {
		for _, b := range o.entries {
			if a.sum == b.sum {
				return true
			}
		}
	}
	return false
}
