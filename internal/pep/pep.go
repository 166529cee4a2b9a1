// Package pep parses the Python packaging formats an agent can put in front
// of the sandbox: PEP 723 inline script metadata, PEP 508 dependency
// specifiers and PEP 440 versions and version specifiers (Requires-Python).
//
// Every input here comes from an untrusted agent. The parsers therefore never
// panic, bound the size of what they accept, reject control characters
// outright (they have no business in a requirement and can hide text in
// logs), and report errors that say what is wrong and where, so that an
// agent can fix its own input.
//
// The parsers follow the reference grammars closely but are stricter than
// pip/packaging where packaging is lenient only by accident (for example a
// trailing comma in a specifier list, or a marker that compares two quoted
// strings and can only fail later, at install time).
package pep

import (
	"fmt"
	"strconv"
	"unicode"
	"unicode/utf8"
)

// MaxRequirementLength bounds a single dependency specifier or version
// specifier set, in bytes. Real requirements are far shorter; the bound keeps
// hostile input from costing anything.
const MaxRequirementLength = 1000

// SyntaxError describes a malformed requirement, version or specifier.
type SyntaxError struct {
	// Grammar names the format that was being parsed: "pep508" for a
	// dependency specifier, "pep440" for a version or version specifier set.
	Grammar string
	// Input is the text that was parsed.
	Input string
	// Column is the 1-based position of the problem in Input, counted in
	// characters, or 0 when the problem is not at one place.
	Column int
	// Msg says what is wrong.
	Msg string
}

func (e *SyntaxError) Error() string {
	if e.Column > 0 {
		return fmt.Sprintf("%s: %s: %s at column %d", e.Grammar, quoteInput(e.Input), e.Msg, e.Column)
	}
	return fmt.Sprintf("%s: %s: %s", e.Grammar, quoteInput(e.Input), e.Msg)
}

// maxQuotedInput bounds how much of the input an error message repeats, so
// that errors stay readable and cheap even for inputs at the size limit.
const maxQuotedInput = 120

func quoteInput(s string) string {
	if len(s) <= maxQuotedInput {
		return strconv.Quote(s)
	}
	cut := maxQuotedInput
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strconv.Quote(s[:cut]) + "..."
}

// scanner is the cursor shared by the hand-written parsers in this package.
// Positions are byte offsets; errors convert them to character columns.
type scanner struct {
	grammar string
	src     string
	pos     int
}

func (s *scanner) errorf(pos int, format string, args ...any) error {
	col := 0
	if pos >= 0 {
		if pos > len(s.src) {
			pos = len(s.src)
		}
		col = utf8.RuneCountInString(s.src[:pos]) + 1
	}
	return &SyntaxError{Grammar: s.grammar, Input: s.src, Column: col, Msg: fmt.Sprintf(format, args...)}
}

func (s *scanner) eof() bool { return s.pos >= len(s.src) }

// peek returns the next byte, or 0 at the end of the input. Inputs never
// contain NUL (checkText rejects it), so 0 is unambiguous.
func (s *scanner) peek() byte {
	if s.pos < len(s.src) {
		return s.src[s.pos]
	}
	return 0
}

// skipWS skips PEP 508 whitespace, which is only space and tab.
func (s *scanner) skipWS() {
	for s.pos < len(s.src) && isWS(s.src[s.pos]) {
		s.pos++
	}
}

// span consumes a run of bytes accepted by ok and returns it.
func (s *scanner) span(ok func(byte) bool) string {
	start := s.pos
	for s.pos < len(s.src) && ok(s.src[s.pos]) {
		s.pos++
	}
	return s.src[start:s.pos]
}

// describe names the character at pos for an error message.
func (s *scanner) describe(pos int) string {
	if pos >= len(s.src) {
		return "end of input"
	}
	r, _ := utf8.DecodeRuneInString(s.src[pos:])
	return strconv.Quote(string(r))
}

// checkText enforces the rules every input shares: a size bound, valid
// UTF-8, and no control or invisible formatting characters other than tab.
func (s *scanner) checkText(limit int) error {
	if len(s.src) > limit {
		return s.errorf(-1, "too long (%d bytes, limit %d)", len(s.src), limit)
	}
	for i, r := range s.src {
		switch {
		case r == utf8.RuneError && !validRuneAt(s.src, i):
			return s.errorf(i, "invalid UTF-8")
		case r == '\t':
		case unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp):
			return s.errorf(i, "control or invisible formatting character %U not allowed", r)
		}
	}
	return nil
}

// validRuneAt reports whether the U+FFFD at s[i] was really written as such,
// rather than being how range reports an invalid byte.
func validRuneAt(s string, i int) bool {
	_, size := utf8.DecodeRuneInString(s[i:])
	return size == 3
}

func isWS(c byte) bool { return c == ' ' || c == '\t' }

func isAlnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }
