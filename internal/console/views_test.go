package console

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/activity"
	"github.com/pysandbox/pysandbox/internal/audit"
	"github.com/pysandbox/pysandbox/internal/policy"
)

// hostile is code an agent might send to fool an operator: markup, a
// terminal escape, an RTL override and a 1 MB line.
var hostile = "# <script>alert(1)</script><img src=x onerror=alert(2)> \u202eevil\u202c \x1b[2J\x1b[31mred\r\n" + strings.Repeat("A", 1<<20) + "\nimport time\n"

func TestLiveViewIsInert(t *testing.T) {
	f := testConsole(t, policy.AllowAll())
	srv, act := f.srv, f.act
	b := newBrowser(t, srv.URL)
	b.signIn("olga-0123456789abcdef00")
	_, end := act.Begin(context.Background(), activity.Call{ID: "c1", Identity: "<b>mallory</b>\u202e", Tool: "run_python", Code: hostile})
	defer end()
	act.SetProbe("c1", func() (time.Duration, int64) { return 1500 * time.Millisecond, 42 << 20 })
	act.Finish(activity.Done{ID: "c0", Identity: "<i>x</i>", Tool: "run_python", Decision: "allow", Status: "ok"})

	_, page := b.do("GET", "/console", "", nil)
	for _, bad := range []string{"<script>alert", "<img src", "<b>mallory", "\u202e", "\x1b", "<i>x"} {
		if strings.Contains(page, bad) {
			t.Errorf("the live page contains %q", bad)
		}
	}
	for _, want := range []string{"&lt;script&gt;alert(1)", `\u202eevil`, `\x1b[2J`, "1.5 s", "42.0 MiB"} {
		if !strings.Contains(page, want) {
			t.Errorf("the live page lacks %q", want)
		}
	}
	if len(page) > 64<<10 {
		t.Errorf("a 1 MB line made the page %d bytes (the code is shown by its first lines)", len(page))
	}

	// The live stream carries the same, as JSON the page sets as text.
	req, _ := http.NewRequest("GET", srv.URL+"/console/events", nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := b.hc.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("events: %q", ct)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	var st State
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			if err := json.Unmarshal([]byte(data), &st); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	if len(st.Running) != 1 || !strings.Contains(st.Running[0].Code, `\u202eevil`) || strings.ContainsAny(st.Running[0].Identity, "\u202e") ||
		st.Running[0].CPUMS != 1500 || !st.Running[0].HasUsage || len(st.Recent) != 1 {
		t.Errorf("the pushed state: %+v", st)
	}
}

func TestAuditBrowser(t *testing.T) {
	f := testConsole(t, policy.AllowAll())
	srv := f.srv
	args, _ := json.Marshal(map[string]string{"code": hostile})
	if err := f.log.Append(&audit.Record{Event: "call", Identity: "mallory", Tool: "run_python", Decision: "allow", Status: "ok", Arguments: args}); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, srv.URL)
	csrf := b.signIn("olga-0123456789abcdef00")
	_, hits := b.do("GET", "/console/audit?q=onerror&tool=run_python", "", nil)
	if !strings.Contains(hits, "1 matching records") || strings.Contains(hits, "<img") || strings.Contains(hits, "\u202e") || len(hits) > 64<<10 {
		t.Errorf("the search for hostile code (%d bytes):\n%.3000s", len(hits), hits)
	}
	m := regexp.MustCompile(`href="/console/audit/(\d+)"`).FindStringSubmatch(hits)
	if m == nil {
		t.Fatal("no record link")
	}
	_, rec := b.do("GET", "/console/audit/"+m[1], "", nil)
	if strings.Contains(rec, "<script>alert") || strings.Contains(rec, "\u202e") || strings.Contains(rec, "\x1b") ||
		!strings.Contains(rec, `\u202eevil`) || !strings.Contains(rec, "longer (") || len(rec) > 512<<10 {
		t.Errorf("the hostile record's page (%d bytes) is not inert or not bounded", len(rec))
	}
	_, list := b.do("GET", "/console/audit?identity=operator", "", nil)
	if !strings.Contains(list, "1 matching records") || !strings.Contains(list, "operator:olga") {
		t.Errorf("the audit list:\n%s", list)
	}
	seq := regexp.MustCompile(`href="/console/audit/(\d+)"`).FindStringSubmatch(list)
	if seq == nil {
		t.Fatalf("no record link:\n%s", list)
	}
	_, rec = b.do("GET", "/console/audit/"+seq[1], "", nil)
	if !strings.Contains(rec, "operator:olga") || !strings.Contains(rec, "its hash") {
		t.Errorf("the record page:\n%s", rec)
	}
	if resp, _ := b.do("GET", "/console/audit/99999", "", nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("a missing record: %d", resp.StatusCode)
	}
	resp, body := b.do("GET", "/console/audit.jsonl?seq="+seq[1], "", nil)
	if resp.Header.Get("Content-Type") != "application/x-ndjson" || strings.Count(body, "\n") != 1 {
		t.Errorf("the download of one record: %q", body)
	}
	if resp, _ := b.do("POST", "/console/audit/verify", srv.URL, url.Values{"csrf": {csrf}}); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("verify: %d", resp.StatusCode)
	}
	_, page := b.do("GET", "/console/audit", "", nil)
	if !strings.Contains(page, "the chain verifies") {
		t.Errorf("verify's notice:\n%s", page)
	}
}

