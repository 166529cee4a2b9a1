package pep

import (
	"regexp"
	"strings"
)

// Version is a parsed PEP 440 version.
//
// Numbers are kept as decimal strings without leading zeros rather than as
// integers: PEP 440 puts no bound on them, and comparing digit strings means
// a hostile "1.99999999999999999999999" cannot overflow anything.
type Version struct {
	epoch   string
	release []string
	preL    string // "a", "b", "rc" or "" for none
	preN    string
	hasPost bool
	postN   string
	hasDev  bool
	devN    string
	local   []string // lowercased, separators normalised away
}

// versionPattern is the VERSION_PATTERN regular expression from PEP 440
// (Appendix B), anchored. Go's regexp picks submatches the way a
// backtracking engine would, so the groups mean what they mean in Python.
var versionPattern = regexp.MustCompile(`(?i)^v?` +
	`(?:([0-9]+)!)?` + // epoch
	`([0-9]+(?:\.[0-9]+)*)` + // release
	`(?:[-_.]?(alpha|a|beta|b|preview|pre|c|rc)[-_.]?([0-9]+)?)?` + // pre-release
	`(?:-([0-9]+)|[-_.]?(post|rev|r)[-_.]?([0-9]+)?)?` + // post-release
	`(?:[-_.]?(dev)[-_.]?([0-9]+)?)?` + // dev release
	`(?:\+([a-z0-9]+(?:[-_.][a-z0-9]+)*))?$`) // local version

// ParseVersion parses a PEP 440 version such as "3.11.2", "1.0rc1",
// "2!1.0.post2.dev3" or "1.0+ubuntu.1". Surrounding spaces are allowed, as
// are the alternative spellings PEP 440 normalises ("1.0-alpha-1", "v1.0").
func ParseVersion(s string) (Version, error) {
	sc := &scanner{grammar: "pep440", src: s}
	if err := sc.checkText(MaxRequirementLength); err != nil {
		return Version{}, err
	}
	v, ok := parseVersion(strings.Trim(s, " \t"))
	if !ok {
		return Version{}, sc.errorf(-1, "invalid version")
	}
	return v, nil
}

// parseVersion does the work of ParseVersion without building an error, for
// callers that report problems in their own terms.
func parseVersion(s string) (Version, bool) {
	m := versionPattern.FindStringSubmatch(s)
	if m == nil {
		return Version{}, false
	}
	v := Version{epoch: trimNum(m[1])}
	for seg := range strings.SplitSeq(m[2], ".") {
		v.release = append(v.release, trimNum(seg))
	}
	if m[3] != "" {
		switch strings.ToLower(m[3]) {
		case "a", "alpha":
			v.preL = "a"
		case "b", "beta":
			v.preL = "b"
		default: // c, rc, pre, preview
			v.preL = "rc"
		}
		v.preN = trimNum(m[4])
	}
	switch {
	case m[5] != "": // the implicit "1.0-1" form
		v.hasPost, v.postN = true, trimNum(m[5])
	case m[6] != "":
		v.hasPost, v.postN = true, trimNum(m[7])
	}
	if m[8] != "" {
		v.hasDev, v.devN = true, trimNum(m[9])
	}
	if m[10] != "" {
		v.local = strings.FieldsFunc(strings.ToLower(m[10]), func(r rune) bool {
			return r == '-' || r == '_' || r == '.'
		})
	}
	return v, true
}

// trimNum canonicalises a digit string: no leading zeros, "" becomes "0"
// (an omitted number in "1.0a" or "1.0.post" means zero).
func trimNum(s string) string {
	s = strings.TrimLeft(s, "0")
	if s == "" {
		return "0"
	}
	return s
}

// cmpNum compares two canonical digit strings numerically.
func cmpNum(a, b string) int {
	if len(a) != len(b) {
		if len(a) < len(b) {
			return -1
		}
		return 1
	}
	return strings.Compare(a, b)
}

