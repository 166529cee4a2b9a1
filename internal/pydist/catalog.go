package pydist

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pysandbox/pysandbox/internal/interp"
	"github.com/pysandbox/pysandbox/internal/pep"
)

// shipped is the metadata pysandbox ships: uv's, for current CPython
// releases (see download-metadata.md for where it comes from and how to
// refresh it).
//
//go:embed download-metadata.json
var shipped []byte

// DefaultPrefix is the start of every shipped archive URL: the part a
// mirror replaces, as UV_PYTHON_INSTALL_MIRROR does in uv.
const DefaultPrefix = "https://github.com/astral-sh/python-build-standalone/releases/download"

// MaxMetadataBytes bounds a metadata document (uv's full file is about
// 3 MB).
const MaxMetadataBytes = 32 << 20

// Download is one archive of the metadata, for this machine.
type Download struct {
	Key        string // the metadata's key, e.g. "cpython-3.13.1-linux-x86_64-gnu"
	Major      int
	Minor      int
	Patch      int
	Prerelease string // "" for a final release, else e.g. "rc1"
	URL        string // as the metadata has it, before any mirror
	SHA256     string // lowercase hex
	Build      string // python-build-standalone's release tag, e.g. "20260814"
}

// Version is "3.13.1" or "3.15.0rc1".
func (d *Download) Version() string {
	return fmt.Sprintf("%d.%d.%d%s", d.Major, d.Minor, d.Patch, d.Prerelease)
}

// MajorMinor is "3.13".
func (d *Download) MajorMinor() string { return fmt.Sprintf("%d.%d", d.Major, d.Minor) }

// entry is one value of uv's download metadata. Fields pysandbox does not
// use are left out: unknown fields are ignored, as uv's own reader does,
// so a newer uv file still loads.
type entry struct {
	Name string `json:"name"`
	Arch struct {
		Family  string  `json:"family"`
		Variant *string `json:"variant"`
	} `json:"arch"`
	OS         string  `json:"os"`
	Libc       string  `json:"libc"`
	Major      int     `json:"major"`
	Minor      int     `json:"minor"`
	Patch      int     `json:"patch"`
	Prerelease string  `json:"prerelease"`
	URL        string  `json:"url"`
	SHA256     *string `json:"sha256"`
	Variant    *string `json:"variant"`
	Build      string  `json:"build"`
}

// Catalog is the downloads of a metadata document that can run here: the
// default CPython build for this OS, architecture and C library, as
// install_only archives with a digest.
type Catalog struct {
	Source    string // "shipped", a path or a URL
	downloads []*Download
	// Skipped counts entries for this machine left out, by reason.
	Skipped map[string]int
}

var (
	sha256RE  = regexp.MustCompile(`^[0-9a-f]{64}$`)
	keyRE     = regexp.MustCompile(`^[a-z0-9][a-z0-9._+-]{0,100}$`)
	preRE     = regexp.MustCompile(`^((a|b|rc)[0-9]{1,3})?$`)
	archiveRE = regexp.MustCompile(`install_only(_stripped)?\.tar\.gz$`)
)

// Shipped is the catalog of the metadata pysandbox ships.
func Shipped() *Catalog {
	c, err := ParseCatalog(shipped, "shipped")
	if err != nil {
		panic("pydist: shipped metadata: " + err.Error())
	}
	return c
}

// ParseCatalog reads uv's download metadata (a JSON object of entries) and
// keeps the downloads this machine can use. The document is the
// operator's, but it names what gets downloaded and run: every field used
// is checked, and what does not pass is skipped and counted.
func ParseCatalog(data []byte, source string) (*Catalog, error) {
	if len(data) > MaxMetadataBytes {
		return nil, fmt.Errorf("pydist: the download metadata %s is over %d MiB", source, MaxMetadataBytes>>20)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	var raw map[string]json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("pydist: the download metadata %s is not uv's format (a JSON object of downloads): %w", source, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("pydist: the download metadata %s has data after its JSON object", source)
	}
	c := &Catalog{Source: source, Skipped: map[string]int{}}
	arch := interp.Arch()
	for key, msg := range raw {
		var e entry
		if err := json.Unmarshal(msg, &e); err != nil {
			c.Skipped["malformed"]++
			continue
		}
		if e.Name != "cpython" || e.OS != "linux" || e.Libc != "gnu" || e.Arch.Family != arch {
			continue // another implementation or machine: not ours to count
		}
		if (e.Arch.Variant != nil && *e.Arch.Variant != "") || (e.Variant != nil && *e.Variant != "" && *e.Variant != "default") {
			continue // v2/v3 x86-64 levels, free-threaded and debug builds
		}
		why := ""
		switch {
		case !keyRE.MatchString(key):
			why = "key"
		case e.Major != 3 || e.Minor < interp.MinVersion[1] || e.Minor > 99 || e.Patch < 0 || e.Patch > 999:
			why = "unsupported version"
		case !preRE.MatchString(e.Prerelease):
			why = "prerelease"
		case e.SHA256 == nil || !sha256RE.MatchString(*e.SHA256):
			why = "no sha256"
		case !archiveURL(e.URL):
			why = "not an install_only .tar.gz over http(s)"
		}
		if why != "" {
			c.Skipped[why]++
			continue
		}
		c.downloads = append(c.downloads, &Download{
			Key: key, Major: e.Major, Minor: e.Minor, Patch: e.Patch, Prerelease: e.Prerelease,
			URL: e.URL, SHA256: *e.SHA256, Build: e.Build,
		})
	}
	// Newest first; a key breaks ties so the order is the same every time.
	sort.Slice(c.downloads, func(i, j int) bool {
		a, b := c.downloads[i], c.downloads[j]
		if cmp := compare(a, b); cmp != 0 {
			return cmp > 0
		}
		return a.Key < b.Key
	})
	return c, nil
}

func archiveURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "https" || u.Scheme == "http") && u.Host != "" && u.User == nil && archiveRE.MatchString(u.Path)
}

