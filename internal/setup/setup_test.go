package setup

import (
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

var entry = Entry{Name: "pysandbox", Command: "/usr/local/bin/pysandbox", Args: []string{"serve", "--policy", "/etc/pysandbox/policy.json"}}

// existing are config files as users have them, per format: other
// servers, other settings, their own indentation.
var existing = map[string]string{
	"mcpServers": "{\n    \"mcpServers\": {\n        \"github\": {\"command\": \"npx\", \"args\": [\"-y\", \"@modelcontextprotocol/server-github\"], \"env\": {\"GITHUB_TOKEN\": \"x\"}}\n    },\n    \"theme\": \"dark\",\n    \"numbers\": [1, 2.50, 3e2]\n}\n",
	"servers":    "{\n\t\"servers\": {\n\t\t\"fetch\": {\"type\": \"stdio\", \"command\": \"uvx\", \"args\": [\"mcp-server-fetch\"]}\n\t},\n\t\"inputs\": []\n}\n",
	"":           "model = \"o4-mini\"\n\n[mcp_servers.github]\ncommand = \"npx\"\nargs = [\"-y\", \"@modelcontextprotocol/server-github\"]\n\n[profiles.fast]\nmodel = \"gpt-5\"\n",
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		os.MkdirAll("testdata", 0o755)
		os.WriteFile(path, []byte(got), 0o644)
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update)", err)
	}
	if string(want) != got {
		t.Errorf("%s differs (run with -update if meant):\n--- want\n%s\n--- got\n%s", name, want, got)
	}
}

// TestClients: for each client, the printed entry; a new file; a merge
// into a file with other servers and settings (kept as written); the same
// merge again (nothing changes, no new backup); an entry of the same name
// replaced; a file that does not parse refused and left alone.
func TestClients(t *testing.T) {
	for _, id := range IDs() {
		c := Clients[id]
		t.Run(id, func(t *testing.T) {
			golden(t, id+".snippet", c.Snippet(entry))
			dir := t.TempDir()
			fresh := filepath.Join(dir, "sub", "new.conf")
			if r, err := c.Write(fresh, entry); err != nil || !r.Changed || r.Backup != "" {
				t.Fatalf("a new file: %+v %v", r, err)
			}
			data, _ := os.ReadFile(fresh)
			golden(t, id+".new", string(data))

			path := filepath.Join(dir, "existing.conf")
			os.WriteFile(path, []byte(existing[c.Key]), 0o640)
			r, err := c.Write(path, entry)
			if err != nil || !r.Changed || r.Backup != path+".bak" {
				t.Fatalf("a merge: %+v %v", r, err)
			}
			if old, _ := os.ReadFile(r.Backup); string(old) != existing[c.Key] {
				t.Errorf("the backup is not the old file")
			}
			if st, _ := os.Stat(path); st.Mode().Perm() != 0o640 {
				t.Errorf("the file's mode changed to %v", st.Mode())
			}
			merged, _ := os.ReadFile(path)
			golden(t, id+".merged", string(merged))
			os.Remove(r.Backup)
			if r, err := c.Write(path, entry); err != nil || r.Changed {
				t.Errorf("a second merge changed something: %+v %v", r, err)
			}
			if _, err := os.Stat(path + ".bak"); err == nil {
				t.Errorf("a second merge left a backup")
			}
			// A new version of the entry replaces the old one.
			e2 := entry
			e2.Args = []string{"serve", "--tools", "mcp-run-python"}
			c.Write(path, e2)
			again, _ := os.ReadFile(path)
			if strings.Count(string(again), "pysandbox\"") > 2 || !strings.Contains(string(again), "mcp-run-python") || strings.Contains(string(again), "/etc/pysandbox/policy.json") {
				t.Errorf("the replaced entry:\n%s", again)
			}

			bad := filepath.Join(dir, "bad.conf")
			broken := "{\n  // a comment\n  \"mcpServers\": {}\n}\n"
			if c.Key == "" {
				broken = "[mcp_servers.x\ncommand = \n"
			}
			os.WriteFile(bad, []byte(broken), 0o600)
			if _, err := c.Write(bad, entry); !errors.Is(err, ErrUnparsable) || !strings.Contains(err.Error(), "add the entry by hand") {
				t.Errorf("an unparsable file: %v", err)
			}
			if data, _ := os.ReadFile(bad); string(data) != broken {
				t.Errorf("an unparsable file was changed")
			}
		})
	}
}

