package tools

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestListFilesEscapesNames: file names that code in a session chose are
// shown escaped in list_files' text, one line per entry, so a newline
// cannot plant a row, a carriage return or terminal escape cannot
// overwrite one, and a bidi override cannot reverse a name; the
// structured result keeps the names as they are.
func TestListFilesEscapesNames(t *testing.T) {
	cs := connect(t, nil)
	id := newSession(t, cs)
	names := map[string]string{
		"plain.txt": "plain.txt",
		"x\nfile          0  2026-01-01T00:00:00Z  fake": `"x\nfile          0  2026-01-01T00:00:00Z  fake"`,
		"cr\rover":             `"cr\rover"`,
		"tab\tx":               `"tab\tx"`,
		"esc\x1b[31mred":       `"esc\x1b[31mred"`,
		"invoice\u202egnp.exe": `"invoice\u202egnp.exe"`,
	}
	res, _ := call(t, cs, "run_python", map[string]any{"session_id": id,
		"code": "for n in names:\n    open(n, 'w').close()", "inputs": map[string]any{"names": slices.Collect(maps.Keys(names))}})
	if res.IsError {
		t.Fatalf("run_python: %s", text(res))
	}
	res, out := call(t, cs, "list_files", map[string]any{"session_id": id})
	if res.IsError {
		t.Fatal(text(res))
	}
	listing := text(res)
	lines := strings.Split(strings.TrimSuffix(listing, "\n"), "\n")
	if len(lines) != 1+len(names) || lines[0] != "6 entries in /work" {
		t.Fatalf("list_files text has %d lines for %d entries:\n%s", len(lines), len(names), listing)
	}
	if strings.ContainsAny(listing, "\r\t\x1b\u202e") {
		t.Errorf("list_files text keeps a control or bidi character:\n%q", listing)
	}
	for _, shown := range names {
		found := false
		for _, l := range lines[1:] {
			found = found || strings.HasSuffix(l, "  "+shown)
		}
		if !found {
			t.Errorf("no line ends with %s:\n%s", shown, listing)
		}
	}
	structured := map[string]bool{}
	for _, f := range out["files"].([]any) {
		structured[f.(map[string]any)["path"].(string)] = true
	}
	for name := range names {
		if !structured[name] {
			t.Errorf("structured result lacks %q: %v", name, structured)
		}
	}
}

// TestListFilesHidden: what libraries keep in dot-directories (.cache)
// is left out of list_files and counted, unless include_hidden is true.
func TestListFilesHidden(t *testing.T) {
	cs := connect(t, nil)
	id := newSession(t, cs)
	code := "import os\nos.makedirs('.cache/fontconfig', exist_ok=True)\n" +
		"for n in ('a', 'b', 'c'):\n    open('.cache/fontconfig/' + n, 'w').close()\n" +
		"open('.env', 'w').close()\nos.makedirs('data', exist_ok=True)\nopen('data/.keep', 'w').close()\nopen('plot.png', 'w').close()"
	if res, _ := call(t, cs, "run_python", map[string]any{"session_id": id, "code": code}); res.IsError {
		t.Fatalf("run_python: %s", text(res))
	}
	paths := func(out map[string]any) string {
		var ps []string
		for _, f := range out["files"].([]any) {
			ps = append(ps, f.(map[string]any)["path"].(string))
		}
		return strings.Join(ps, " ")
	}
	res, out := call(t, cs, "list_files", map[string]any{"session_id": id})
	if got := paths(out); res.IsError || got != "data plot.png" || out["hidden"] != 3.0 {
		t.Errorf("list_files: %s (hidden %v)", got, out["hidden"])
	}
	if first, _, _ := strings.Cut(text(res), "\n"); first != "2 entries in /work; 3 hidden entries (names beginning with a dot) were left out: pass include_hidden: true to list them" {
		t.Errorf("list_files text: %q", first)
	}
	res, out = call(t, cs, "list_files", map[string]any{"session_id": id, "include_hidden": true})
	if got := paths(out); res.IsError || got != ".cache .cache/fontconfig .cache/fontconfig/a .cache/fontconfig/b .cache/fontconfig/c .env data data/.keep plot.png" || out["hidden"] != nil {
		t.Errorf("list_files include_hidden: %s (hidden %v)", got, out["hidden"])
	}
	res, out = call(t, cs, "list_files", map[string]any{"session_id": id, "path": ".cache"})
	if got := paths(out); res.IsError || got != ".cache/fontconfig .cache/fontconfig/a .cache/fontconfig/b .cache/fontconfig/c" {
		t.Errorf("list_files .cache: %s", got)
	}
	if first, _, _ := strings.Cut(text(res), "\n"); first != "4 entries in /work/.cache" {
		t.Errorf("list_files .cache text: %q", first)
	}
}

