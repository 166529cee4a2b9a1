package deps

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/pysandbox/pysandbox/internal/interp"
	"github.com/pysandbox/pysandbox/internal/pep"
)

// keyVersion changes whenever the layout of an environment or the way it is
// built changes, so that old envs are never mistaken for new ones.
const keyVersion = "pysandbox-deps/1"

// RequirementError is a request's requirements that no install may be
// made of: the caller's to fix, not the server's.
type RequirementError struct{ Msg string }

func (e *RequirementError) Error() string { return "deps: " + e.Msg }

// Canonicalize validates reqs and returns them canonical (names and extras
// normalized, specifiers sorted), de-duplicated and sorted: the form the key
// hashes and the installer receives. URL requirements are refused: "name @
// url" would let the request point the installer at arbitrary archives (or
// paths) outside the configured indexes, and a URL's content is not
// addressed by its text, so the cache could not key it.
func Canonicalize(reqs []string) ([]string, error) {
	if len(reqs) == 0 {
		return nil, &RequirementError{Msg: "no requirements"}
	}
	if len(reqs) > MaxRequirements {
		return nil, &RequirementError{Msg: fmt.Sprintf("%d requirements (limit %d)", len(reqs), MaxRequirements)}
	}
	seen := map[string]bool{}
	var out []string
	for _, s := range reqs {
		r, err := pep.ParseRequirement(strings.Trim(s, " \t"))
		if err != nil {
			return nil, &RequirementError{Msg: "invalid requirement: " + err.Error()}
		}
		if r.URL != "" {
			return nil, &RequirementError{Msg: fmt.Sprintf("requirement %q: direct URL requirements (name @ url) are not supported; name the package and a version instead (e.g. %s==1.0), installed from the configured index", s, r.Normalized)}
		}
		r.Name = r.Normalized
		if len(r.Extras) > 0 {
			ex := make([]string, len(r.Extras))
			for i, e := range r.Extras {
				ex[i] = pep.NormalizeName(e)
			}
			slices.Sort(ex)
			r.Extras = slices.Compact(ex)
		}
		if r.Specifier != "" {
			// A comma is a conjunction: order carries no meaning.
			sp := strings.Split(r.Specifier, ",")
			slices.Sort(sp)
			r.Specifier = strings.Join(slices.Compact(sp), ",")
		}
		cs := r.String()
		if !seen[cs] {
			seen[cs] = true
			out = append(out, cs)
		}
	}
	sort.Strings(out)
	return out, nil
}

// Key returns the content address of reqs on py with this cache's index
// configuration. It fails only for invalid requirements.
func (c *Cache) Key(py *interp.Interpreter, reqs []string) (string, error) {
	if py == nil {
		return "", errors.New("deps: no interpreter")
	}
	canon, err := Canonicalize(reqs)
	if err != nil {
		return "", err
	}
	return c.key(py, canon), nil
}

func (c *Cache) key(py *interp.Interpreter, canon []string) string {
	path := py.Path
	if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real
	}
	installer := "pip"
	if c.uv != "" {
		installer = "uv"
	}
	// JSON keeps the fields unambiguous: no value can forge a separator.
	data, _ := json.Marshal(struct {
		V            string
		Installer    string
		Python, Path string
		Requirements []string
		Index        IndexConfig
	}{keyVersion, installer, py.Version, path, canon, c.cfg.Index})
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])[:32]
}
