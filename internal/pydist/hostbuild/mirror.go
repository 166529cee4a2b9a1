package hostbuild

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"time"
)

// Mirror serves archives on loopback, as a python-build-standalone mirror
// would: GET PATH answers the file put there.
type Mirror struct {
	*httptest.Server
	mu    sync.Mutex
	files map[string]func() ([]byte, error)
	hits  map[string]int
	// redirects answer a path with a 302 to another URL.
	redirects map[string]string
	// Delay, when set, holds every answer that long after its header (a
	// slow mirror, for concurrent first requests).
	Delay time.Duration
}

// NewMirror starts a mirror on 127.0.0.1. Close it when done.
func NewMirror() *Mirror {
	m := &Mirror{files: map[string]func() ([]byte, error){}, hits: map[string]int{}, redirects: map[string]string{}}
	m.Server = httptest.NewServer(http.HandlerFunc(m.serve))
	return m
}

// Put serves the file at path (read when asked for).
func (m *Mirror) Put(path, file string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.files[path] = func() ([]byte, error) { return os.ReadFile(file) }
}

// PutBytes serves data at path.
func (m *Mirror) PutBytes(path string, data []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.files[path] = func() ([]byte, error) { return data, nil }
}

// Redirect answers path with a redirect to url.
func (m *Mirror) Redirect(path, url string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.redirects[path] = url
}

// Hits is how many requests path had.
func (m *Mirror) Hits(path string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.hits[path]
}

func (m *Mirror) serve(w http.ResponseWriter, r *http.Request) {
	m.mu.Lock()
	m.hits[r.URL.Path]++
	get := m.files[r.URL.Path]
	delay := m.Delay
	to := m.redirects[r.URL.Path]
	m.mu.Unlock()
	if to != "" {
		http.Redirect(w, r, to, http.StatusFound)
		return
	}
	if get == nil {
		http.NotFound(w, r)
		return
	}
	data, err := get()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if delay > 0 {
		time.Sleep(delay)
	}
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(data))
}
