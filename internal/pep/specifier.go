package pep

import (
	"fmt"
	"strings"
)

// Specifier is one PEP 440 version clause, such as ">=3.9" or "==3.11.*".
type Specifier struct {
	Op      string // one of ~= == != <= >= < > ===
	Version string // as written, including a trailing ".*" for wildcards

	v        Version // parsed Version, except for ===
	wildcard bool    // Version ends in ".*"
}

func (sp Specifier) String() string { return sp.Op + sp.Version }

// SpecifierSet is a comma-separated list of specifiers that must all hold,
// such as a Requires-Python value. The zero value matches every version.
type SpecifierSet struct {
	specs []Specifier
}

// String returns the set in a compact canonical spelling, for example
// ">=3.9,<3.13". It parses back to the same set.
func (ss SpecifierSet) String() string {
	parts := make([]string, len(ss.specs))
	for i, sp := range ss.specs {
		parts[i] = sp.String()
	}
	return strings.Join(parts, ",")
}

// Specifiers returns the clauses of the set, in the order written.
func (ss SpecifierSet) Specifiers() []Specifier {
	return append([]Specifier(nil), ss.specs...)
}

// ParseSpecifierSet parses a PEP 440 version specifier set such as
// ">=3.9, <3.13", "~=3.10" or "==3.11.*", as used by Requires-Python. An
// empty (or all-blank) string is the set that matches every version, as in
// packaging.
func ParseSpecifierSet(s string) (SpecifierSet, error) {
	sc := &scanner{grammar: "pep440", src: s}
	if err := sc.checkText(MaxRequirementLength); err != nil {
		return SpecifierSet{}, err
	}
	sc.skipWS()
	if sc.eof() {
		return SpecifierSet{}, nil
	}
	specs, err := sc.parseSpecifierList()
	if err != nil {
		return SpecifierSet{}, err
	}
	sc.skipWS()
	if !sc.eof() {
		return SpecifierSet{}, sc.unexpectedAfterSpecifier()
	}
	return SpecifierSet{specs: specs}, nil
}

// operators lists the comparison operators longest first, so that "==="
// is not read as "==" followed by "=".
var operators = []string{"===", "~=", "==", "!=", "<=", ">=", "<", ">"}

// parseOperator consumes a comparison operator if one is next.
func (s *scanner) parseOperator() (string, bool) {
	rest := s.src[s.pos:]
	for _, op := range operators {
		if strings.HasPrefix(rest, op) {
			s.pos += len(op)
			return op, true
		}
	}
	return "", false
}

// atOperatorStart reports whether the next byte could begin an operator;
// used to give a better message when the operator itself is malformed.
func (s *scanner) atOperatorStart() bool {
	switch s.peek() {
	case '=', '<', '>', '!', '~':
		return true
	}
	return false
}

// parseSpecifierList parses version_many from PEP 508:
//
//	version_many = version_one (wsp* ',' version_one)*
//
// It expects to be positioned at an operator (after any whitespace).
func (s *scanner) parseSpecifierList() ([]Specifier, error) {
	var specs []Specifier
	for {
		sp, err := s.parseSpecifier()
		if err != nil {
			return nil, err
		}
		specs = append(specs, sp)
		save := s.pos
		s.skipWS()
		if s.peek() != ',' {
			s.pos = save
			return specs, nil
		}
		s.pos++
		s.skipWS()
		if !s.atOperatorStart() {
			return nil, s.errorf(s.pos, "expected a version specifier after \",\"")
		}
	}
}

// parseSpecifier parses version_one: an operator, optional whitespace and a
// version.
func (s *scanner) parseSpecifier() (Specifier, error) {
	s.skipWS()
	opPos := s.pos
	op, ok := s.parseOperator()
	if !ok {
		switch rest := s.src[s.pos:]; {
		case strings.HasPrefix(rest, "=>"):
			return Specifier{}, s.errorf(opPos, "\"=>\" is not a version operator, use \">=\"")
		case strings.HasPrefix(rest, "=<"):
			return Specifier{}, s.errorf(opPos, "\"=<\" is not a version operator, use \"<=\"")
		case strings.HasPrefix(rest, "="):
			return Specifier{}, s.errorf(opPos, "\"=\" is not a version operator, use \"==\"")
		}
		if s.atOperatorStart() {
			return Specifier{}, s.errorf(opPos, "invalid version operator, expected one of ~= == != <= >= < > ===")
		}
		return Specifier{}, s.errorf(opPos, "expected a version operator (one of ~= == != <= >= < > ===), found %s", s.describe(opPos))
	}
	if s.peek() == '=' || s.peek() == '<' || s.peek() == '>' {
		// Catches "=>", "<<", "====" and friends at the operator rather
		// than as a confusing "invalid version".
		return Specifier{}, s.errorf(opPos, "invalid version operator %q", op+string(s.peek()))
	}
	s.skipWS()
	vPos := s.pos
	text := s.span(isVersionChar)
	if text == "" {
		return Specifier{}, s.errorf(vPos, "expected a version after %q", op)
	}
	sp, msg := newSpecifier(op, text)
	if msg != "" {
		return Specifier{}, s.errorf(vPos, "%s", msg)
	}
	return sp, nil
}

// unexpectedAfterSpecifier reports whatever follows a specifier list when
// nothing more was expected. A missing comma is the usual mistake.
func (s *scanner) unexpectedAfterSpecifier() error {
	if s.atOperatorStart() {
		return s.errorf(s.pos, "missing \",\" between version specifiers")
	}
	return s.errorf(s.pos, "unexpected %s after version specifier", s.describe(s.pos))
}

