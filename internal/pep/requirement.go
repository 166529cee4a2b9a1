package pep

import (
	"fmt"
	"slices"
	"strings"
)

// Requirement is a parsed PEP 508 dependency specifier, such as
// `requests[security]>=2.8.1,==2.8.*; python_version < "2.7"` or
// `pip @ https://github.com/pypa/pip/archive/1.3.1.zip`.
type Requirement struct {
	Name       string   // as written
	Normalized string   // PEP 503 normalised name: lowercase, runs of [-_.] become "-"
	Extras     []string // as written, in order; nil when there are none
	Specifier  string   // compact canonical form, e.g. ">=1.0,<2"; "" when none
	URL        string   // for the "name @ URL" form; "" otherwise
	Marker     string   // the text after ';', trimmed; "" when none

	// marker is the canonical spelling of Marker, used by String and to
	// compare requirements.
	marker string
}

// String returns the requirement in a canonical spelling that parses back
// to the same requirement: no stray whitespace, markers with double quotes
// and single spaces.
func (r Requirement) String() string {
	var b strings.Builder
	b.WriteString(r.Name)
	if len(r.Extras) > 0 {
		b.WriteByte('[')
		b.WriteString(strings.Join(r.Extras, ","))
		b.WriteByte(']')
	}
	if r.URL != "" {
		b.WriteString(" @ ")
		b.WriteString(r.URL)
		if r.marker != "" {
			// After a URL the space is required: ';' is a legal URL
			// character.
			b.WriteByte(' ')
		}
	} else {
		b.WriteString(r.Specifier)
	}
	if r.marker != "" {
		b.WriteString("; ")
		b.WriteString(r.marker)
	}
	return b.String()
}

// key identifies a requirement for de-duplication: two requirements with the
// same key mean exactly the same thing, however they were spelled.
func (r Requirement) key() string {
	extras := make([]string, len(r.Extras))
	for i, e := range r.Extras {
		extras[i] = NormalizeName(e)
	}
	slices.Sort(extras)
	extras = slices.Compact(extras)
	specs := strings.Split(strings.ToLower(r.Specifier), ",")
	slices.Sort(specs)
	// NUL cannot occur in a valid requirement, so it separates fields
	// unambiguously.
	return strings.Join([]string{r.Normalized, strings.Join(extras, ","), strings.Join(specs, ","), r.URL, r.marker}, "\x00")
}

// NormalizeName returns the PEP 503 normalised form of a project name:
// lowercased, with every run of '-', '_' and '.' replaced by a single '-'.
// It does not check that name is valid.
func NormalizeName(name string) string {
	var b strings.Builder
	b.Grow(len(name))
	sep := false
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c == '-' || c == '_' || c == '.' {
			sep = true
			continue
		}
		if sep {
			b.WriteByte('-')
			sep = false
		}
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		b.WriteByte(c)
	}
	if sep {
		b.WriteByte('-')
	}
	return b.String()
}

// MergeRequirements merges requirement lists in order, keeping the first of
// any requirements that mean exactly the same thing (same normalised name,
// extras, specifiers, URL and marker) and dropping the rest. Kept entries
// are returned as written, minus surrounding whitespace. Invalid entries are
// left out and reported, one error each, in input order.
//
// Requirements on the same project that differ ("numpy" and "numpy<2") are
// all kept: reconciling them is the installer's job.
func MergeRequirements(lists ...[]string) ([]string, []error) {
	var (
		out  []string
		errs []error
		seen = make(map[string]bool)
	)
	for _, list := range lists {
		for _, s := range list {
			r, err := ParseRequirement(s)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			k := r.key()
			if seen[k] {
				continue
			}
			seen[k] = true
			out = append(out, strings.Trim(s, " \t"))
		}
	}
	return out, errs
}

// ParseRequirement parses and validates a PEP 508 dependency specifier:
//
//	name_req = name wsp* extras? wsp* versionspec? wsp* quoted_marker?
//	url_req  = name wsp* extras? wsp* urlspec wsp+ quoted_marker?
//
// Versions must be valid PEP 440 versions for their operator, URLs must
// have a scheme, and markers may only use the PEP 508 variables.
func ParseRequirement(s string) (Requirement, error) {
	p := &scanner{grammar: "pep508", src: s}
	if err := p.checkText(MaxRequirementLength); err != nil {
		return Requirement{}, err
	}
	r, err := p.parseRequirement()
	if err != nil {
		return Requirement{}, err
	}
	return r, nil
}

func (p *scanner) parseRequirement() (Requirement, error) {
	var r Requirement
	p.skipWS()
	if p.eof() {
		return r, p.errorf(-1, "empty requirement")
	}

	namePos := p.pos
	name := p.span(isNameChar)
	if name == "" {
		return r, p.errorf(namePos, "expected a package name, found %s", p.describe(namePos))
	}
	if !validName(name) {
		return r, p.errorf(namePos, "invalid package name %q: names must start and end with a letter or digit", name)
	}
	r.Name, r.Normalized = name, NormalizeName(name)

	p.skipWS()
	after := "package name"
	if p.peek() == '[' {
		extras, err := p.parseExtras()
		if err != nil {
			return r, err
		}
		if len(extras) > 0 {
			r.Extras = extras
		}
		after = "extras"
		p.skipWS()
	}

	switch c := p.peek(); {
	case c == '@':
		p.pos++
		if err := p.parseURL(&r); err != nil {
			return r, err
		}
	case c == '(' || p.atOperatorStart():
		specs, err := p.parseVersionSpec()
		if err != nil {
			return r, err
		}
		parts := make([]string, len(specs))
		for i, sp := range specs {
			parts[i] = sp.String()
		}
		r.Specifier = strings.Join(parts, ",")
		p.skipWS()
		if !p.eof() && p.peek() != ';' {
			return r, p.unexpectedAfterSpecifier()
		}
	case c == ';' || c == 0:
	default:
		return r, p.errorf(p.pos, "unexpected %s after %s; expected a version specifier, \"@ URL\", \";\" or end", p.describe(p.pos), after)
	}

	if p.peek() == ';' {
		p.pos++
		if err := p.parseQuotedMarker(&r); err != nil {
			return r, err
		}
	}
	return r, nil
}