func TestPaths(t *testing.T) {
	for _, tc := range []struct{ id, goos, want string }{
		{"claude-desktop", "linux", "/home/u/.config/Claude/claude_desktop_config.json"},
		{"claude-desktop", "darwin", "/home/u/Library/Application Support/Claude/claude_desktop_config.json"},
		{"claude-desktop", "windows", "/appdata/Claude/claude_desktop_config.json"},
		{"vscode", "linux", "/home/u/.config/Code/User/mcp.json"},
		{"vscode", "darwin", "/home/u/Library/Application Support/Code/User/mcp.json"},
		{"cursor", "linux", "/home/u/.cursor/mcp.json"},
		{"codex", "linux", "/home/u/.codex/config.toml"},
		{"gemini", "linux", "/home/u/.gemini/settings.json"},
		{"claude-code", "linux", "/home/u/.claude.json"},
	} {
		if got := Clients[tc.id].Path(tc.goos, "/home/u", "/appdata"); got != tc.want {
			t.Errorf("%s on %s: %s, want %s", tc.id, tc.goos, got, tc.want)
		}
	}
	if got := Clients["claude-code"].Command(Entry{Name: "pysandbox", Command: "/opt/my tools/pysandbox", Args: []string{"serve", "--policy", "/p's.json"}}); got != `claude mcp add --scope user pysandbox -- '/opt/my tools/pysandbox' serve --policy '/p'\''s.json'` {
		t.Errorf("claude-code's command: %s", got)
	}
}

// TestWriteHostileSurroundings: a config reached through a symbolic link
// is updated where it points; stray files beside it lend nothing (mode,
// a link for the backup); a TOML file whose table headers hide in strings
// is refused rather than merged wrong.
func TestWriteHostileSurroundings(t *testing.T) {
	dir := t.TempDir()
	c := Clients["cursor"]
	real := filepath.Join(dir, "dotfiles", "mcp.json")
	os.MkdirAll(filepath.Dir(real), 0o755)
	os.WriteFile(real, []byte(`{"mcpServers": {}}`), 0o600)
	link := filepath.Join(dir, "mcp.json")
	os.Symlink(real, link)
	elsewhere := filepath.Join(dir, "elsewhere")
	os.WriteFile(elsewhere, []byte("untouched"), 0o644)
	os.Symlink(elsewhere, real+".bak")
	stray := real + ".pysandbox-tmp"
	os.WriteFile(stray, nil, 0o666)
	if _, err := c.Write(link, entry); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Lstat(link); fi.Mode()&os.ModeSymlink == 0 {
		t.Error("the link was replaced by a file")
	}
	if data, _ := os.ReadFile(real); !strings.Contains(string(data), "/usr/local/bin/pysandbox") {
		t.Errorf("the link's target was not updated:\n%s", data)
	}
	if st, _ := os.Stat(real); st.Mode().Perm() != 0o600 {
		t.Errorf("the config's mode is %v", st.Mode().Perm())
	}
	if data, _ := os.ReadFile(elsewhere); string(data) != "untouched" {
		t.Error("the backup was written through a link")
	}
	// The name FILE.bak was taken (by a link): the backup is FILE.bak.1,
	// and what held the name is left as it was.
	if fi, _ := os.Lstat(real + ".bak"); fi == nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Error("the existing FILE.bak was replaced")
	}
	if st, _ := os.Stat(real + ".bak.1"); st == nil || st.Mode().Perm() != 0o600 {
		t.Errorf("the backup: %v", st)
	}

	codex := Clients["codex"]
	for name, text := range map[string]string{
		"header in a string":                 "notes = \"\"\"\n[mcp_servers.pysandbox]\n[x]\n\"\"\"\n",
		"a server in the old entry's string": "[mcp_servers.pysandbox]\ndoc = '''\n[mcp_servers.evil]\ncommand = \"/bin/evil\"\n'''\n",
	} {
		p := filepath.Join(dir, "config.toml")
		os.WriteFile(p, []byte(text), 0o600)
		_, err := codex.Write(p, entry)
		data, _ := os.ReadFile(p)
		if !errors.Is(err, ErrUnparsable) || string(data) != text {
			t.Errorf("%s: %v\n%s", name, err, data)
		}
	}
}

