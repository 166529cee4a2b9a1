package policy

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/pysandbox/pysandbox/internal/pep"
)

// PythonRules restrict which Python versions runs may use, whether the
// host has them or the server would download them. Each rule is a
// version ("3.13" means every 3.13.x, "3.12.4" that release) or a PEP 440
// specifier set (">=3.10,<3.14"). Deny wins over allow; when Allow is set
// a version must match one of its rules. They are asked about the
// interpreter a run would use, and about a download before it starts.
type PythonRules struct {
	Allow []string `json:"allow,omitempty"`
	Deny  []string `json:"deny,omitempty"`
}

// PythonError is a Python version the policy refuses.
type PythonError struct {
	Version string
	Rule    string // the deny rule that matched; "" when no allow rule did
	Allowed []string
}

func (e *PythonError) Error() string {
	if e.Rule != "" {
		return fmt.Sprintf("Python %s is refused by the policy rule python.deny %q; use another python_version", e.Version, e.Rule)
	}
	return fmt.Sprintf("Python %s is not allowed by the policy: python.allow lists only %s", e.Version, strings.Join(e.Allowed, ", "))
}

// Empty reports whether the rules allow every version.
func (r *PythonRules) Empty() bool { return r == nil || len(r.Allow) == 0 && len(r.Deny) == 0 }

// Check refuses a version ("3.13.1", "3.15.0rc1") the rules do not allow.
func (r *PythonRules) Check(version string) error {
	if r.Empty() {
		return nil
	}
	for _, rule := range r.Deny {
		if versionMatches(rule, version) {
			return &PythonError{Version: version, Rule: rule}
		}
	}
	if len(r.Allow) == 0 {
		return nil
	}
	for _, rule := range r.Allow {
		if versionMatches(rule, version) {
			return nil
		}
	}
	return &PythonError{Version: version, Allowed: r.Allow}
}

var plainVersionRE = regexp.MustCompile(`^[0-9]+\.[0-9]+(\.[0-9]+)?$`)

// versionMatches reports whether version meets a rule (validated when the
// policy was read).
func versionMatches(rule, version string) bool {
	if plainVersionRE.MatchString(rule) {
		if strings.Count(rule, ".") == 1 {
			return version == rule || strings.HasPrefix(version, rule+".")
		}
		return version == rule || strings.HasPrefix(version, rule) && !isDigit(version[len(rule)])
	}
	set, err := pep.ParseSpecifierSet(rule)
	return err == nil && set.Contains(version)
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func (v *validator) python(field string, x any) *PythonRules {
	m := v.object(field, x, "allow", "deny")
	if m == nil {
		return nil
	}
	r := &PythonRules{Allow: v.versionRules(field+".allow", m["allow"]), Deny: v.versionRules(field+".deny", m["deny"])}
	if a, ok := m["allow"].([]any); ok && len(a) == 0 {
		v.fail(field+".allow", "an empty list would refuse every Python; remove the field to allow all, or list the versions")
	}
	return r
}

func (v *validator) versionRules(field string, x any) []string {
	if x == nil {
		return nil
	}
	list, ok := x.([]any)
	if !ok {
		v.fail(field, "want a list of versions (\"3.13\") or specifiers (\">=3.10\"), got %s", kind(x))
		return nil
	}
	var out []string
	for i, item := range list {
		f := fmt.Sprintf("%s[%d]", field, i)
		if kind(item) == "a number" {
			v.fail(f, "write versions as strings, e.g. \"3.10\": a bare 3.10 is the number 3.1")
			continue
		}
		s, ok := v.str(f, item)
		if !ok {
			continue
		}
		s = strings.TrimSpace(s)
		if plainVersionRE.MatchString(s) {
			out = append(out, s)
			continue
		}
		if _, err := pep.ParseSpecifierSet(s); err != nil || s == "" {
			v.fail(f, "%q is neither a version such as 3.13 nor a specifier such as >=3.10", s)
			continue
		}
		out = append(out, s)
	}
	return out
}
