package console

import (
	"fmt"
	"sort"
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
	sort.Slice(rs, func(i, j int) bool { return rs[i] < rs[j] })
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