func TestFilter(t *testing.T) {
	at := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	args, _ := json.Marshal(map[string]string{"code": "import Requests"})
	r := &audit.Record{Seq: 7, Time: at, Identity: "Alice", Tool: "run_python", Decision: "allow", Arguments: args}
	for _, tc := range []struct {
		query string
		want  bool
	}{
		{"", true},
		{"identity=alice", true},
		{"identity=bob", false},
		{"tool=run_python&decision=allow", true},
		{"decision=deny", false},
		{"q=requests", true},
		{"q=numpy", false},
		{"since=2026-11-25T09:59", true},
		{"since=2026-11-25T10:01", false},
		{"until=2026-11-25", false},
		{"seq=7", true},
		{"seq=8", false},
	} {
		req, _ := http.NewRequest("GET", "/console/audit?"+tc.query, nil)
		if got := parseFilter(req).match(r); got != tc.want {
			t.Errorf("%q: %v, want %v", tc.query, got, tc.want)
		}
	}
}

func TestPolicyCounters(t *testing.T) {
	pol, err := policy.Parse([]byte(`{"version":"1","default":"deny","tools":{
		"run_python":{"action":"allow","limits":[{"counter":"runs","window":"hour","max":4,"scope":"grant"}]},
		"install_packages":{"action":"approve","by":"operator","limits":[{"counter":"installs","window":"day","max":10}]}}}`), "test.json", []string{"run_python", "install_packages"})
	if err != nil {
		t.Fatal(err)
	}
	f := testConsole(t, pol)
	srv, act, lim := f.srv, f.act, f.lim
	for i := 0; i < 3; i++ {
		lim.Take(pol.Tools["run_python"].Limits, "alice")
	}
	lim.Take(pol.Tools["run_python"].Limits, "<b>bob</b>")
	lim.Take(pol.Tools["install_packages"].Limits, "alice")
	act.Finish(activity.Done{Identity: "alice", Tool: "run_python", Decision: "allow"})
	act.Finish(activity.Done{Identity: "<b>bob</b>", Tool: "run_python", Decision: "allow"})
	b := newBrowser(t, srv.URL)
	b.signIn("olga-0123456789abcdef00")
	_, page := b.do("GET", "/console/policy", "", nil)
	for _, re := range []string{
		`alice</span>\s*<meter min="0" max="4" value="3"`,
		`&lt;b&gt;bob&lt;/b&gt;</span>\s*<meter min="0" max="4" value="1"`,
		`everyone</span>\s*<meter min="0" max="10" value="1"`,
		`by operator`,
		pol.SHA256,
	} {
		if !regexp.MustCompile(re).MatchString(page) {
			t.Errorf("the policy page lacks %s:\n%s", re, page)
		}
	}
}

// TestApprovalReview: a call whose code the live view cannot show whole
// (long, or with non-ASCII letters) is approved only from its review
// page, which shows all of it; an approval names the digest of the
// arguments reviewed, and one of other arguments is refused.
func TestApprovalReview(t *testing.T) {
	f := testConsole(t, policy.AllowAll())
	b := newBrowser(t, f.srv.URL)
	csrf := b.signIn("olga-0123456789abcdef00")
	code := "# harmless\n" + strings.Repeat("print('hello')\n", 8) + "import os; os.system('evil')\nеval = print\n" // Cyrillic е
	done := make(chan bool, 1)
	go func() {
		ok, _, _ := f.act.Await(context.Background(), activity.Approval{ID: "c-1", Identity: "mallory", Tool: "run_python", Facts: "Limits: timeout 30s",
			Code: code, Digest: "abc123"})
		done <- ok
	}()
	for len(f.act.Pending()) == 0 {
		time.Sleep(time.Millisecond)
	}
	_, live := b.do("GET", "/console", "", nil)
	live = html.UnescapeString(live)
	if strings.Contains(live, `action="/console/approvals/c-1/approve"`) || !strings.Contains(live, `href="/console/approvals/c-1">Review to approve`) ||
		!strings.Contains(live, "U+0435 е") {
		t.Errorf("the live view offers to approve code it does not show whole:\n%s", live)
	}
	_, review := b.do("GET", "/console/approvals/c-1", "", nil)
	review = html.UnescapeString(review)
	if !strings.Contains(review, "os.system('evil')") || !strings.Contains(review, `name="digest" value="abc123"`) || !strings.Contains(review, "U+0435 е") {
		t.Errorf("the review page:\n%s", review)
	}
	if resp, _ := b.do("POST", "/console/approvals/c-1/approve", f.srv.URL, url.Values{"csrf": {csrf}, "digest": {"stale"}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatal(resp.Status)
	}
	if _, page := b.do("GET", "/console", "", nil); !strings.Contains(page, "not the one shown") || len(f.act.Pending()) != 1 {
		t.Errorf("an approval of other arguments was taken")
	}
	b.do("POST", "/console/approvals/c-1/approve", f.srv.URL, url.Values{"csrf": {csrf}, "digest": {"abc123"}})
	if !<-done {
		t.Error("the reviewed approval did not approve")
	}
	if resp, _ := b.do("GET", "/console/approvals/c-1", "", nil); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("a decided call's review page: %d", resp.StatusCode)
	}
	data, _ := os.ReadFile(f.logPath)
	if !strings.Contains(string(data), "arguments sha256:abc123") {
		t.Errorf("the operator's approval does not name the arguments:\n%s", data)
	}
}

