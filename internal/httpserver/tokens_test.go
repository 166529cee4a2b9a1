package httpserver

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestTokenFileBounds: a file over MaxTokenFileBytes is refused whole,
// naming the line that crosses the bound, instead of being cut (the token
// crossing it would become a shorter token, and the ones after it
// vanish); a file at the bound, and a line longer than a bufio.Scanner
// takes, are read; a malformed line is named.
func TestTokenFileBounds(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "tokens")

	// Comments up to 20 bytes before the bound, then a token line across
	// it (line 3), then one more.
	pad := MaxTokenFileBytes - 20
	comment := "#" + strings.Repeat("x", pad/2-2) + "\n"
	body := comment + "#" + strings.Repeat("y", pad-len(comment)-2) + "\n"
	if len(body) != pad {
		t.Fatalf("padding is %d bytes, want %d", len(body), pad)
	}
	crossing := "bob bob-0123456789abcdef0123456789abcdef"
	writeFile(t, p, body+crossing+"\ncarol carol-0123456789abcdef\n")
	_, err := LoadTokens(p)
	if err == nil || !strings.Contains(err.Error(), p+":3:") || !strings.Contains(err.Error(), "larger than 1 MiB") {
		t.Fatalf("an oversized file: %v", err)
	}
	// The cut the old reader made: the first 20 characters of bob's token
	// would have been a token. Nothing of the file may be.
	if _, _, err := OpenKeyring(TokenFiles{Agents: p}); err == nil || !strings.Contains(err.Error(), "--auth-token-file: ") {
		t.Errorf("a keyring over an oversized file: %v", err)
	}

	// Exactly at the bound: read whole, the last token included.
	last := "carol carol-0123456789abcdef\n"
	atBound := body[:MaxTokenFileBytes-len(last)-1] + "\n" + last
	if len(atBound) != MaxTokenFileBytes {
		t.Fatalf("the file at the bound is %d bytes", len(atBound))
	}
	writeFile(t, p, atBound)
	if tok, err := LoadTokens(p); err != nil || strings.Join(tok.Names(), ",") != "carol" {
		t.Errorf("a file of exactly %d bytes: %v", MaxTokenFileBytes, err)
	}

	// A 100 KiB comment line: beyond bufio.Scanner's 64 KiB, which used to
	// fail the file without naming a line.
	writeFile(t, p, "#"+strings.Repeat("z", 100<<10)+"\nalice "+aliceToken+"\n")
	if tok, err := LoadTokens(p); err != nil || strings.Join(tok.Names(), ",") != "alice" {
		t.Errorf("a long comment line: %v", err)
	}

	// A malformed line is named, and refuses the file whole.
	writeFile(t, p, "alice "+aliceToken+"\n\n# a comment\nbob\ncarol carol-0123456789abcdef\n")
	if _, err := LoadTokens(p); err == nil || !strings.Contains(err.Error(), p+":4: want NAME TOKEN") {
		t.Errorf("a malformed line: %v", err)
	}
	writeFile(t, p, "alice "+aliceToken+"\r\nbob:bob-0123456789abcdef0\r\n")
	if tok, err := LoadTokens(p); err != nil || strings.Join(tok.Names(), ",") != "alice,bob" {
		t.Errorf("CRLF lines: %v", err)
	}
}

