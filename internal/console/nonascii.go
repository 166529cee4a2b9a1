package console

import (
	"fmt"
	"sort"
	"unicode"
)

// nonASCII lists the distinct characters of s outside ASCII, at most max,
// as "U+0435 е" (format characters, already escaped by inert, do not
// appear). A reviewer sees at once that "раss" is not "pass".
func nonASCII(s string, max int) []string {
	seen := map[rune]bool{}
	var rs []rune
	for _, r := range s {
		if r < 0x80 || seen[r] || r == '…' {
			continue
		}
		seen[r] = true
		rs = append(rs, r)
	}
	// Letters of other scripts than Latin first (the look-alikes of
	// ASCII letters), then other letters, then the rest.
	rank := func(r rune) int {
		switch {
		case unicode.IsLetter(r) && !unicode.Is(unicode.Latin, r):
			return 0
		case unicode.IsLetter(r):
			return 1
		}
		return 2
	}
	sort.Slice(rs, func(i, j int) bool {
		if a, b := rank(rs[i]), rank(rs[j]); a != b {
			return a < b
		}
		return rs[i] < rs[j]
	})
	var out []string
	for _, r := range rs {
		if len(out) == max {
			out = append(out, fmt.Sprintf("and %d more", len(rs)-max))
			break
		}
		out = append(out, fmt.Sprintf("U+%04X %c", r, r))
	}
	return out
}
