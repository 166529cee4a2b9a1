package pypi

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"html"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
)

// Index is a PEP 503 "simple" repository served over HTTP on 127.0.0.1.
//
//	GET /simple/             lists the projects (normalized names)
//	GET /simple/<project>/   lists its files, with #sha256=<hex> fragments
//	                         and data-requires-python when set; a
//	                         non-normalized <project> redirects (301)
//	GET /files/<file>        serves a file
//
// Every request is counted by path (Hits), so a test can assert that a
// cache hit did not touch the index.
type Index struct {
	// URL is the index URL to pass to --index-url, ending in "/simple/".
	URL string
	// Dir is the wheelhouse: every published file, usable with
	// --no-index --find-links.
	Dir string

	srv *httptest.Server

	mu        sync.Mutex
	projects  map[string]map[string]entry // normalized name -> file name -> entry
	hits      map[string]int
	downloads int
}

type entry struct {
	sha256         string
	requiresPython string
}

// NewIndex builds a wheel of every package (and an sdist too for those
// with Sdist set) into a fresh wheelhouse under t.TempDir() and serves
// them. The server stops at t's cleanup (or at Close). Build errors fail
// the test.
func NewIndex(t testing.TB, pkgs ...Package) *Index {
	t.Helper()
	ix := &Index{
		Dir:      t.TempDir(),
		projects: map[string]map[string]entry{},
		hits:     map[string]int{},
	}
	for _, p := range pkgs {
		if !p.SdistOnly {
			ix.mustAdd(t, p, BuildWheel)
		}
		if p.Sdist || p.SdistOnly {
			ix.mustAdd(t, p, BuildSdist)
		}
	}
	ix.srv = httptest.NewServer(http.HandlerFunc(ix.serve))
	ix.URL = ix.srv.URL + "/simple/"
	t.Cleanup(ix.Close)
	return ix
}

func (ix *Index) mustAdd(t testing.TB, p Package, build func(string, Package) (string, error)) string {
	t.Helper()
	path, err := ix.add(p, build)
	if err != nil {
		t.Fatalf("pypi: %v", err)
	}
	return path
}

// AddWheel builds p's wheel into the wheelhouse and publishes it; it
// returns the wheel's path.
func (ix *Index) AddWheel(p Package) (string, error) { return ix.add(p, BuildWheel) }

// AddSdist builds p's sdist into the wheelhouse and publishes it; it
// returns the sdist's path. Called for a project that has no wheel, it
// makes an sdist-only project.
func (ix *Index) AddSdist(p Package) (string, error) { return ix.add(p, BuildSdist) }

