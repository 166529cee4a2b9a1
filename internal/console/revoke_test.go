package console

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/activity"
	"github.com/pysandbox/pysandbox/internal/httpserver"
	"github.com/pysandbox/pysandbox/internal/policy"
)

// TestOperatorRevoked: once an operator's token is removed from the file
// and the file reloaded, their signed-in session ends at once: the page
// sends them to sign in, an action with the session's own CSRF token is
// refused, the event stream they hold open ends, and the token no longer
// signs in. So does a session made with a token since replaced (the name
// kept). Other operators' sessions go on.
func TestOperatorRevoked(t *testing.T) {
	dir := t.TempDir()
	ops := filepath.Join(dir, "operators")
	write := func(s string) {
		if err := os.WriteFile(ops, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	const olgaToken, oscarToken, oscarNew = "olga-0123456789abcdef00", "oscar-0123456789abcdef0", "oscar-fedcba9876543210ff"
	write("olga " + olgaToken + "\noscar " + oscarToken + "\notto otto-0123456789abcdef00\n")
	keys, _, err := httpserver.OpenKeyring(httpserver.TokenFiles{Operators: ops})
	if err != nil {
		t.Fatal(err)
	}
	act := activity.New()
	c, err := New(Config{Operators: keys.Operators, Activity: act, Policy: func() *policy.Policy { return policy.AllowAll() }, Limiter: policy.NewLimiter(nil)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c.Handler())
	defer srv.Close()

	olga, oscar, otto := newBrowser(t, srv.URL), newBrowser(t, srv.URL), newBrowser(t, srv.URL)
	olgaCSRF := olga.signIn(olgaToken)
	oscar.signIn(oscarToken)
	otto.signIn("otto-0123456789abcdef00")

	// Olga keeps the live view's event stream open.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // guards a hang only
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/console/events", nil)
	resp, err := olga.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	events := bufio.NewScanner(resp.Body)
	events.Buffer(nil, 1<<20)
	if !events.Scan() || !strings.HasPrefix(events.Text(), "event: state") {
		t.Fatalf("the event stream: %q %v", events.Text(), events.Err())
	}
	_, end := act.Begin(context.Background(), activity.Call{ID: "c1", Identity: "alice", Tool: "run_python", Code: "while True: pass"})
	defer end()

	// Olga removed, oscar's token replaced, otto kept.
	write("oscar " + oscarNew + "\notto otto-0123456789abcdef00\n")
	if _, err := keys.Reload(); err != nil {
		t.Fatal(err)
	}
	for _, b := range []*browser{olga, oscar} {
		if resp, _ := b.do("GET", "/console", "", nil); resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/console/login" {
			t.Errorf("a revoked operator's page: %d %s", resp.StatusCode, resp.Header.Get("Location"))
		}
		if resp, _ := b.do("GET", "/console/state", "", nil); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("a revoked operator's state: %d", resp.StatusCode)
		}
	}
	if resp, _ := olga.do("POST", "/console/runs/c1/kill", srv.URL, url.Values{"csrf": {olgaCSRF}}); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("a revoked operator's kill: %d", resp.StatusCode)
	}
	if len(act.Running()) != 1 {
		t.Error("a revoked operator killed a run")
	}
	// The stream ends (within its one-second tick): read it to its end.
	for events.Scan() {
	}
	if ctx.Err() != nil {
		t.Error("the revoked operator's event stream did not end")
	}
	if resp, _ := olga.do("POST", "/console/login", srv.URL, url.Values{"token": {olgaToken}}); !strings.Contains(resp.Header.Get("Location"), "error") {
		t.Errorf("a removed token signed in: %s", resp.Header.Get("Location"))
	}
	if resp, _ := otto.do("GET", "/console", "", nil); resp.StatusCode != http.StatusOK {
		t.Errorf("a kept operator's session: %d", resp.StatusCode)
	}
	oscar.signIn(oscarNew)
	if resp, _ := oscar.do("GET", "/console", "", nil); resp.StatusCode != http.StatusOK {
		t.Errorf("oscar with the new token: %d", resp.StatusCode)
	}

	// A reload that fails keeps every session and token as they were.
	write("oscar " + oscarNew + "\notto\n")
	if _, err := keys.Reload(); err == nil {
		t.Fatal("a broken file reloaded")
	}
	for _, b := range []*browser{oscar, otto} {
		if resp, _ := b.do("GET", "/console", "", nil); resp.StatusCode != http.StatusOK {
			t.Errorf("after a failed reload: %d", resp.StatusCode)
		}
	}
}

// TestSignOutEndsEventStream: signing out ends the stream the session
// opened, as a revocation does.
func TestSignOutEndsEventStream(t *testing.T) {
	f := testConsole(t, policy.AllowAll())
	b := newBrowser(t, f.srv.URL)
	csrf := b.signIn("olga-0123456789abcdef00")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // guards a hang only
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", f.srv.URL+"/console/events", nil)
	resp, err := b.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	events := bufio.NewScanner(resp.Body)
	events.Buffer(nil, 1<<20)
	if !events.Scan() {
		t.Fatal(events.Err())
	}
	b.do("POST", "/console/logout", f.srv.URL, url.Values{"csrf": {csrf}})
	for events.Scan() {
	}
	if ctx.Err() != nil {
		t.Error("the signed-out session's event stream did not end")
	}
}
