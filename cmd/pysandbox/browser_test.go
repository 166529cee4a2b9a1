package main

import (
	"context"
	"flag"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/testutil"
)

var update = flag.Bool("update", false, "refresh docs/console.md's screenshots of the console (docs/console/)")

// chromium finds Debian's Chromium (apt-get install chromium; the test
// script installs it).
func chromium(t *testing.T) string {
	for _, p := range []string{"/usr/bin/chromium", "/usr/bin/chromium-browser"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("chromium"); err == nil {
		return p
	}
	// scripts/test.sh installs it; a machine without a browser cannot run
	// this test.
	t.Skip("no chromium here (apt-get install chromium; scripts/test.sh does)")
	return ""
}

// TestConsoleInBrowser: a real browser (headless Chromium, over the
// DevTools protocol) signs in, watches an agent's hostile run appear
// live (markup, a terminal escape, an RTL override and a 1 MB line, all
// shown as inert text that does not widen the page), kills it, approves a
// call a real MCP client waits on, finds both in the audit browser, opens
// a record and the policy page, and takes screenshots at desktop and
// phone widths ($PYSANDBOX_ARTIFACTS, else the test's temporary
// directory; `go test -run TestConsoleInBrowser -update` refreshes the
// ones docs/console.md shows, docs/console/).
func TestConsoleInBrowser(t *testing.T) {
	started := time.Now().UTC()
	browser := chromium(t)
	dir := t.TempDir()
	artifacts := os.Getenv("PYSANDBOX_ARTIFACTS")
	if artifacts == "" {
		artifacts = filepath.Join(dir, "screenshots")
	}
	os.MkdirAll(artifacts, 0o755)
	agents := filepath.Join(dir, "agents")
	os.WriteFile(agents, []byte("ci-bot ci-bot-0123456789abcdef\n"), 0o600)
	operators := filepath.Join(dir, "operators")
	os.WriteFile(operators, []byte("olga olga-0123456789abcdef00\n"), 0o600)
	pol := filepath.Join(dir, "policy.yaml")
	os.WriteFile(pol, []byte("version: \"1\"\ndefault: allow\ntools:\n  validate_script: {action: approve, by: operator}\n"+
		"  run_python: {action: allow, limits: [{counter: runs, window: hour, max: 50, scope: grant}, {counter: all-runs, window: day, max: 1000}]}\n"+
		"  install_package: {action: approve}\n  upload_file: {action: deny, reason: no uploads here}\n"), 0o600)
	addr := freePort(t)
	base := "http://" + addr
	startServe(t, addr, base, nil, "--auth-token-file", agents, "--console", "--operator-token-file", operators, "--policy", pol,
		"--audit-log", filepath.Join(dir, "audit.log"))

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.Flag("headless", true),
		chromedp.NoSandbox, chromedp.Flag("disable-gpu", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true), chromedp.Flag("disable-quic", true),
		chromedp.UserDataDir(filepath.Join(dir, "profile")), chromedp.WindowSize(1280, 900))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelA()
	bctx, cancelB := chromedp.NewContext(actx)
	defer cancelB()
	bctx, cancelT := context.WithTimeout(bctx, 3*time.Minute)
	defer cancelT()
	shot := func(name string) chromedp.Action[chromedp.Void] {
		return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
			buf, err := chromedp.FullScreenshot(100)(ctx, tg)
			if err != nil {
				return chromedp.Void{}, err
			}
			if *update {
				os.WriteFile(filepath.Join("..", "..", "docs", "console", name+".png"), buf, 0o644)
			}
			return chromedp.Void{}, os.WriteFile(filepath.Join(artifacts, name+".png"), buf, 0o644)
		}
	}
	// fits: at the viewport's width, nothing (a 1 MB line included) makes
	// the page scroll sideways.
	fits := func(what string) {
		t.Helper()
		over, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.documentElement.scrollWidth - window.innerWidth`))
		if err != nil || over > 0 {
			t.Errorf("%s is %d px wider than the window (%v)", what, over, err)
		}
	}
	phone := func(name string) {
		t.Helper()
		if err := chromedp.Do(bctx, chromedp.EmulateViewport(390, 844), chromedp.Sleep(300*time.Millisecond), shot(name)); err != nil {
			t.Fatal(err)
		}
		fits(name)
		if err := chromedp.Do(bctx, chromedp.EmulateViewport(1280, 900)); err != nil {
			t.Fatal(err)
		}
	}
	css := func(s string) chromedp.CSS { return chromedp.CSS(s) }

	// Sign in.
	if err := chromedp.Do(bctx,
		chromedp.Navigate(base+"/console"),
		chromedp.EmulateViewport(390, 844),
		chromedp.WaitVisible(css(`#token`)),
		shot("login-phone"),
		chromedp.SendKeys(css(`#token`), "olga-0123456789abcdef00"),
		chromedp.EmulateViewport(1280, 900),
		chromedp.Submit(css(`#token`)),
		chromedp.WaitVisible(css(`#runs`)),
	); err != nil {
		t.Fatalf("sign in: %v", err)
	}

	// An agent's hostile run appears live, as text.
	ctx, cancelCtx := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancelCtx()
	agent, err := mcp.NewClient(&mcp.Implementation{Name: "headless", Version: "1"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: base + "/mcp", HTTPClient: &http.Client{Transport: testutil.Bearer("ci-bot-0123456789abcdef", nil)}},
		&mcp.ClientSessionOptions{ProtocolVersion: "2025-06-18"})
	if err != nil {
		t.Fatal(err)
	}
	defer agent.Close()
	hostile := "# <img src=x onerror=alert(1)><script>alert(2)</script> \u202eevil \x1b[31m" + strings.Repeat("w", 1000000) +
		"\nimport time\nx = bytearray(48 << 20)\nt = time.time()\nwhile time.time() - t < 120: pass\n"
	runDone := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, _ := agent.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": hostile, "timeout_seconds": 60}})
		runDone <- res
	}()
	if err := chromedp.Do(bctx, chromedp.WaitVisible(css(`#runs tr[data-id] button.danger`))); err != nil {
		t.Fatalf("the live run: %v", err)
	}
	// Its memory and CPU so far appear as it runs (cgroups: as root).
	if os.Geteuid() == 0 {
		if _, err := chromedp.Run(bctx, chromedp.Poll[bool](`[...document.querySelectorAll("#runs tr[data-id] td")].some(td => / MiB$/.test(td.textContent) && parseFloat(td.textContent) >= 40)`)); err != nil {
			t.Errorf("the run's memory: %v", err)
		}
	}
	code, err := chromedp.Run(bctx, chromedp.Text(css(`#runs tr[data-id] pre.code`)))
	if err != nil {
		t.Fatal(err)
	}
	images, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll("#runs img").length`))
	if err != nil {
		t.Fatal(err)
	}
	scripts, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.scripts.length`))
	if err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(bctx, shot("live-desktop")); err != nil {
		t.Fatal(err)
	}
	fits("the live view")
	phone("live-phone")
	if !strings.Contains(code, "<img src=x onerror=alert(1)><script>") || images != 0 || scripts != 1 {
		t.Errorf("the code is not shown as text: %q, %d images, %d scripts", code, images, scripts)
	}
	if strings.ContainsAny(code, "\u202e\x1b") || !strings.Contains(code, `\u202eevil \x1b[31m`) {
		t.Errorf("the RTL override or the terminal escape is live: %q", code)
	}
	// Kill it.
	if err := chromedp.Do(bctx, chromedp.Click(css(`#runs tr[data-id] button.danger`)), chromedp.WaitVisible(css(`.notice`))); err != nil {
		t.Fatalf("kill: %v", err)
	}
	select {
	case res := <-runDone:
		if res == nil || !strings.Contains(toolText(res), "stopped by operator olga") {
			t.Errorf("the killed run: %+v", res)
		}
	case <-time.After(time.Minute):
		t.Fatal("the killed run did not end")
	}

	// A headless agent's call waits for an operator; the browser approves.
	valDone := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, _ := agent.CallTool(ctx, &mcp.CallToolParams{Name: "validate_script", Arguments: map[string]any{"code": "x = 1"}})
		valDone <- res
	}()
	if err := chromedp.Do(bctx,
		chromedp.WaitVisible(css(`#pending tr[data-id] form[action$="/approve"] button`)),
		shot("approval-desktop"),
		chromedp.Click(css(`#pending tr[data-id] form[action$="/approve"] button`)),
		chromedp.WaitVisible(css(`.notice`)),
	); err != nil {
		t.Fatalf("approve: %v", err)
	}
	select {
	case res := <-valDone:
		if res == nil || res.IsError {
			t.Errorf("the approved call: %+v", res)
		}
	case <-time.After(time.Minute):
		t.Fatal("the approved call did not end")
	}

	// Code the live view cannot show whole is approved from its review
	// page, which shows all of it.
	long := "# step 1\n" + strings.Repeat("print('step')\n", 8) + "import os  # the last line\n"
	go func() {
		res, _ := agent.CallTool(ctx, &mcp.CallToolParams{Name: "validate_script", Arguments: map[string]any{"code": long}})
		valDone <- res
	}()
	if err := chromedp.Do(bctx,
		chromedp.WaitVisible(css(`#pending tr[data-id] a.button`)),
		chromedp.Click(css(`#pending tr[data-id] a.button`)),
		chromedp.WaitVisible(css(`button.primary`)),
	); err != nil {
		t.Fatalf("review: %v", err)
	}
	reviewed, err := chromedp.Run(bctx, chromedp.Text(css(`pre.highlight`)))
	if err != nil || !strings.Contains(reviewed, "import os  # the last line") {
		t.Errorf("the review page's code: %q %v", reviewed, err)
	}
	if err := chromedp.Do(bctx, shot("review-desktop"), chromedp.Click(css(`button.primary`)), chromedp.WaitVisible(css(`.notice`))); err != nil {
		t.Fatalf("approve from review: %v", err)
	}
	select {
	case res := <-valDone:
		if res == nil || res.IsError {
			t.Errorf("the call approved from its review page: %+v", res)
		}
	case <-time.After(time.Minute):
		t.Fatal("the call approved from its review page did not end")
	}

	// Both in the audit browser.
	if err := chromedp.Do(bctx, chromedp.Navigate(base+"/console/audit?identity=ci-bot"), chromedp.WaitVisible(css(`table.grid`))); err != nil {
		t.Fatalf("audit: %v", err)
	}
	rows, err := chromedp.Run(bctx, chromedp.Text(css(`table.grid tbody`)))
	if err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(bctx, shot("audit-desktop")); err != nil {
		t.Fatal(err)
	}
	fits("the audit browser")
	phone("audit-phone")
	if !strings.Contains(rows, "run_python") || !strings.Contains(rows, "validate_script") || !strings.Contains(rows, "approved") ||
		!strings.Contains(rows, "stopped by operator olga") {
		t.Errorf("the audit browser:\n%.2000s", rows)
	}
	// The killed run's record: its code highlighted (as text), its place
	// in the chain.
	if err := chromedp.Do(bctx, chromedp.Navigate(base+"/console/audit?identity=ci-bot&tool=run_python"), chromedp.Click(css(`table.grid tbody a`)),
		chromedp.WaitVisible(css(`pre.highlight span.com`))); err != nil {
		t.Fatalf("a record: %v", err)
	}
	facts, err := chromedp.Run(bctx, chromedp.Text(css(`dl.facts`)))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(facts, "its hash") || !strings.Contains(facts, "stopped by operator olga") {
		t.Errorf("the record: %s", facts)
	}
	if err := chromedp.Do(bctx, shot("record-desktop")); err != nil {
		t.Fatal(err)
	}
	fits("a record")
	// The policy page, with its counters.
	if err := chromedp.Do(bctx, chromedp.Navigate(base+"/console/policy"), chromedp.WaitVisible(css(`meter`))); err != nil {
		t.Fatalf("policy: %v", err)
	}
	meters, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("meter")].map(m => m.getAttribute("aria-label"))`))
	// The hourly counter counts the one run, unless an hour began since
	// the test started (windows are aligned to the clock).
	hourly := []string{"1 used"}
	if !time.Now().UTC().Truncate(time.Hour).Equal(started.Truncate(time.Hour)) {
		hourly = append(hourly, "0 used")
	}
	if err != nil || len(meters) != 2 || !slices.Contains(hourly, meters[0]) {
		t.Errorf("the policy's counters: %q %v", meters, err)
	}
	if err := chromedp.Do(bctx, shot("policy-desktop")); err != nil {
		t.Fatal(err)
	}
	phone("policy-phone")
	t.Logf("screenshots in %s", artifacts)
}