// isNameChar matches the characters of a PEP 508 identifier.
func isNameChar(c byte) bool {
	return isAlnum(c) || c == '-' || c == '_' || c == '.'
}

// validName checks a run of name characters against
// ^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$ (case-insensitively).
func validName(s string) bool {
	return s != "" && isAlnum(s[0]) && isAlnum(s[len(s)-1])
}

// parseExtras parses '[' wsp* extras_list? wsp* ']'.
func (p *scanner) parseExtras() ([]string, error) {
	open := p.pos
	p.pos++ // '['
	extras := []string{}
	p.skipWS()
	if p.peek() == ']' {
		p.pos++
		return extras, nil
	}
	for {
		p.skipWS()
		pos := p.pos
		e := p.span(isNameChar)
		switch {
		case e == "" && p.eof():
			return nil, p.errorf(open, "unclosed \"[\"")
		case e == "":
			return nil, p.errorf(pos, "expected an extra name, found %s", p.describe(pos))
		case !validName(e):
			return nil, p.errorf(pos, "invalid extra name %q: names must start and end with a letter or digit", e)
		}
		extras = append(extras, e)
		p.skipWS()
		switch p.peek() {
		case ',':
			p.pos++
		case ']':
			p.pos++
			return extras, nil
		case 0:
			return nil, p.errorf(open, "unclosed \"[\"")
		default:
			return nil, p.errorf(p.pos, "expected \",\" or \"]\" in extras, found %s", p.describe(p.pos))
		}
	}
}

// parseVersionSpec parses versionspec, a specifier list that may be wrapped
// in parentheses.
func (p *scanner) parseVersionSpec() ([]Specifier, error) {
	if p.peek() != '(' {
		return p.parseSpecifierList()
	}
	open := p.pos
	p.pos++
	p.skipWS()
	if p.peek() == ')' {
		return nil, p.errorf(p.pos, "expected a version specifier inside parentheses")
	}
	specs, err := p.parseSpecifierList()
	if err != nil {
		return nil, err
	}
	p.skipWS()
	switch {
	case p.peek() == ')':
		p.pos++
		return specs, nil
	case p.eof():
		return nil, p.errorf(open, "unclosed \"(\"")
	default:
		return nil, p.unexpectedAfterSpecifier()
	}
}

// parseURL parses the rest of urlspec ('@' has been consumed) and what may
// follow it. PEP 508 lets a URL contain ';', so a marker after a URL must be
// separated from it by whitespace.
func (p *scanner) parseURL(r *Requirement) error {
	p.skipWS()
	pos := p.pos
	u := p.span(func(c byte) bool { return !isWS(c) })
	if u == "" {
		return p.errorf(pos, "expected a URL after \"@\"")
	}
	if msg := checkURL(u); msg != "" {
		if strings.Contains(u, ";") {
			msg += " (to add a marker after a URL, put a space before the \";\")"
		}
		return p.errorf(pos, "invalid URL %q: %s", u, msg)
	}
	r.URL = u
	p.skipWS()
	if !p.eof() && p.peek() != ';' {
		return p.errorf(p.pos, "unexpected %s after URL; expected \";\" or end", p.describe(p.pos))
	}
	return nil
}

// checkURL returns what is wrong with a URL, or "". It asks for what pip
// needs to fetch something: a scheme, and a host unless the scheme is file.
// Characters are limited to those RFC 3986 allows, which also keeps quotes
// and angle brackets from a glued-on marker out of the URL.
func checkURL(u string) string {
	colon := strings.IndexByte(u, ':')
	if colon <= 0 || !isSchemeStart(u[0]) || strings.IndexFunc(u[:colon], func(r rune) bool {
		return r > 0x7f || !isAlnum(byte(r)) && r != '+' && r != '-' && r != '.'
	}) >= 0 {
		return "a URL must start with a scheme, such as \"https://\""
	}
	for i := 0; i < len(u); i++ {
		c := u[i]
		switch {
		case c >= 0x80:
			return "non-ASCII characters must be percent-encoded"
		case c == '%':
			if i+2 >= len(u) || !isHex(u[i+1]) || !isHex(u[i+2]) {
				return fmt.Sprintf("bad percent-encoding at %q", u[i:min(i+3, len(u))])
			}
		case !isURLChar(c):
			return fmt.Sprintf("character %q not allowed in a URL", c)
		}
	}
	scheme, rest := strings.ToLower(u[:colon]), u[colon+1:]
	if scheme == "file" {
		if rest == "" {
			return "missing path"
		}
		return ""
	}
	host, ok := strings.CutPrefix(rest, "//")
	if end := strings.IndexAny(host, "/?#"); end >= 0 {
		host = host[:end]
	}
	if !ok || host == "" {
		return "missing host"
	}
	return ""
}

func isSchemeStart(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }

func isHex(c byte) bool {
	return isDigit(c) || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// isURLChar matches RFC 3986 unreserved, gen-delims and sub-delims ('%' is
// handled by the caller).
func isURLChar(c byte) bool {
	return isAlnum(c) || strings.IndexByte("-._~:/?#[]@!$&'()*+,;=", c) >= 0
}