// compare orders two downloads by version: a final release after its
// prereleases, a < b < rc.
func compare(a, b *Download) int {
	for _, d := range [][2]int{{a.Major, b.Major}, {a.Minor, b.Minor}, {a.Patch, b.Patch}} {
		if d[0] != d[1] {
			if d[0] < d[1] {
				return -1
			}
			return 1
		}
	}
	ra, rb := preRank(a.Prerelease), preRank(b.Prerelease)
	switch {
	case ra[0] != rb[0]:
		return ra[0] - rb[0]
	case ra[1] != rb[1]:
		return ra[1] - rb[1]
	}
	return 0
}

func preRank(p string) [2]int {
	if p == "" {
		return [2]int{3, 0}
	}
	for i, tag := range []string{"a", "b", "rc"} {
		if n, ok := strings.CutPrefix(p, tag); ok && n != "" && n[0] >= '0' && n[0] <= '9' {
			v, _ := strconv.Atoi(n)
			return [2]int{i, v}
		}
	}
	return [2]int{-1, 0}
}

// Downloads are the catalog's downloads, newest first.
func (c *Catalog) Downloads() []*Download { return c.downloads }

// ErrNoSuchVersion is a version the metadata has no download of.
var ErrNoSuchVersion = errors.New("pydist: no download of that version")

// Find picks the download for a request: "3.13" (its newest release, or
// its newest prerelease when it has no release yet), "3.13.1" (that
// release), or, with version "", the newest release that satisfies spec.
// spec, when set, must be satisfied too.
func (c *Catalog) Find(version string, spec *pep.SpecifierSet) (*Download, error) {
	var pre *Download
	for _, d := range c.downloads {
		if spec != nil && !spec.Contains(d.Version()) {
			continue
		}
		switch {
		case version == "":
		case version == d.MajorMinor():
		case version == fmt.Sprintf("%d.%d.%d", d.Major, d.Minor, d.Patch) || version == d.Version():
		default:
			continue
		}
		if d.Prerelease == "" || version == d.Version() {
			return d, nil
		}
		// A prerelease only when the request names its minor version and
		// there is no release of it.
		if pre == nil && version != "" {
			pre = d
		}
	}
	if pre != nil {
		return pre, nil
	}
	return nil, ErrNoSuchVersion
}

// Minors lists the newest download of each minor version, newest first.
func (c *Catalog) Minors() []*Download {
	seen := map[string]bool{}
	var out []*Download
	for _, d := range c.downloads {
		if !seen[d.MajorMinor()] {
			seen[d.MajorMinor()] = true
			out = append(out, d)
		}
	}
	return out
}

// Mirrored is u with DefaultPrefix replaced by mirror, as uv's
// UV_PYTHON_INSTALL_MIRROR does; a URL that does not start with the
// prefix is left as it is.
func Mirrored(u, mirror string) string {
	if mirror == "" {
		return u
	}
	rest, ok := strings.CutPrefix(u, DefaultPrefix)
	if !ok || (rest != "" && rest[0] != '/') {
		return u
	}
	return strings.TrimRight(mirror, "/") + rest
}

func readFile(p string) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("pydist: download metadata: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxMetadataBytes+1))
	if err != nil {
		return nil, fmt.Errorf("pydist: download metadata: %w", err)
	}
	return data, nil
}

// Catalog returns the download metadata, fetching it on first need when
// it is a URL.
func (m *Manager) Catalog(ctx context.Context, who Who) (*Catalog, error) {
	m.mu.Lock()
	c := m.catalog
	m.mu.Unlock()
	if c != nil {
		return c, nil
	}
	// One fetch for every caller, bounded in time whoever started it;
	// each caller waits only as long as its own context allows.
	ch := m.flight.DoChan("metadata", func() (any, error) {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), metadataTimeout)
		defer cancel()
		var b strings.Builder
		lw := &limitWriter{w: &b, n: MaxMetadataBytes}
		if _, _, err := m.fetch(fctx, m.cfg.Metadata, who, lw, func(int64) error { return nil }, nil); err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				err = fmt.Errorf("%s did not send it within %s", redact(m.cfg.Metadata), metadataTimeout)
			}
			return nil, err
		}
		c, err := ParseCatalog([]byte(b.String()), redact(m.cfg.Metadata))
		if err != nil {
			return nil, err
		}
		m.mu.Lock()
		m.catalog = c
		m.mu.Unlock()
		return c, nil
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return nil, fmt.Errorf("the download metadata could not be read: %w", r.Err)
		}
		return r.Val.(*Catalog), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// metadataTimeout bounds the fetch of metadata given as a URL.
const metadataTimeout = 60 * time.Second

// LoadedCatalog is the metadata if it has been read, without fetching it.
func (m *Manager) LoadedCatalog() *Catalog {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.catalog
}

type limitWriter struct {
	w io.Writer
	n int64
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > l.n {
		return 0, fmt.Errorf("pydist: the download metadata is over %d MiB", MaxMetadataBytes>>20)
	}
	l.n -= int64(len(p))
	return l.w.Write(p)
}
