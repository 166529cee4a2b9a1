package console

import (
	"context"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"golang.org/x/net/html"

	"github.com/pysandbox/pysandbox/internal/activity"
	"github.com/pysandbox/pysandbox/internal/policy"
)

// hostileValue is what an agent may put in any value it names (a
// session_id, a tool's name) or, over a connection without tokens, its
// identity: quotes to leave an attribute, markup, an entity, a script
// URL, path segments, a query and a fragment to send a form elsewhere,
// whitespace, control and bidi characters.
const hostileValue = "x\" onmouseover=\"alert(1)' <b>bold</b> &amp; javascript:alert(2) ../../runs/c0/kill?csrf=1#frag \n\r\t \u202egnp.exe\u202c \u2066iso\u2069 /console/logout"

// TestHostileValuesInMarkup: agent-supplied values in the live view and
// the review page (identities, tools, session ids, and ids of every kind)
// stay text: no element or attribute comes from them, no control or bidi
// character reaches the page, and every form's action and link stays the
// console's own route for the row it is in, with the value one path
// segment (html/template escapes quotes and markup in a URL, but would
// leave '/', '?', '#' and ".." to send a Close button to another action).
func TestHostileValuesInMarkup(t *testing.T) {
	f, want := hostileConsole(t)
	b := newBrowser(t, f.srv.URL)
	b.signIn("olga-0123456789abcdef00")
	_, live := b.do("GET", "/console", "", nil)
	forms := checkMarkup(t, "the live view", live)
	sameForms(t, "the live view", forms, want)
	if !strings.Contains(live, `href="/console/approvals/p2">Review to approve`) {
		t.Error("no review link for the hostile waiting call")
	}

	// The review page of each waiting call, reached through its link.
	for _, id := range []string{"../runs/ra/kill?x#", "p2"} {
		resp, page := b.do("GET", "/console/approvals/"+seg(id), "", nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("the review page of %q: %d", id, resp.StatusCode)
		}
		forms := checkMarkup(t, "the review page of "+id, page)
		for _, verdict := range []string{"approve", "decline"} {
			if !forms["/console/approvals/"+id+"/"+verdict] {
				t.Errorf("the review page of %q: no %s form in %v", id, verdict, forms)
			}
		}
	}
}

// hostileConsole is a console whose live view lists runs, a finished
// call and waiting calls whose identities, tools, session ids and ids are
// hostile, and the paths (unescaped, as the router reads them) of the
// forms the live view must offer for them: each the route of its row.
func hostileConsole(t *testing.T) (fixture, map[string]bool) {
	f := testConsole(t, policy.AllowAll())
	sessions := []string{hostileValue, "..", ".", "../../logout", "javascript:alert(1)", "a b\nc", "s-1.%2e%2E/x", "#", "?q", "\u202e"}
	want := map[string]bool{}
	for i, s := range sessions {
		id := "r" + string(rune('a'+i))
		_, end := f.act.Begin(context.Background(), activity.Call{ID: id, Identity: hostileValue, Tool: hostileValue, Session: s, Code: "print(1)"})
		t.Cleanup(end)
		want["/console/runs/"+id+"/kill"] = true
		want["/console/sessions/"+inertLine(s)+"/close"] = true
	}
	// A session id of dots alone cannot be a path segment: its button
	// names no session rather than climbing the path.
	delete(want, "/console/sessions/../close")
	delete(want, "/console/sessions/./close")
	want["/console/sessions/-/close"] = true
	// Run ids are the server's own, but are one segment all the same.
	_, end := f.act.Begin(context.Background(), activity.Call{ID: "../sessions/" + hostileValue, Identity: "alice", Tool: "run_python"})
	t.Cleanup(end)
	want["/console/runs/"+inertLine("../sessions/"+hostileValue)+"/kill"] = true
	f.act.Finish(activity.Done{ID: "d1", Identity: hostileValue, Tool: hostileValue, Decision: "allow", Status: "ok"})
	// Two waiting calls: one plain enough to approve from the live view
	// (its forms carry its id), one with a hostile identity and tool.
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	for _, a := range []activity.Approval{
		{ID: "../runs/ra/kill?x#", Identity: "alice", Tool: "run_python", Facts: "Limits: timeout 30s", Code: "print(1)", Digest: "abc"},
		{ID: "p2", Identity: hostileValue, Tool: hostileValue, Facts: hostileValue, Code: hostileValue, Digest: "def"},
	} {
		go f.act.Await(ctx, a)
	}
	for deadline := time.Now().Add(time.Minute); len(f.act.Pending()) < 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the calls never waited")
		}
	}
	want["/console/approvals/../runs/ra/kill?x#/approve"] = true
	want["/console/approvals/../runs/ra/kill?x#/decline"] = true
	want["/console/approvals/p2/decline"] = true
	want["/console/logout"] = true
	return f, want
}