// TestLiveViewBounds: however many calls are in flight, the live view
// lists MaxListed and counts them all.
func TestLiveViewBounds(t *testing.T) {
	f := testConsole(t, policy.AllowAll())
	for i := 0; i < MaxListed+50; i++ {
		_, end := f.act.Begin(context.Background(), activity.Call{ID: fmt.Sprint("c", i), Identity: "flood", Tool: "run_python", Code: strings.Repeat("x", 10000)})
		defer end()
	}
	b := newBrowser(t, f.srv.URL)
	b.signIn("olga-0123456789abcdef00")
	_, body := b.do("GET", "/console/state", "", nil)
	var st State
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Running) != MaxListed || st.RunningTotal != MaxListed+50 || len(body) > 200<<10 {
		t.Errorf("%d listed of %d, %d bytes", len(st.Running), st.RunningTotal, len(body))
	}
	if resp, _ := b.do("GET", "/console/assets/", "", nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("the assets' directory listing: %d", resp.StatusCode)
	}
}

// TestAuditProblems: an edited record is flagged in the list, not just
// missing from it, and the download link keeps the filters.
func TestAuditProblems(t *testing.T) {
	f := testConsole(t, policy.AllowAll())
	for _, who := range []string{"alice", "bob", "alice"} {
		f.log.Append(&audit.Record{Event: "call", Identity: who, Tool: "run_python", Decision: "allow"})
	}
	data, _ := os.ReadFile(f.logPath)
	os.WriteFile(f.logPath, []byte(strings.Replace(string(data), `"identity":"bob"`, `"identity":"eve"`, 1)), 0o600)
	b := newBrowser(t, f.srv.URL)
	b.signIn("olga-0123456789abcdef00")
	_, page := b.do("GET", "/console/audit?identity=alice&decision=allow", "", nil)
	if !strings.Contains(page, "1 line(s) that are not intact") || !strings.Contains(page, "record edited") || !strings.Contains(page, "2 matching records") {
		t.Errorf("the list of a tampered log:\n%s", page)
	}
	link := regexp.MustCompile(`href="(/console/audit\.jsonl\?[^"]*)"`).FindStringSubmatch(page)
	if link == nil {
		t.Fatal("no download link")
	}
	_, jsonl := b.do("GET", html.UnescapeString(link[1]), "", nil)
	if n := strings.Count(jsonl, "\n"); n != 2 || strings.Contains(jsonl, "operator:olga") {
		t.Errorf("the download of the filtered records (%s): %d records\n%s", link[1], n, jsonl)
	}
}

// TestInline: a waiting call may be approved from the live view only when
// the live view shows all of it, plainly.
func TestInline(t *testing.T) {
	plain := activity.Approval{Code: "print(1)", Facts: "Limits: 30s"}
	for _, tc := range []struct {
		name string
		a    activity.Approval
		want bool
	}{
		{"plain", plain, true},
		{"long code", activity.Approval{Code: "x", CodeCut: true}, false},
		{"inputs", activity.Approval{Code: "run(cmd)", DetailBytes: 20}, false},
		{"a carriage return", activity.Approval{Code: "# comment\rimport os"}, false},
		{"a form feed", activity.Approval{Code: "if 0:\n    \x0cprint(1)"}, false},
		{"a variation selector", activity.Approval{Code: "eval\ufe00 = print"}, false},
		{"a Cyrillic letter", activity.Approval{Code: "еval = print"}, false},
		{"a non-ASCII fact", activity.Approval{Code: "print(1)", Facts: "Session: ѕ-1"}, false},
	} {
		a := tc.a
		if got := pendingView(a, scanText(a.Code, a.Facts, a.Detail), 16).Inline; got != tc.want {
			t.Errorf("%s: inline %v, want %v", tc.name, got, tc.want)
		}
	}
	// The look-alike letter leads the list, whatever else there is.
	if got := nonASCII("àáâãäåæçèéêëìíîïð"+"е", 4); len(got) != 5 || got[0] != "U+0435 е" {
		t.Errorf("nonASCII: %q", got)
	}
}