// isVersionChar matches the characters PEP 508 allows in a version:
// letterOrDigit | '-' | '_' | '.' | '*' | '+' | '!'.
func isVersionChar(c byte) bool {
	return isAlnum(c) || strings.IndexByte("-_.*+!", c) >= 0
}

// newSpecifier validates version against the rules for op, following
// packaging's Specifier regular expression: wildcards and local labels only
// with == and !=, at least two release segments with ~=, anything at all
// (within the PEP 508 version characters) with ===. It returns an error
// message rather than an error so that callers can place it.
func newSpecifier(op, version string) (Specifier, string) {
	sp := Specifier{Op: op, Version: version}
	if op == "===" {
		// Arbitrary equality is a string comparison; there is nothing to
		// parse.
		return sp, ""
	}
	text := version
	if base, ok := strings.CutSuffix(version, ".*"); ok {
		sp.wildcard = true
		text = base
	}
	v, ok := parseVersion(text)
	if !ok {
		return sp, fmt.Sprintf("invalid version %q", version)
	}
	sp.v = v
	if sp.wildcard {
		if op != "==" && op != "!=" {
			return sp, fmt.Sprintf("\".*\" suffix can only be used with \"==\" or \"!=\", not %q", op)
		}
		if v.preL != "" || v.hasPost || v.hasDev || len(v.local) > 0 {
			return sp, fmt.Sprintf("invalid version %q: \".*\" can only follow a release segment like \"1.2.*\"", version)
		}
	}
	if len(v.local) > 0 && op != "==" && op != "!=" {
		return sp, fmt.Sprintf("local version label in %q can only be used with \"==\" or \"!=\", not %q", version, op)
	}
	if op == "~=" && len(v.release) < 2 {
		return sp, fmt.Sprintf("\"~=\" needs at least two release segments, as in \"~=%s.0\"", version)
	}
	return sp, ""
}

// Contains reports whether version satisfies every specifier in the set.
// An unparseable version satisfies nothing, except exact string matches
// with ===.
//
// Pre-releases are accepted like any other version (packaging's
// prereleases=True): the question this answers is whether an interpreter
// that is already installed fits, and PEP 440 lets installed pre-releases
// through. The per-operator rules still apply, so "<3.13" does not admit
// "3.13.0rc1".
func (ss SpecifierSet) Contains(version string) bool {
	raw := strings.Trim(version, " \t")
	v, ok := parseVersion(raw)
	for _, sp := range ss.specs {
		if sp.Op == "===" {
			// PEP 440 defines === as plain string equality; packaging
			// compares the normalised version instead. Either match
			// counts, so neither reading is surprised.
			if !strings.EqualFold(raw, sp.Version) && !(ok && strings.EqualFold(v.String(), sp.Version)) {
				return false
			}
			continue
		}
		if !ok || !sp.contains(v) {
			return false
		}
	}
	return ok || len(ss.specs) > 0
}

// contains applies one specifier to a parsed version, following the PEP 440
// definitions (as implemented by packaging's Specifier).
func (sp Specifier) contains(v Version) bool {
	switch sp.Op {
	case "==":
		return sp.equal(v)
	case "!=":
		return !sp.equal(v)
	case "~=":
		// ~=X.Y.Z means >=X.Y.Z together with ==X.Y.*.
		prefix := sp.v.release[:len(sp.v.release)-1]
		return v.public().Compare(sp.v) >= 0 && prefixMatch(v, sp.v.epoch, prefix)
	case "<=":
		return v.public().Compare(sp.v) <= 0
	case ">=":
		return v.public().Compare(sp.v) >= 0
	case "<":
		if v.Compare(sp.v) >= 0 {
			return false
		}
		// "<3.13" must not admit 3.13.0rc1, unless the bound is itself a
		// pre-release.
		if !sp.v.IsPrerelease() && v.IsPrerelease() && v.base().Compare(sp.v.base()) == 0 {
			return false
		}
		return true
	case ">":
		if v.Compare(sp.v) <= 0 {
			return false
		}
		// ">3.1" must not admit 3.1.post1 or 3.1+local, which are
		// technically greater but are still "3.1".
		if !sp.v.isPostrelease() && v.isPostrelease() && v.base().Compare(sp.v.base()) == 0 {
			return false
		}
		if len(v.local) > 0 && v.base().Compare(sp.v.base()) == 0 {
			return false
		}
		return true
	}
	return false
}

func (sp Specifier) equal(v Version) bool {
	if sp.wildcard {
		return prefixMatch(v, sp.v.epoch, sp.v.release)
	}
	if len(sp.v.local) == 0 {
		// Without a local label in the specifier, "==1.0" matches
		// "1.0+anything".
		v = v.public()
	}
	return v.Compare(sp.v) == 0
}

// prefixMatch reports whether v's release segment, padded with zeros,
// starts with prefix (and the epochs agree). Pre, post, dev and local parts
// of v are ignored, so "==3.11.*" matches 3.11.0rc1 and 3.11.4+local.
func prefixMatch(v Version, epoch string, prefix []string) bool {
	if cmpNum(orZero(v.epoch), orZero(epoch)) != 0 {
		return false
	}
	for i, seg := range prefix {
		if cmpNum(segment(v.release, i), seg) != 0 {
			return false
		}
	}
	return true
}