// TestUploadNeedsContent: an upload_file call without content and
// content_base64 is refused and writes nothing; an explicitly empty
// content makes an empty file.
func TestUploadNeedsContent(t *testing.T) {
	cs := connect(t, nil)
	id := newSession(t, cs)
	res, _ := call(t, cs, "upload_file", map[string]any{"session_id": id, "path": "forgot.txt"})
	if !res.IsError || !strings.Contains(text(res), `For an empty file, pass content "".`) {
		t.Errorf("no content: %s", text(res))
	}
	res, out := call(t, cs, "upload_file", map[string]any{"session_id": id, "path": "empty.txt", "content": ""})
	if res.IsError || out["size"] != 0.0 {
		t.Fatalf("an empty content: %s %v", text(res), out)
	}
	res, out = call(t, cs, "run_python", map[string]any{"session_id": id, "code": "import os\n(os.path.exists('forgot.txt'), os.path.getsize('empty.txt'))"})
	if res.IsError || fmt.Sprint(out["return_value"]) != "[false 0]" {
		t.Errorf("the workspace: %s %#v", text(res), out)
	}
}

// TestDownloadTooLarge: a session file larger than any reply says so at
// download_file, with the limit in exact bytes and what to do; a
// resources/read of it is refused as invalid params, not as an error of
// code 0.
func TestDownloadTooLarge(t *testing.T) {
	cs := connect(t, nil)
	id := newSession(t, cs)
	if res, _ := call(t, cs, "run_python", map[string]any{"session_id": id, "code": "open('big.bin', 'wb').write(b'x' * (8 << 20))"}); res.IsError {
		t.Fatal(text(res))
	}
	res, out := call(t, cs, "download_file", map[string]any{"session_id": id, "path": "big.bin"})
	if !res.IsError || out["status"] != "invalid_request" || !strings.Contains(text(res), "big.bin is 8388608 bytes, more than the ") || !strings.Contains(text(res), "split it") {
		t.Errorf("download_file: %s", text(res))
	}
	_, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "pysandbox://sessions/" + id + "/files/big.bin"})
	var je *jsonrpc.Error
	if !errors.As(err, &je) || je.Code != jsonrpc.CodeInvalidParams || !strings.Contains(je.Message, "bytes)") {
		t.Errorf("resources/read: %v", err)
	}
}

// TestByteSize: exact bytes below a KiB; above, one decimal in the unit,
// never rounded down to a whole one, and with exact the count besides.
func TestByteSize(t *testing.T) {
	for _, c := range []struct {
		n     int64
		exact bool
		want  string
	}{
		{0, true, "0 bytes"},
		{1023, false, "1023 bytes"},
		{1024, false, "1.0 KiB"},
		{3 << 20, false, "3.0 MiB"},
		{3<<20 - 1<<10*100, true, "2.9 MiB (3043328 bytes)"},
		{1536, true, "1.5 KiB (1536 bytes)"},
	} {
		if got := byteSize(c.n, c.exact); got != c.want {
			t.Errorf("byteSize(%d, %v) = %q, want %q", c.n, c.exact, got, c.want)
		}
	}
}
