package workspace

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func paths(e []FileInfo) string {
	var s []string
	for _, x := range e {
		s = append(s, x.Path)
	}
	return strings.Join(s, " ")
}

func TestListOrderAndCap(t *testing.T) {
	d, _, _ := newWS(t)
	for _, p := range []string{"b/2", "b/1", "a", "c/x/y", "B"} {
		mustWrite(t, d, p, p)
	}
	e, trunc, err := d.List("", 0)
	if err != nil || trunc {
		t.Fatal(err, trunc)
	}
	// Depth first, byte order within each directory.
	if got, want := paths(e), "B a b b/1 b/2 c c/x c/x/y"; got != want {
		t.Errorf("List = %s, want %s", got, want)
	}
	if e[1].Type != "file" || e[1].Size != 1 || e[2].Type != "dir" || e[2].Size != 0 {
		t.Errorf("entries: %+v %+v", e[1], e[2])
	}
	for n := 1; n < 8; n++ {
		e, trunc, err := d.List(".", n)
		if err != nil || len(e) != n || !trunc {
			t.Errorf("List(max %d) = %d entries, truncated %v, %v", n, len(e), trunc, err)
		}
	}
	if e, trunc, _ := d.List("", 8); len(e) != 8 || trunc {
		t.Errorf("List(max 8) = %d, %v; want 8, not truncated", len(e), trunc)
	}
	if got, want := func() string { e, _, _ := d.List("c", 0); return paths(e) }(), "c/x c/x/y"; got != want {
		t.Errorf("List(c) = %s", got)
	}
	// A file lists as itself; a missing path is an error.
	if e, _, err := d.List("b/1", 0); err != nil || len(e) != 1 || e[0].Path != "b/1" || e[0].Type != "file" {
		t.Errorf("List(b/1) = %+v, %v", e, err)
	}
	if _, _, err := d.List("nope", 0); !errors.Is(err, ErrNotFound) {
		t.Errorf("List(nope) = %v", err)
	}
	if _, _, err := d.List("b/1/x", 0); !errors.Is(err, ErrNotDir) {
		t.Errorf("List(b/1/x) = %v", err)
	}
	if _, _, err := d.List("../", 0); !errors.Is(err, ErrInvalidPath) {
		t.Errorf("List(../) = %v", err)
	}
	// An empty directory gives an empty, non-nil list (JSON [] not null).
	d2 := openDir(t, t.TempDir())
	if e, trunc, err := d2.List("", 0); err != nil || e == nil || len(e) != 0 || trunc {
		t.Errorf("empty List = %#v, %v, %v", e, trunc, err)
	}
}

// TestListVisible: hidden names (a dot first) are left out at every
// level, and not entered, and counted; a hidden start path is listed.
func TestListVisible(t *testing.T) {
	d, _, _ := newWS(t)
	for _, p := range []string{".cache/fontconfig/a", ".cache/fontconfig/b", ".env", "data/.keep", "data/x.csv", "plot.png"} {
		mustWrite(t, d, p, p)
	}
	e, hidden, trunc, err := d.ListVisible("", 0)
	if err != nil || trunc {
		t.Fatal(err, trunc)
	}
	if got, want := paths(e), "data data/x.csv plot.png"; got != want || hidden != 3 {
		t.Errorf("ListVisible = %s (%d hidden), want %s (3 hidden)", got, hidden, want)
	}
	e, hidden, _, err = d.ListVisible(".cache", 0)
	if got, want := paths(e), ".cache/fontconfig .cache/fontconfig/a .cache/fontconfig/b"; err != nil || got != want || hidden != 0 {
		t.Errorf("ListVisible(.cache) = %s (%d hidden), %v; want %s", got, hidden, err, want)
	}
	e, _, _ = d.List("", 0)
	if got, want := paths(e), ".cache .cache/fontconfig .cache/fontconfig/a .cache/fontconfig/b .env data data/.keep data/x.csv plot.png"; got != want {
		t.Errorf("List = %s, want %s", got, want)
	}
}

