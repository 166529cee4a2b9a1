package upstream

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// transport makes the server's transport; cmd is its process, for stdio.
func (s *server) transport() (mcp.Transport, *exec.Cmd, error) {
	c := s.cfg
	if c.Command != "" {
		cmd := exec.Command(c.Command, c.Args...)
		env := baseEnv()
		keys := make([]string, 0, len(c.Env))
		for k := range c.Env {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			env = append(env, k+"="+c.Env[k])
		}
		cmd.Env, cmd.Dir = env, c.Cwd
		s.stderr.reset()
		cmd.Stderr = s.stderr
		setProcAttr(cmd)
		return &mcp.CommandTransport{Command: cmd, TerminateDuration: 2 * time.Second}, cmd, nil
	}
	hc := &http.Client{Transport: &headerTransport{headers: c.Headers, base: http.DefaultTransport}}
	if c.Transport == "sse" {
		return &mcp.SSEClientTransport{Endpoint: c.URL, HTTPClient: hc}, nil, nil
	}
	return &mcp.StreamableClientTransport{Endpoint: c.URL, HTTPClient: hc}, nil, nil
}

// headerTransport adds the configured headers to every request.
type headerTransport struct {
	headers map[string]string
	base    http.RoundTripper
}

// MaxHTTPReply bounds a reply of an HTTP upstream that is one JSON
// document: the SDK reads such a reply whole before anything can look at
// its size, and code in a run can ask a benign upstream for a result as
// large as it likes. Event streams are bounded per event by the SDK
// (16 MiB), as stdio is per message.
const MaxHTTPReply = 16 << 20

func (h *headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if len(h.headers) > 0 {
		r = r.Clone(r.Context())
		for k, v := range h.headers {
			r.Header.Set(k, v)
		}
	}
	resp, err := h.base.RoundTrip(r)
	if err == nil && !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		if resp.ContentLength > MaxHTTPReply {
			resp.Body.Close()
			return nil, fmt.Errorf("the upstream's reply is %d bytes, more than the %d this server reads", resp.ContentLength, MaxHTTPReply)
		}
		resp.Body = &boundedBody{ReadCloser: resp.Body, left: MaxHTTPReply}
	}
	return resp, err
}

// boundedBody fails a read past its bound instead of growing without end.
type boundedBody struct {
	io.ReadCloser
	left int64
}

func (b *boundedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		var one [1]byte
		if n, err := b.ReadCloser.Read(one[:]); n == 0 && err == io.EOF {
			return 0, io.EOF
		}
		return 0, fmt.Errorf("the upstream's reply is larger than the %d bytes this server reads", MaxHTTPReply)
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	return n, err
}

// tailWriter keeps the end of a server's stderr, to say why it failed.
type tailWriter struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailWriter) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(p)
	if len(p) > t.max {
		p = p[len(p)-t.max:]
	}
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return n, nil
}

func (t *tailWriter) reset() {
	t.mu.Lock()
	t.b = t.b[:0]
	t.mu.Unlock()
}

// tail is the last lines of what the server wrote to stderr, on one line.
func (t *tailWriter) tail() string {
	t.mu.Lock()
	s := strings.TrimSpace(strings.ToValidUTF8(string(t.b), "?"))
	t.mu.Unlock()
	if s == "" {
		return ""
	}
	lines := strings.Split(s, "\n")
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	s = strings.Join(lines, " | ")
	if len(s) > 500 {
		s = "..." + s[len(s)-500:]
	}
	return s
}

// inheritedEnv are the variables of this server's environment a stdio
// server gets, as MCP clients do (the TypeScript SDK's default
// environment, plus locale, time zone and temporary directory): enough to
// find and run a program, and nothing else. Whatever else it needs, the
// file's "env" gives it, so that a secret meant for one server is not
// handed to every other.
var inheritedEnv = []string{"HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR"}

func baseEnv() []string {
	var env []string
	for _, k := range inheritedEnv {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}
