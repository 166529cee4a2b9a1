package setup

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	if st, _ := os.Stat(real + ".bak"); st.Mode().Perm() != 0o600 {
		t.Errorf("the backup's mode is %v", st.Mode().Perm())
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