// TestKeyring: a token in two roles' files is refused, naming both; a
// reload puts every file's new tokens in force together, a removed or
// renamed token's credential no longer holds, and a reload that fails
// changes nothing.
func TestKeyring(t *testing.T) {
	dir := t.TempDir()
	agents, operators, metrics := filepath.Join(dir, "agents"), filepath.Join(dir, "operators"), filepath.Join(dir, "metrics")
	writeFile(t, agents, "alice "+aliceToken+"\nbob bob-0123456789abcdef0\n")
	writeFile(t, operators, "olga olga-0123456789abcdef00\n")
	writeFile(t, metrics, "prom prom-0123456789abcdef00\n")
	files := TokenFiles{Agents: agents, Operators: operators, Metrics: metrics}

	for _, tc := range []struct {
		file, data, want string
	}{
		{operators, "olga " + aliceToken + "\n", `an agent's ("alice" in ` + agents + `) and an operator's ("olga" in ` + operators + `)`},
		{metrics, "prom " + aliceToken + "\n", `an agent's ("alice" in ` + agents + `) and a metrics scraper's ("prom" in ` + metrics + `)`},
		{metrics, "prom olga-0123456789abcdef00\n", `an operator's ("olga" in ` + operators + `) and a metrics scraper's`},
	} {
		orig, _ := os.ReadFile(tc.file)
		writeFile(t, tc.file, tc.data)
		if _, _, err := OpenKeyring(files); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.data, err, tc.want)
		}
		writeFile(t, tc.file, string(orig))
	}

	k, warnings, err := OpenKeyring(files)
	if err != nil || len(warnings) != 0 {
		t.Fatal(err, warnings)
	}
	ctx := context.Background()
	verify := func(tok *Tokens, token string) string {
		info, err := tok.Verify(ctx, token, nil)
		if err != nil {
			return ""
		}
		return info.UserID
	}
	if verify(k.Agents, aliceToken) != "alice" || verify(k.Operators, "olga-0123456789abcdef00") != "olga" || verify(k.Metrics, "prom-0123456789abcdef00") != "prom" {
		t.Fatal("the keyring does not verify its tokens")
	}
	for _, tc := range []struct {
		tok   *Tokens
		token string
	}{{k.Agents, "olga-0123456789abcdef00"}, {k.Agents, "prom-0123456789abcdef00"}, {k.Operators, aliceToken}, {k.Metrics, aliceToken}} {
		if who := verify(tc.tok, tc.token); who != "" {
			t.Errorf("a token of another role verified as %q", who)
		}
	}
	olga, ok := k.Operators.Find("olga-0123456789abcdef00")
	if !ok || olga.Name != "olga" || !k.Operators.Holds(olga) {
		t.Fatal("olga's credential")
	}

	// Alice and olga removed, a token moved from the agents to the
	// operators: one reload, every role at once.
	writeFile(t, agents, "bob bob-0123456789abcdef0\n")
	writeFile(t, operators, "oscar "+aliceToken+"\n")
	if _, err := k.Reload(); err != nil {
		t.Fatal(err)
	}
	if verify(k.Agents, aliceToken) != "" || verify(k.Operators, aliceToken) != "oscar" || verify(k.Agents, "bob-0123456789abcdef0") != "bob" {
		t.Error("the reload did not put the new tokens in force")
	}
	if k.Operators.Holds(olga) {
		t.Error("a removed operator's credential still holds")
	}
	if got := k.Names(); got["agents"] != "bob" || got["operators"] != "oscar" || got["metrics"] != "prom" {
		t.Errorf("names: %v", got)
	}

	// Renamed: the same token under another name is not the credential
	// signed in under the old one.
	oscar, _ := k.Operators.Find(aliceToken)
	writeFile(t, operators, "oskar "+aliceToken+"\n")
	if _, err := k.Reload(); err != nil || k.Operators.Holds(oscar) {
		t.Errorf("a renamed operator's credential: %v %v", err, k.Operators.Holds(oscar))
	}

	// Failed reloads, of a bad file or of a token in two roles, change
	// nothing.
	writeFile(t, agents, "carol carol-0123456789abcdef\nbob\n")
	if _, err := k.Reload(); err == nil || !strings.Contains(err.Error(), "--auth-token-file: auth token file "+agents+":2:") {
		t.Errorf("a bad file's reload: %v", err)
	}
	writeFile(t, agents, "carol carol-0123456789abcdef\n")
	writeFile(t, metrics, "prom carol-0123456789abcdef\n")
	if _, err := k.Reload(); err == nil || !strings.Contains(err.Error(), "a metrics scraper's") {
		t.Errorf("an overlapping reload: %v", err)
	}
	if verify(k.Agents, "carol-0123456789abcdef") != "" || verify(k.Agents, "bob-0123456789abcdef0") != "bob" || verify(k.Metrics, "prom-0123456789abcdef00") != "prom" {
		t.Error("a failed reload changed the tokens in force")
	}
	// A file made world-writable is refused on reload as at startup.
	writeFile(t, metrics, "prom prom-0123456789abcdef00\n")
	os.Chmod(agents, 0o666)
	if _, err := k.Reload(); err == nil || !strings.Contains(err.Error(), "writable by other users") {
		t.Errorf("a world-writable file's reload: %v", err)
	}
	os.Chmod(agents, 0o644)
	if w, err := k.Reload(); err != nil || len(w) != 1 || !strings.Contains(w[0], "readable by every user") {
		t.Errorf("a world-readable file's reload: %v %v", err, w)
	}
}

// TestMetricsToken: with metrics scrapers' tokens, /metrics opens to them
// only (an agent's token gets 401 there), and theirs get 401 on /mcp;
// a reload that removes the scraper's token closes /metrics to it.
func TestMetricsToken(t *testing.T) {
	dir := t.TempDir()
	agents, metrics := filepath.Join(dir, "agents"), filepath.Join(dir, "metrics")
	writeFile(t, agents, "alice "+aliceToken+"\n")
	const prom = "prom-0123456789abcdef00"
	writeFile(t, metrics, "prom "+prom+"\n")
	k, _, err := OpenKeyring(TokenFiles{Agents: agents, Metrics: metrics})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h, err := Handler(Config{Server: testServer(), Tokens: k.Agents, MetricsTokens: k.Metrics, Listen: ln.Addr(),
		Metrics: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "pysandbox_up 1\n") })})
	if err != nil {
		t.Fatal(err)
	}
	hs := &httptest.Server{Listener: ln, Config: &http.Server{Handler: h}}
	hs.Start()
	defer hs.Close()
	scrape := func(token string) (int, string) {
		req, _ := http.NewRequest("GET", hs.URL+"/metrics", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, body := scrape(prom); code != 200 || body != "pysandbox_up 1\n" {
		t.Errorf("/metrics with the scraper's token: %d %q", code, body)
	}
	for _, token := range []string{aliceToken, "", "prom-0123456789abcdef0X"} {
		if code, _ := scrape(token); code != http.StatusUnauthorized {
			t.Errorf("/metrics with %q: %d", token, code)
		}
	}
	if resp := post(t, hs.URL+"/mcp", map[string]string{"Authorization": "Bearer " + prom}); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("/mcp with the scraper's token: %d", resp.StatusCode)
	}
	if who, err := whoami(t, hs.URL, aliceToken); err != nil || who != "alice" {
		t.Errorf("alice on /mcp: %q %v", who, err)
	}

	writeFile(t, metrics, "prom2 prom2-0123456789abcdef0\n")
	if _, err := k.Reload(); err != nil {
		t.Fatal(err)
	}
	if code, _ := scrape(prom); code != http.StatusUnauthorized {
		t.Errorf("/metrics with a removed scraper's token: %d", code)
	}
	if code, _ := scrape("prom2-0123456789abcdef0"); code != 200 {
		t.Errorf("/metrics with the new scraper's token: %d", code)
	}
}