// TestMergeKeepsKeys: other keys stay byte for byte, escapes included.
func TestMergeKeepsKeys(t *testing.T) {
	in := "{\n  \"a\\ud800b\": 1,\n  \"mcpServers\": {\"x\\u0041\": {\"command\": \"y\"}}\n}\n"
	out, err := Clients["cursor"].Merge([]byte(in), entry)
	if err != nil || !strings.Contains(string(out), `"a\ud800b": 1`) || !strings.Contains(string(out), `"x\u0041": {"command": "y"}`) {
		t.Errorf("%v\n%s", err, out)
	}
}

// httpEntry is a streamable HTTP entry with a token and a timeout.
var httpEntry = Entry{Name: "pysandbox", URL: "https://sandbox.example.com/mcp", Headers: []Header{{"Authorization", "Bearer 0123456789abcdef0123"}}, ToolTimeout: 630 * time.Second}

// TestHTTPEntries: each client that documents a streamable HTTP entry gets
// one in its own format (with the tool-call timeout where it has one),
// printed and merged into a file with other servers; a stdio entry gets
// the timeout too.
func TestHTTPEntries(t *testing.T) {
	for _, id := range IDs() {
		c := Clients[id]
		if c.URLKey == "" {
			if c.NoHTTP == "" {
				t.Errorf("%s: neither an HTTP entry nor a reason", id)
			}
			continue
		}
		t.Run(id, func(t *testing.T) {
			out := c.Snippet(httpEntry)
			if c.Command != nil {
				out += "\n" + c.Command(httpEntry) + "\n"
			}
			golden(t, id+".http.snippet", out)
			merged, err := c.Merge([]byte(existing[c.Key]), httpEntry)
			if err != nil {
				t.Fatal(err)
			}
			golden(t, id+".http.merged", string(merged))
			again, err := c.Merge(merged, httpEntry)
			if err != nil || string(again) != string(merged) {
				t.Errorf("a second merge changed something: %v", err)
			}
			timed := entry
			timed.ToolTimeout = 450 * time.Second
			golden(t, id+".timeout.snippet", c.Snippet(timed))
		})
	}
}

// TestWriteRefusesHostileFiles: what Write will not rewrite is left
// exactly as it was, with the entry to paste: a file that does not parse
// exactly, a symbolic link to nothing or to a device, a FIFO (without
// blocking), a file over MaxFileBytes. The refusals' messages are golden.
func TestWriteRefusesHostileFiles(t *testing.T) {
	c := Clients["cursor"]
	dir := t.TempDir()
	var msgs strings.Builder
	for _, tc := range []struct {
		name string
		make func(path string) error
		want error
	}{
		{"trailing brackets", func(p string) error { return os.WriteFile(p, []byte("{\"a\":1} }\n]]"), 0o600) }, ErrUnparsable},
		{"trailing object", func(p string) error { return os.WriteFile(p, []byte(`{"a":1} {"b":2}`), 0o600) }, ErrUnparsable},
		{"duplicate key", func(p string) error {
			return os.WriteFile(p, []byte(`{"mcpServers": {}, "mcpServers": {"x": {}}}`), 0o600)
		}, ErrUnparsable},
		{"dangling link", func(p string) error { return os.Symlink(filepath.Join(dir, "nowhere", "mcp.json"), p) }, ErrUnsafe},
		{"link to /dev/zero", func(p string) error { return os.Symlink("/dev/zero", p) }, ErrUnsafe},
		{"FIFO", func(p string) error { return syscall.Mkfifo(p, 0o600) }, ErrUnsafe},
		{"link to a FIFO", func(p string) error {
			if err := syscall.Mkfifo(p+".fifo", 0o600); err != nil {
				return err
			}
			return os.Symlink(p+".fifo", p)
		}, ErrUnsafe},
		{"directory", func(p string) error { return os.Mkdir(p, 0o700) }, ErrUnsafe},
		{"huge file", func(p string) error {
			f, err := os.Create(p)
			if err != nil {
				return err
			}
			defer f.Close()
			f.WriteString(`{"mcpServers": {}}`)
			return f.Truncate(MaxFileBytes + 1) // sparse: costs no disk
		}, ErrUnsafe},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.NewReplacer(" ", "-", "/", "").Replace(tc.name)+".json")
			if err := tc.make(path); err != nil {
				t.Fatal(err)
			}
			before := snapshot(t, path)
			done := make(chan error, 1)
			go func() { _, err := c.Write(path, entry); done <- err }()
			var err error
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Write blocked")
			}
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), "add the entry by hand") {
				t.Fatalf("got %v, want %v with the snippet", err, tc.want)
			}
			if after := snapshot(t, path); after != before {
				t.Errorf("the path changed:\n%s\n%s", before, after)
			}
			if _, err := os.Lstat(path + ".bak"); err == nil {
				t.Error("a backup was left")
			}
			msg, _, _ := strings.Cut(err.Error(), "; add the entry by hand")
			fmt.Fprintf(&msgs, "%s: %s\n", tc.name, strings.ReplaceAll(msg, dir, "DIR"))
		})
	}
	golden(t, "refusals.txt", msgs.String())
}