func TestListSymlinks(t *testing.T) {
	d, ws, out := newWS(t)
	mustWrite(t, d, "a/file", "x")
	symlink(t, "/etc", filepath.Join(ws, "etc"))
	symlink(t, out, filepath.Join(ws, "out"))
	symlink(t, ".", filepath.Join(ws, "loop"))
	symlink(t, "..", filepath.Join(ws, "a", "up"))
	symlink(t, "self", filepath.Join(ws, "self")) // points at itself
	long := strings.Repeat("é", 300)              // 600 bytes
	symlink(t, long, filepath.Join(ws, "long"))

	done := make(chan struct{})
	var e []FileInfo
	var err error
	go func() {
		e, _, err = d.List("", 0)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("List hangs on a symlink loop")
	}
	if err != nil {
		t.Fatal(err)
	}
	if got, want := paths(e), "a a/file a/up etc long loop out self"; got != want {
		t.Errorf("List = %s, want %s", got, want)
	}
	targets := map[string]string{}
	for _, x := range e {
		if x.Type == "symlink" {
			targets[x.Path] = x.Target
		}
	}
	if targets["etc"] != "/etc" || targets["out"] != out || targets["loop"] != "." || targets["a/up"] != ".." {
		t.Errorf("targets = %q", targets)
	}
	lt := targets["long"]
	if len(lt) > MaxTargetLen+3 || !strings.HasSuffix(lt, "...") || !strings.HasPrefix(long, strings.TrimSuffix(lt, "...")) {
		t.Errorf("long target not cut cleanly: %d bytes %q", len(lt), lt)
	}
	// Starting at a loop that stays inside follows it once; the walk
	// below still does not follow links.
	if e, _, err := d.List("loop", 0); err != nil || paths(e) != "loop/a loop/a/file loop/a/up loop/etc loop/long loop/loop loop/out loop/self" {
		t.Errorf("List(loop) = %s, %v", paths(e), err)
	}
	if _, _, err := d.List("self", 0); !errors.Is(err, ErrSymlink) {
		t.Errorf("List(self) = %v", err)
	}
}

func TestListDepth(t *testing.T) {
	d, _, _ := newWS(t)
	deep := strings.Repeat("d/", 40) + "leaf"
	mustWrite(t, d, deep, "x")
	e, trunc, err := d.List("", 0)
	if err != nil {
		t.Fatal(err)
	}
	if !trunc || len(e) != MaxListDepth {
		t.Errorf("List of a 41-level tree: %d entries, truncated %v; want %d, true", len(e), trunc, MaxListDepth)
	}
	if last := e[len(e)-1].Path; strings.Count(last, "/")+1 != MaxListDepth {
		t.Errorf("deepest entry %s", last)
	}
	// Starting lower reaches the leaf.
	start := strings.Repeat("d/", 20)
	e, trunc, err = d.List(start, 0)
	if err != nil || trunc || e[len(e)-1].Path != deep {
		t.Errorf("List(%s) = %d entries, %v, %v", start, len(e), trunc, err)
	}
}

// TestDisplayPath: names with control, invisible and bidi characters are
// quoted with those escaped, so a listing keeps one line per entry and
// reads in its true order; the quoted form reads back as the name.
func TestDisplayPath(t *testing.T) {
	d, ws, _ := newWS(t)
	for p, want := range map[string]string{
		"plain.txt":                    "plain.txt",
		"dir/with space/é 日本.csv":      "dir/with space/é 日本.csv",
		"a\n2026-01-01  fake row":      `"a\n2026-01-01  fake row"`,
		"cr\roverwritten":              `"cr\roverwritten"`,
		"tab\tx":                       `"tab\tx"`,
		"esc\x1b[2J\x1b[31mred":        `"esc\x1b[2J\x1b[31mred"`,
		"invoice\u202egnp.exe":         `"invoice\u202egnp.exe"`,
		"zero\u200bwidth\ufe0f":        `"zero\u200bwidth\ufe0f"`,
		"nul\x7fdel\u0085nel\u2028sep": `"nul\x7fdel\u0085nel\u2028sep"`,
		"bad\xffutf8":                  `"bad\xffutf8"`,
		`back\slash`:                   `"back\\slash"`,
		`"quoted"`:                     `"\"quoted\""`,
		`mid"quote`:                    `mid"quote`,
		" leading":                     `" leading"`,
		"trailing ":                    `"trailing "`,
		"tag\U000e0041":                `"tag\U000e0041"`,
		"replacement\ufffd":            `"replacement\ufffd"`,
		"nbsp\u00a0x":                  `"nbsp\u00a0x"`,
	} {
		got := DisplayPath(p)
		if got != want {
			t.Errorf("DisplayPath(%q) = %s, want %s", p, got, want)
		}
		if back, err := strconv.Unquote(got); got != p && (err != nil || back != p) {
			t.Errorf("%s reads back as %q (%v), not %q", got, back, err, p)
		}
		if strings.ContainsAny(got, "\n\r\t\x1b\u202e") {
			t.Errorf("DisplayPath(%q) keeps a control or bidi character", p)
		}
		if strings.Contains(p, "/") {
			continue
		}
		// Real files of these names, made as code in the session makes
		// them (Write refuses control characters in the paths it is
		// given), list as one line each.
		if err := os.WriteFile(filepath.Join(ws, p), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	e, _, err := d.List("", 0)
	if err != nil {
		t.Fatal(err)
	}
	var shown []string
	for _, f := range e {
		shown = append(shown, DisplayPath(f.Path))
	}
	listing := strings.Join(shown, "\n")
	if n := strings.Count(listing, "\n") + 1; n != len(e) || len(e) != 17 {
		t.Errorf("%d entries shown on %d lines:\n%s", len(e), n, listing)
	}
	if !strings.Contains(listing, `"invoice\u202egnp.exe"`) || !strings.Contains(listing, `"a\n2026-01-01  fake row"`) {
		t.Errorf("listing:\n%s", listing)
	}
}