func sameForms(t *testing.T, name string, forms, want map[string]bool) {
	t.Helper()
	for action := range want {
		if !forms[action] {
			t.Errorf("%s has no form posting to %q", name, action)
		}
	}
	for action := range forms {
		if !want[action] {
			t.Errorf("%s has a form posting to %q", name, action)
		}
	}
}

// TestHostileValuesInBrowser: the live view as the operator sees it,
// redrawn by its script from the event stream, in a real browser
// (headless Chromium): every form's action, as the browser resolves it,
// is its row's route, and no hostile value became an element or an
// attribute.
func TestHostileValuesInBrowser(t *testing.T) {
	browser := chromiumPath(t)
	f, want := hostileConsole(t)
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.Flag("headless", true),
		chromedp.NoSandbox, chromedp.Flag("disable-gpu", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(filepath.Join(t.TempDir(), "profile")))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelA()
	bctx, cancelB := chromedp.NewContext(actx)
	defer cancelB()
	bctx, cancelT := context.WithTimeout(bctx, 3*time.Minute) // guards a hang only
	defer cancelT()
	if err := chromedp.Do(bctx,
		chromedp.Navigate(f.srv.URL+"/console"),
		chromedp.WaitVisible(chromedp.CSS(`#token`)),
		chromedp.SendKeys(chromedp.CSS(`#token`), "olga-0123456789abcdef00"),
		chromedp.Submit(chromedp.CSS(`#token`)),
		chromedp.WaitVisible(chromedp.CSS(`#runs`)),
	); err != nil {
		t.Fatalf("sign in: %v", err)
	}
	// Until the script has drawn the pushed state.
	if _, err := chromedp.Run(bctx, chromedp.Poll[bool](`document.getElementById("live-state").textContent.startsWith("updated")`)); err != nil {
		t.Fatalf("the live view never drew the pushed state: %v", err)
	}
	actions, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](`[...document.forms].map(f => f.action)`))
	if err != nil {
		t.Fatal(err)
	}
	forms := map[string]bool{}
	for _, a := range actions {
		u, err := url.Parse(a)
		if err != nil || u.Host != strings.TrimPrefix(f.srv.URL, "http://") || u.RawQuery != "" || u.Fragment != "" || !pathRoute.MatchString(u.EscapedPath()) {
			t.Errorf("a form posts to %q", a)
			continue
		}
		forms[u.Path] = true
	}
	sameForms(t, "the drawn live view", forms, want)
	links, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](`[...document.links].map(a => a.href)`))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(links, f.srv.URL+"/console/approvals/p2") {
		t.Errorf("no review link for the hostile waiting call in %q", links)
	}
	for _, l := range links {
		if u, err := url.Parse(l); err != nil || u.Host != strings.TrimPrefix(f.srv.URL, "http://") || !pathRoute.MatchString(u.EscapedPath()) {
			t.Errorf("a link to %q", l)
		}
	}
	// Nothing an agent wrote became an element or an attribute.
	bad, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("*")].flatMap(e =>
		["B", "IMG", "IFRAME", "OBJECT", "EMBED"].includes(e.tagName) ? [e.tagName] : [...e.attributes].filter(a => a.name.startsWith("on")).map(a => e.tagName + " " + a.name))`))
	if err != nil || len(bad) > 0 {
		t.Errorf("elements or attributes from hostile text: %v %v", bad, err)
	}
	text, err := chromedp.Run(bctx, chromedp.Evaluate[string](`document.getElementById("runs").textContent`))
	if err != nil || !strings.Contains(text, `\u202egnp.exe`) || strings.ContainsRune(text, '\u202e') || !strings.Contains(text, "<b>bold</b>") {
		t.Errorf("the runs as drawn: %v %.300q", err, text)
	}
}

// chromiumPath finds Debian's Chromium; a machine without a browser
// cannot run the browser test (scripts/test.sh installs it).
func chromiumPath(t *testing.T) string {
	for _, p := range []string{"/usr/bin/chromium", "/usr/bin/chromium-browser"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("chromium"); err == nil {
		return p
	}
	t.Skip("no chromium here (apt-get install chromium)")
	return ""
}

// pathRoute is what a console URL in the page may be: one of its own
// routes, each id one segment.
var pathRoute = regexp.MustCompile(`^/console(/|/login|/logout|/audit|/policy|/assets/console\.(js|css)|/runs/[^/]+/kill|/sessions/[^/]+/close|/approvals/[^/]+(/approve|/decline)?)?$`)

// checkMarkup parses a page as a browser would and checks that no
// hostile value became markup: only the elements and attributes the
// templates write, no control or bidi character in text or attributes,
// and every URL one of the console's routes. It returns the form actions,
// their ids unescaped as the server's router reads them.
func checkMarkup(t *testing.T, name, page string) map[string]bool {
	t.Helper()
	doc, err := html.Parse(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	elements := map[string]bool{"html": true, "head": true, "body": true, "meta": true, "title": true, "link": true, "script": true, "header": true,
		"nav": true, "main": true, "section": true, "h1": true, "h2": true, "h3": true, "span": true, "strong": true, "small": true, "a": true,
		"form": true, "input": true, "button": true, "table": true, "thead": true, "tbody": true, "tr": true, "th": true, "td": true, "pre": true,
		"p": true, "code": true, "br": true, "div": true, "label": true}
	attrs := map[string]bool{"lang": true, "charset": true, "name": true, "content": true, "rel": true, "href": true, "src": true, "class": true,
		"aria-label": true, "aria-labelledby": true, "aria-live": true, "method": true, "action": true, "type": true, "value": true, "id": true,
		"data-id": true, "data-csrf": true, "colspan": true, "role": true, "data-lang": true}
	forms := map[string]bool{}
	var walk func(n *html.Node)
	walk = func(n *html.Node) {
		switch n.Type {
		case html.TextNode:
			if bad := unsafeChar(n.Data, true); bad != "" {
				t.Errorf("%s: text holds %s: %q", name, bad, n.Data)
			}
		case html.ElementNode:
			if !elements[n.Data] {
				t.Errorf("%s: an element <%s> no template writes", name, n.Data)
			}
			for _, a := range n.Attr {
				if !attrs[a.Key] {
					t.Errorf("%s: <%s> has an attribute %q no template writes", name, n.Data, a.Key)
				}
				if bad := unsafeChar(a.Val, false); bad != "" {
					t.Errorf("%s: <%s %s> holds %s: %q", name, n.Data, a.Key, bad, a.Val)
				}
				if a.Key != "href" && a.Key != "action" && a.Key != "src" {
					continue
				}
				u, err := url.Parse(a.Val)
				if err != nil || u.Scheme != "" || u.Host != "" || u.Opaque != "" || u.RawQuery != "" || u.Fragment != "" ||
					strings.Contains(a.Val, "#") || !pathRoute.MatchString(u.EscapedPath()) {
					t.Errorf("%s: <%s %s=%q> is not one of the console's routes", name, n.Data, a.Key, a.Val)
					continue
				}
				// Browsers read "%2e" as "." when they resolve dot segments.
				for _, s := range strings.Split(strings.ToLower(u.EscapedPath()), "/") {
					if s = strings.ReplaceAll(s, "%2e", "."); s == "." || s == ".." {
						t.Errorf("%s: <%s %s=%q> has a dot segment", name, n.Data, a.Key, a.Val)
					}
				}
				if n.Data == "form" {
					forms[u.Path] = true
				}
			}
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(doc)
	if len(forms) == 0 {
		t.Errorf("%s: no form", name)
	}
	return forms
}

// unsafeChar names the first control or bidi character of s (line
// breaks and tabs allowed in text, where the templates and code have
// them).
func unsafeChar(s string, text bool) string {
	for _, r := range s {
		switch {
		case text && (r == '\n' || r == '\t'):
		case r < 0x20 || r == 0x7f:
			return "a control character"
		case r >= 0x200e && r <= 0x200f, r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
			return "a bidi character"
		}
	}
	return ""
}

// TestSeg: a value becomes one path segment that the router reads back
// as the value, whatever it holds; a value of dots alone becomes "-".
func TestSeg(t *testing.T) {
	for _, s := range []string{hostileValue, "s-0123abcd", "a/b", "a?b", "a#b", "a%2Fb", "a.b", "...x", "é", "\u202e", "a b", "\x00"} {
		got := seg(s)
		if !regexp.MustCompile(`^([A-Za-z0-9_-]|%[0-9A-F]{2})+$`).MatchString(got) {
			t.Errorf("seg(%q) = %q", s, got)
		}
		if back, err := url.PathUnescape(got); err != nil || back != s {
			t.Errorf("seg(%q) = %q reads back as %q, %v", s, got, back, err)
		}
	}
	for _, s := range []string{"", ".", "..", "...."} {
		if got := seg(s); got != "-" {
			t.Errorf("seg(%q) = %q, want -", s, got)
		}
	}
}
