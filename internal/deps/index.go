package deps

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"

	"github.com/pysandbox/pysandbox/internal/egress"
)

// IndexConfig says where the installer may fetch packages from.
type IndexConfig struct {
	IndexURL       string   // "" = the installer's default (PyPI)
	ExtraIndexURLs []string // more indexes, each passed as --extra-index-url
	// FindLinks are local wheelhouse directories (absolute host paths,
	// bind-mounted read-only into the installer's sandbox) or http(s) URLs.
	FindLinks []string
	NoIndex   bool // only FindLinks (offline)
	// AllowSdist lets the installer build source distributions, which runs
	// their setup code. By default only wheels are accepted.
	AllowSdist bool
}

// Targets are the host:port of every index and find-links URL: where the
// installer must be able to connect.
func (ix IndexConfig) Targets() []string {
	var out []string
	add := func(raw string) {
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" {
			return
		}
		hp := egress.Target(u)
		if !slices.Contains(out, hp) {
			out = append(out, hp)
		}
	}
	if !ix.NoIndex {
		if ix.IndexURL == "" {
			// pip's and uv's default: PyPI's pages and its file host.
			out = append(out, "pypi.org:443", "files.pythonhosted.org:443")
		} else {
			add(ix.IndexURL)
		}
		for _, u := range ix.ExtraIndexURLs {
			add(u)
		}
	}
	for _, fl := range ix.FindLinks {
		if isHTTPURL(fl) {
			add(fl)
		}
	}
	return out
}

// checkIndex validates the index configuration once, so a bad flag fails at
// start-up rather than as a puzzling install error.
func checkIndex(ix *IndexConfig) error {
	urls := append([]string(nil), ix.ExtraIndexURLs...)
	if ix.IndexURL != "" {
		urls = append(urls, ix.IndexURL)
	}
	for _, u := range urls {
		if !isHTTPURL(u) {
			return fmt.Errorf("deps: index URL %q must be an http or https URL", u)
		}
	}
	for _, fl := range ix.FindLinks {
		if isHTTPURL(fl) {
			continue
		}
		if !filepath.IsAbs(fl) || filepath.Clean(fl) != fl || fl == "/" {
			return fmt.Errorf("deps: find-links %q must be an http(s) URL or a clean absolute directory path", fl)
		}
		fi, err := os.Stat(fl)
		if err != nil {
			return fmt.Errorf("deps: find-links: %w", err)
		}
		if !fi.IsDir() {
			return fmt.Errorf("deps: find-links %s is not a directory", fl)
		}
		// A root server's installer runs as a sandbox uid of its own, which
		// is "other" to the wheelhouse; without this check pip would just
		// say that no matching distribution exists.
		if os.Geteuid() == 0 && fi.Mode().Perm()&0o005 != 0o005 {
			return fmt.Errorf("deps: find-links directory %s (mode %04o) must be readable and searchable by others: the installer runs as an unprivileged sandbox user", fl, fi.Mode().Perm())
		}
	}
	if ix.NoIndex && len(ix.FindLinks) == 0 {
		return errors.New("deps: NoIndex without FindLinks leaves the installer nothing to install from")
	}
	return nil
}

func isHTTPURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
}