func (ix *Index) add(p Package, build func(string, Package) (string, error)) (string, error) {
	path, err := build(ix.Dir, p)
	if err != nil {
		return "", err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(data)
	ix.mu.Lock()
	defer ix.mu.Unlock()
	name := Normalize(p.Name)
	if ix.projects[name] == nil {
		ix.projects[name] = map[string]entry{}
	}
	ix.projects[name][filepath.Base(path)] = entry{hex.EncodeToString(sum[:]), p.RequiresPython}
	return path, nil
}

// Handler serves the index, for a test that serves it elsewhere (behind
// a name, for a sandbox's proxy).
func (ix *Index) Handler() http.Handler { return http.HandlerFunc(ix.serve) }

// FileURL is the download URL of a published file, given its base name.
func (ix *Index) FileURL(file string) string { return ix.srv.URL + "/files/" + file }

// Close stops the server. It is safe to call more than once.
func (ix *Index) Close() {
	if ix.srv != nil {
		ix.srv.Close()
	}
}

// Hits is how many requests the index received for an URL path, e.g.
// "/simple/pysbx-alpha/" or "/files/pysbx_alpha-1.0.0-py3-none-any.whl".
func (ix *Index) Hits(path string) int {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return ix.hits[path]
}

// Downloads is how many times the file with this base name was served.
func (ix *Index) Downloads(file string) int { return ix.Hits("/files/" + file) }

// TotalHits is the number of requests the index received, for any path.
func (ix *Index) TotalHits() int {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	n := 0
	for _, v := range ix.hits {
		n += v
	}
	return n
}

// TotalFileDownloads is how many requests under /files/ were served a file.
func (ix *Index) TotalFileDownloads() int {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return ix.downloads
}

// ResetCounts zeroes Hits and TotalFileDownloads.
func (ix *Index) ResetCounts() {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.hits = map[string]int{}
	ix.downloads = 0
}

func (ix *Index) serve(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	ix.mu.Lock()
	ix.hits[p]++
	ix.mu.Unlock()

	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	switch {
	case p == "/simple":
		http.Redirect(w, r, "/simple/", http.StatusMovedPermanently)
	case p == "/simple/":
		ix.serveRoot(w)
	case strings.HasPrefix(p, "/simple/"):
		name := strings.TrimPrefix(p, "/simple/")
		trimmed := strings.TrimSuffix(name, "/")
		if trimmed == "" || strings.Contains(trimmed, "/") {
			http.NotFound(w, r)
			return
		}
		if norm := Normalize(trimmed); norm != trimmed || !strings.HasSuffix(name, "/") {
			http.Redirect(w, r, "/simple/"+norm+"/", http.StatusMovedPermanently)
			return
		}
		ix.serveProject(w, r, trimmed)
	case strings.HasPrefix(p, "/files/"):
		ix.serveFile(w, r, strings.TrimPrefix(p, "/files/"))
	default:
		http.NotFound(w, r)
	}
}

func writeHTML(w http.ResponseWriter, title, body string) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	fmt.Fprintf(w, "<!DOCTYPE html>\n<html>\n<head>\n"+
		"<meta name=\"pypi:repository-version\" content=\"1.0\">\n"+
		"<title>%s</title>\n</head>\n<body>\n<h1>%s</h1>\n%s</body>\n</html>\n",
		html.EscapeString(title), html.EscapeString(title), body)
}

func (ix *Index) serveRoot(w http.ResponseWriter) {
	ix.mu.Lock()
	names := make([]string, 0, len(ix.projects))
	for n := range ix.projects {
		names = append(names, n)
	}
	ix.mu.Unlock()
	sort.Strings(names)
	var b bytes.Buffer
	for _, n := range names {
		fmt.Fprintf(&b, "<a href=\"/simple/%s/\">%s</a><br>\n", n, html.EscapeString(n))
	}
	writeHTML(w, "Simple index", b.String())
}

func (ix *Index) serveProject(w http.ResponseWriter, r *http.Request, name string) {
	ix.mu.Lock()
	files := ix.projects[name]
	type row struct {
		file string
		e    entry
	}
	rows := make([]row, 0, len(files))
	for f, e := range files {
		rows = append(rows, row{f, e})
	}
	ix.mu.Unlock()
	if len(rows) == 0 {
		http.NotFound(w, r)
		return
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].file < rows[j].file })
	var b bytes.Buffer
	for _, r := range rows {
		attr := ""
		if r.e.requiresPython != "" {
			attr = fmt.Sprintf(" data-requires-python=\"%s\"", html.EscapeString(r.e.requiresPython))
		}
		fmt.Fprintf(&b, "<a href=\"/files/%s#sha256=%s\"%s>%s</a><br>\n",
			html.EscapeString(r.file), r.e.sha256, attr, html.EscapeString(r.file))
	}
	writeHTML(w, "Links for "+name, b.String())
}

func (ix *Index) serveFile(w http.ResponseWriter, r *http.Request, file string) {
	ix.mu.Lock()
	known := false
	for _, files := range ix.projects {
		if _, ok := files[file]; ok {
			known = true
			break
		}
	}
	ix.mu.Unlock()
	if !known {
		http.NotFound(w, r)
		return
	}
	f, err := os.Open(filepath.Join(ix.Dir, file))
	if err != nil {
		http.NotFound(w, r)
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if r.Method == http.MethodGet {
		ix.mu.Lock()
		ix.downloads++
		ix.mu.Unlock()
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	http.ServeContent(w, r, file, st.ModTime(), f)
}
