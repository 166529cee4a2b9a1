package console

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// inert makes text an agent wrote safe to look at, beyond HTML escaping
// (html/template and textContent do that): control characters (ANSI
// escapes, carriage returns, NULs) and the invisible formatting characters
// that reorder or hide text (bidi overrides and isolates, zero-width
// joiners) are shown as visible escapes such as \x1b and \u202e, so code
// reads in the order it runs, an RTL override cannot make "evil" read
// "live", and a terminal sequence cannot pretend to be output. Newlines
// and tabs stay.
func inert(s string) string { return inertText(s, false) }

// inertLine is inert for a value that is one line (an identity, a tool's
// name, an id): a line break or tab in one is shown as an escape too, so
// that no value can pass for two, nor read differently in a table cell,
// where the line break would show as a space.
func inertLine(s string) string { return inertText(s, true) }

func inertText(s string, line bool) string {
	if !needsInert(s) && (!line || !strings.ContainsAny(s, "\n\t")) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	for _, r := range s {
		switch {
		case (r == '\n' || r == '\t') && !line:
			b.WriteRune(r)
		case r == unicode.ReplacementChar:
			b.WriteRune(r)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case hidden(r):
			if r > 0xffff {
				fmt.Fprintf(&b, `\U%08x`, r)
			} else {
				fmt.Fprintf(&b, `\u%04x`, r)
			}
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

func needsInert(s string) bool {
	if !utf8.ValidString(s) {
		return true
	}
	for _, r := range s {
		if (r < 0x20 && r != '\n' && r != '\t') || r == 0x7f || hidden(r) {
			return true
		}
	}
	return false
}

// hidden: C1 controls, the line and paragraph separators, and every
// default-ignorable code point (Unicode's Default_Ignorable_Code_Point:
// the format characters of category Cf, such as bidi embeddings,
// overrides and isolates, zero-width spaces and joiners, the BOM and tag
// characters; variation selectors; the Hangul fillers and the combining
// grapheme joiner). Fonts draw these as nothing, and Python accepts
// several of them inside identifiers, so "eval\ufe00" would read as
// "eval".
func hidden(r rune) bool {
	return (r >= 0x80 && r < 0xa0) || r == 0x2028 || r == 0x2029 ||
		unicode.In(r, unicode.Cf, unicode.Variation_Selector, unicode.Other_Default_Ignorable_Code_Point)
}
