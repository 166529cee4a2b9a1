package policy

import (
	"fmt"
	"path"
	"strings"

	"github.com/pysandbox/pysandbox/internal/pep"
)

// PackageRules restrict which packages may be installed. Patterns are
// shell globs (*, ?, [a-z]) matched against PEP 503 normalised names, so
// "Pandas_*" and "pandas-*" are the same rule.
//
// Deny wins over allow. When Allow is set, a requested package must match
// one of its patterns. The rules apply to what is requested (the
// dependencies parameter, PEP 723 blocks, install_package) before anything
// is installed; Deny also applies to every distribution the installer
// pulled in, checked after the install and before the environment is used.
type PackageRules struct {
	Allow []string `json:"allow,omitempty"`
	Deny  []string `json:"deny,omitempty"`
}

// PackageError is a package the policy refuses.
type PackageError struct {
	Package string // normalised name
	Rule    string // the pattern that denied it; "" when it matched no allow pattern
	Allowed []string
	// Transitive is set when the package was not requested but pulled in
	// by the installer as a dependency of one that was.
	Transitive bool
}

func (e *PackageError) Error() string {
	what := fmt.Sprintf("package %q", e.Package)
	if e.Transitive {
		what = fmt.Sprintf("package %q (a dependency of a requested package)", e.Package)
	}
	if e.Rule != "" {
		return fmt.Sprintf("%s is refused by the policy rule packages.deny %q", what, e.Rule)
	}
	return fmt.Sprintf("%s is not allowed by the policy: packages.allow lists only %s", what, strings.Join(e.Allowed, ", "))
}

// Empty reports whether the rules allow every package.
func (r PackageRules) Empty() bool { return len(r.Allow) == 0 && len(r.Deny) == 0 }

// Check refuses a requested package (any spelling of its name).
func (r PackageRules) Check(name string) error {
	n := pep.NormalizeName(name)
	if g := r.denied(n); g != "" {
		return &PackageError{Package: n, Rule: g}
	}
	if len(r.Allow) == 0 {
		return nil
	}
	for _, g := range r.Allow {
		if ok, _ := path.Match(g, n); ok {
			return nil
		}
	}
	return &PackageError{Package: n, Allowed: r.Allow}
}

// CheckInstalled refuses a package that the installer pulled in: only the
// deny patterns apply, since an allow list names what may be asked for,
// not every library those packages need.
func (r PackageRules) CheckInstalled(name string) error {
	n := pep.NormalizeName(name)
	if g := r.denied(n); g != "" {
		// Requested packages met the same deny rules before the install,
		// so one found now came in as a dependency.
		return &PackageError{Package: n, Rule: g, Transitive: true}
	}
	return nil
}

// denied returns the deny pattern that matches a normalised name, or "".
func (r PackageRules) denied(n string) string {
	for _, g := range r.Deny {
		if ok, _ := path.Match(g, n); ok {
			return g
		}
	}
	return ""
}

// normalizeGlob normalises a pattern the way names are, and checks it.
func normalizeGlob(g string) (string, error) {
	if g == "" || len(g) > 200 {
		return "", fmt.Errorf("want a package name pattern of 1 to 200 characters")
	}
	if strings.ContainsAny(g, "/\\") {
		return "", fmt.Errorf("%q: a package name pattern has no / or \\", g)
	}
	n := pep.NormalizeName(g)
	if _, err := path.Match(n, ""); err != nil {
		return "", fmt.Errorf("%q is not a valid pattern (*, ? and [a-z] are allowed)", g)
	}
	return n, nil
}

func (v *validator) packages(field string, x any) PackageRules {
	m := v.object(field, x, "allow", "deny")
	var r PackageRules
	if m == nil {
		return r
	}
	r.Allow = v.globs(field+".allow", m["allow"])
	r.Deny = v.globs(field+".deny", m["deny"])
	// An empty allow list written out would allow nothing, which is
	// surely not what anyone meant to write: say so.
	if a, ok := m["allow"].([]any); ok && len(a) == 0 {
		v.fail(field+".allow", "an empty list would refuse every package; remove the field to allow all, or list the packages")
	}
	return r
}

func (v *validator) globs(field string, x any) []string {
	if x == nil {
		return nil
	}
	list, ok := x.([]any)
	if !ok {
		v.fail(field, "want a list of package name patterns, got %s", kind(x))
		return nil
	}
	var out []string
	for i, item := range list {
		f := fmt.Sprintf("%s[%d]", field, i)
		s, ok := v.str(f, item)
		if !ok {
			continue
		}
		g, err := normalizeGlob(s)
		if err != nil {
			v.fail(f, "%v", err)
			continue
		}
		out = append(out, g)
	}
	return out
}
