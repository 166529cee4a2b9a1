package console

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/pysandbox/pysandbox/internal/activity"
	"github.com/pysandbox/pysandbox/internal/audit"
	"github.com/pysandbox/pysandbox/internal/httpserver"
	"github.com/pysandbox/pysandbox/internal/policy"
)

// testConsole serves a console over a real registry, limiter and audit
// log (no engine: the live view shows what the registry holds).
type fixture struct {
	srv     *httptest.Server
	act     *activity.Registry
	lim     *policy.Limiter
	logPath string
	log     *audit.Writer
}

func testConsole(t *testing.T, pol *policy.Policy) fixture {
	t.Helper()
	ops, err := httpserver.ParseTokens([]byte("olga olga-0123456789abcdef00\n"), "operators")
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(t.TempDir(), "audit.log")
	w, err := audit.Open(logPath, audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	act := activity.New()
	lim := policy.NewLimiter(nil)
	c, err := New(Config{Operators: ops, Activity: act, AuditPath: logPath, Audit: w, Policy: func() *policy.Policy { return pol }, Limiter: lim})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c.Handler())
	t.Cleanup(srv.Close)
	return fixture{srv, act, lim, logPath, w}
}

type browser struct {
	t    *testing.T
	base string
	hc   *http.Client
}

func newBrowser(t *testing.T, base string) *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{t, base, &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (b *browser) do(method, path, origin string, form url.Values) (*http.Response, string) {
	b.t.Helper()
	req, _ := http.NewRequest(method, b.base+path, strings.NewReader(form.Encode()))
	if method == "POST" {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	resp, err := b.hc.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(body)
}

var csrfRe = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

func (b *browser) signIn(token string) string {
	b.t.Helper()
	resp, _ := b.do("POST", "/console/login", b.base, url.Values{"token": {token}})
	if loc := resp.Header.Get("Location"); loc != "/console" {
		b.t.Fatalf("sign-in: %d %s", resp.StatusCode, loc)
	}
	_, page := b.do("GET", "/console", "", nil)
	m := csrfRe.FindStringSubmatch(page)
	if m == nil {
		b.t.Fatalf("no CSRF token:\n%s", page)
	}
	return m[1]
}

func TestAuthAndCSRF(t *testing.T) {
	f := testConsole(t, policy.AllowAll())
	srv, act := f.srv, f.act
	b := newBrowser(t, srv.URL)
	if resp, _ := b.do("GET", "/console", "", nil); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("signed out: %d", resp.StatusCode)
	}
	if resp, _ := b.do("GET", "/console/state", "", nil); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("state signed out: %d", resp.StatusCode)
	}
	if resp, _ := b.do("POST", "/console/login", "null", url.Values{"token": {"olga-0123456789abcdef00"}}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("a sign-in from Origin null: %d", resp.StatusCode)
	}
	if resp, _ := b.do("POST", "/console/login", srv.URL, url.Values{"token": {"wrong-0123456789abcdef00"}}); !strings.Contains(resp.Header.Get("Location"), "error") {
		t.Errorf("a wrong token: %s", resp.Header.Get("Location"))
	}
	csrf := b.signIn("olga-0123456789abcdef00")
	resp, _ := b.do("GET", "/console", "", nil)
	for h, want := range map[string]string{"Referrer-Policy": "same-origin", "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff"} {
		if got := resp.Header.Get(h); got != want {
			t.Errorf("%s: %q, want %q", h, got, want)
		}
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") {
		t.Errorf("CSP: %q", csp)
	}

	ctx, end := act.Begin(context.Background(), activity.Call{ID: "c1", Identity: "alice", Tool: "run_python", Code: "while True: pass"})
	defer end()
	kill := "/console/runs/c1/kill"
	for _, tc := range []struct {
		name, origin string
		form         url.Values
	}{
		{"no CSRF token", srv.URL, nil},
		{"a stale CSRF token", srv.URL, url.Values{"csrf": {strings.Repeat("0", 64)}}},
		{"no Origin", "", url.Values{"csrf": {csrf}}},
		{"another origin", "http://evil.example", url.Values{"csrf": {csrf}}},
		{"a look-alike origin", srv.URL + ".evil.example", url.Values{"csrf": {csrf}}},
	} {
		if resp, _ := b.do("POST", kill, tc.origin, tc.form); resp.StatusCode != http.StatusForbidden {
			t.Errorf("a kill with %s: %d", tc.name, resp.StatusCode)
		}
	}
	if ctx.Err() != nil {
		t.Fatal("a refused kill stopped the call")
	}
	b.do("POST", kill, srv.URL, url.Values{"csrf": {csrf}})
	var k *activity.Killed
	if ctx.Err() == nil || !errors.As(context.Cause(ctx), &k) || k.By != "olga" {
		t.Errorf("the kill: %v", context.Cause(ctx))
	}
	// Signed out, the session's cookie and CSRF token are dead.
	b.do("POST", "/console/logout", srv.URL, url.Values{"csrf": {csrf}})
	if resp, _ := b.do("GET", "/console", "", nil); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("after signing out: %d", resp.StatusCode)
	}
}

func TestSameOrigin(t *testing.T) {
	for _, tc := range []struct {
		origin, referer string
		want            bool
	}{
		{"http://h:1", "", true},
		{"https://h:1", "", true},
		{"", "http://h:1/console", true},
		{"null", "http://h:1/console", false},
		{"http://h:1.evil", "", false},
		{"http://evil/h:1", "", false},
		{"ftp://h:1", "", false},
		{"", "", false},
	} {
		r := httptest.NewRequest("POST", "http://h:1/console/login", nil)
		if tc.origin != "" {
			r.Header.Set("Origin", tc.origin)
		}
		if tc.referer != "" {
			r.Header.Set("Referer", tc.referer)
		}
		if got := sameOrigin(r); got != tc.want {
			t.Errorf("sameOrigin(%q, %q) = %v", tc.origin, tc.referer, got)
		}
	}
}

func TestSecsAndCut(t *testing.T) {
	for ms, want := range map[int64]string{0: "0 ms", 999: "999 ms", 1500: "1.5 s", 59999: "60.0 s", 245000: "4m05s"} {
		if got := secs(ms); got != want {
			t.Errorf("secs(%d) = %q, want %q", ms, got, want)
		}
	}
	if got := cut("héllo", 2); got != "h…" {
		t.Errorf("cut inside a character: %q", got)
	}
	if got := cut("abc", 3); got != "abc" {
		t.Errorf("cut of a short string: %q", got)
	}
}