// snapshot describes what is at path without following it or reading a
// FIFO: its type, mode, link target, and a regular file's content hash.
func snapshot(t *testing.T, path string) string {
	t.Helper()
	st, err := os.Lstat(path)
	if err != nil {
		return "missing"
	}
	s := fmt.Sprintf("%v size %d", st.Mode(), st.Size())
	if st.Mode()&os.ModeSymlink != 0 {
		target, _ := os.Readlink(path)
		s += " -> " + target
	} else if st.Mode().IsRegular() {
		data, _ := os.ReadFile(path)
		s += fmt.Sprintf(" sha256 %x", sha256.Sum256(data))
	}
	return s
}

// TestWriteInPlace: a merge rewrites the file's own inode, so another
// user's file stays theirs (Write runs as root here), with its mode, and
// its hard links see the new content; the backup has the file's owner and
// mode.
func TestWriteInPlace(t *testing.T) {
	c := Clients["cursor"]
	dir := t.TempDir()
	path := filepath.Join(dir, "mcp.json")
	old := "{\n  \"mcpServers\": {\"other\": {\"command\": \"true\"}}\n}\n"
	os.WriteFile(path, []byte(old), 0o640)
	os.Chmod(path, 0o640)
	other := filepath.Join(dir, "hardlink.json")
	if err := os.Link(path, other); err != nil {
		t.Fatal(err)
	}
	owned := os.Geteuid() == 0
	if owned {
		if err := os.Chown(path, 4242, 4343); err != nil {
			t.Fatal(err)
		}
	}
	before, _ := os.Stat(path)
	r, err := c.Write(path, entry)
	if err != nil || !r.Changed || r.Path != path {
		t.Fatalf("%+v %v", r, err)
	}
	after, _ := os.Stat(path)
	if !os.SameFile(before, after) {
		t.Error("the file was replaced, not rewritten")
	}
	if after.Mode().Perm() != 0o640 {
		t.Errorf("mode %v", after.Mode().Perm())
	}
	st := after.Sys().(*syscall.Stat_t)
	if st.Nlink != 2 {
		t.Errorf("%d links", st.Nlink)
	}
	linked, _ := os.ReadFile(other)
	if !strings.Contains(string(linked), "/usr/local/bin/pysandbox") || !strings.Contains(string(linked), `"other"`) {
		t.Errorf("the hard link does not see the merge:\n%s", linked)
	}
	bak, _ := os.Stat(r.Backup)
	if data, _ := os.ReadFile(r.Backup); string(data) != old || bak.Mode().Perm() != 0o640 {
		t.Errorf("the backup: %v\n%s", bak.Mode(), data)
	}
	if owned {
		if st.Uid != 4242 || st.Gid != 4343 {
			t.Errorf("the file's owner became %d:%d", st.Uid, st.Gid)
		}
		if b := bak.Sys().(*syscall.Stat_t); b.Uid != 4242 || b.Gid != 4343 {
			t.Errorf("the backup's owner is %d:%d", b.Uid, b.Gid)
		}
	} else {
		t.Log("not root: the owner part is skipped")
	}
	// Nothing to change: not even write permission is needed.
	os.Chmod(path, 0o440)
	if r, err := c.Write(path, entry); err != nil || r.Changed {
		t.Errorf("an unchanged read-only file: %+v %v", r, err)
	}
}