// String returns the PEP 440 normal form of the version, for example
// "1.0rc1.post2.dev3+ubuntu.1".
func (v Version) String() string {
	var b strings.Builder
	if v.epoch != "0" && v.epoch != "" {
		b.WriteString(v.epoch)
		b.WriteByte('!')
	}
	b.WriteString(strings.Join(v.release, "."))
	if v.preL != "" {
		b.WriteString(v.preL)
		b.WriteString(v.preN)
	}
	if v.hasPost {
		b.WriteString(".post")
		b.WriteString(v.postN)
	}
	if v.hasDev {
		b.WriteString(".dev")
		b.WriteString(v.devN)
	}
	if len(v.local) > 0 {
		b.WriteByte('+')
		b.WriteString(strings.Join(v.local, "."))
	}
	return b.String()
}

// IsPrerelease reports whether v is a pre-release or a development release.
func (v Version) IsPrerelease() bool { return v.preL != "" || v.hasDev }

func (v Version) isPostrelease() bool { return v.hasPost }

// public returns v without its local version label.
func (v Version) public() Version {
	v.local = nil
	return v
}

// base returns only the epoch and release segment of v.
func (v Version) base() Version {
	return Version{epoch: v.epoch, release: v.release}
}

// Compare returns -1, 0 or +1 as v sorts before, equal to or after w under
// PEP 440 ordering: epoch, release (trailing zeros ignored), then dev <
// pre-release < final < post-release, then local labels.
func (v Version) Compare(w Version) int {
	if c := cmpNum(orZero(v.epoch), orZero(w.epoch)); c != 0 {
		return c
	}
	for i := range max(len(v.release), len(w.release)) {
		if c := cmpNum(segment(v.release, i), segment(w.release, i)); c != 0 {
			return c
		}
	}
	if c := cmpPhase(v.prePhase(), w.prePhase()); c != 0 {
		return c
	}
	if c := cmpPhase(v.postPhase(), w.postPhase()); c != 0 {
		return c
	}
	if c := cmpPhase(v.devPhase(), w.devPhase()); c != 0 {
		return c
	}
	return cmpLocal(v.local, w.local)
}

func orZero(s string) string {
	if s == "" {
		return "0"
	}
	return s
}

func segment(release []string, i int) string {
	if i < len(release) {
		return release[i]
	}
	return "0"
}

// phase is one component of the PEP 440 sort key: a rank, then a number.
// The ranks stand in for packaging's -Infinity/+Infinity sentinels.
type phase struct {
	rank int
	n    string
}

func cmpPhase(a, b phase) int {
	if a.rank != b.rank {
		if a.rank < b.rank {
			return -1
		}
		return 1
	}
	return cmpNum(orZero(a.n), orZero(b.n))
}

func (v Version) prePhase() phase {
	switch {
	case v.preL == "" && !v.hasPost && v.hasDev:
		// 1.0.dev0 sorts before 1.0a0.
		return phase{rank: 0}
	case v.preL == "":
		// A final release sorts after all its pre-releases.
		return phase{rank: 4}
	case v.preL == "a":
		return phase{1, v.preN}
	case v.preL == "b":
		return phase{2, v.preN}
	default:
		return phase{3, v.preN}
	}
}

func (v Version) postPhase() phase {
	if !v.hasPost {
		return phase{rank: 0}
	}
	return phase{1, v.postN}
}

func (v Version) devPhase() phase {
	if !v.hasDev {
		return phase{rank: 1}
	}
	return phase{0, v.devN}
}

// cmpLocal orders local labels: none sorts first; then segment by segment,
// numbers compare numerically and beat words; a longer label whose prefix
// matches wins.
func cmpLocal(a, b []string) int {
	for i := range min(len(a), len(b)) {
		an, bn := isNumeric(a[i]), isNumeric(b[i])
		var c int
		switch {
		case an && bn:
			c = cmpNum(trimNum(a[i]), trimNum(b[i]))
		case an:
			c = 1
		case bn:
			c = -1
		default:
			c = strings.Compare(a[i], b[i])
		}
		if c != 0 {
			return c
		}
	}
	switch {
	case len(a) < len(b):
		return -1
	case len(a) > len(b):
		return 1
	}
	return 0
}

func isNumeric(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) {
			return false
		}
	}
	return s != ""
}
