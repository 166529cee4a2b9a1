package upstream

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	t.Setenv("UPSTREAM_TEST_TOKEN", "s3cret")
	cfg, err := Parse([]byte(`{
	"mcpServers": {
		"memory": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-memory"], "env": {"MEMORY_FILE_PATH": "/tmp/m.json"}},
		"gh": {"url": "https://api.example.com/mcp", "headers": {"Authorization": "Bearer ${UPSTREAM_TEST_TOKEN}"}},
		"legacy": {"type": "sse", "url": "http://127.0.0.1:9/sse"},
		"off": {"command": "x", "disabled": true},
		"cursor": {"command": "y", "autoApprove": ["a"]},
		"secret": {"command": "z", "env": {"KEY": "${env:UPSTREAM_TEST_UNSET}"}}
	},
	"globalShortcut": "x"
}`), "test.json")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range cfg.Servers {
		names = append(names, s.Name)
	}
	if want := []string{"cursor", "gh", "legacy", "memory", "secret"}; !reflect.DeepEqual(names, want) {
		t.Errorf("servers %v, want %v", names, want)
	}
	by := map[string]ServerConfig{}
	for _, s := range cfg.Servers {
		by[s.Name] = s
	}
	if s := by["memory"]; s.Command != "npx" || len(s.Args) != 2 || s.Env["MEMORY_FILE_PATH"] != "/tmp/m.json" || s.Err != "" {
		t.Errorf("memory: %+v", s)
	}
	if s := by["gh"]; s.Transport != "http" || s.Headers["Authorization"] != "Bearer s3cret" {
		t.Errorf("gh: %+v", s)
	}
	if s := by["legacy"]; s.Transport != "sse" {
		t.Errorf("legacy: %+v", s)
	}
	if s := by["secret"]; !strings.Contains(s.Err, "UPSTREAM_TEST_UNSET") {
		t.Errorf("an unset variable should fail its entry only: %+v", s)
	}
	// Describe never shows secrets.
	if d := by["gh"].Describe(); strings.Contains(d, "s3cret") || d != "http https://api.example.com/mcp" {
		t.Errorf("describe: %q", d)
	}
	warns := strings.Join(cfg.Warnings, "\n")
	for _, w := range []string{`"globalShortcut" is ignored`, `mcpServers.cursor: field "autoApprove" is ignored`, "mcpServers.off is disabled"} {
		if !strings.Contains(warns, w) {
			t.Errorf("warnings lack %q:\n%s", w, warns)
		}
	}
}

func TestParseVSCode(t *testing.T) {
	cfg, err := Parse([]byte(`{"servers": {"fs": {"type": "stdio", "command": "mcp-fs", "args": ["/data"]}}}`), "mcp.json")
	if err != nil || len(cfg.Servers) != 1 || cfg.Servers[0].Command != "mcp-fs" {
		t.Fatalf("%+v %v", cfg, err)
	}
}

func TestParseErrors(t *testing.T) {
	for _, c := range []struct{ doc, want string }{
		{`[]`, "not a JSON object"},
		{`{}`, `no "mcpServers" object`},
		{`{"mcpServers": []}`, "want an object of servers by name"},
		{`{"mcpServers": {"a.b": {"command": "x"}}}`, `server name "a.b"`},
		{`{"mcpServers": {"": {"command": "x"}}}`, `server name ""`},
		{`{"mcpServers": {"9lives": {"command": "x"}}}`, `server name "9lives"`},
		{`{"mcpServers": {"a": {}}}`, `neither a "command"`},
		{`{"mcpServers": {"a": {"command": "x", "url": "http://h/"}}}`, "both a command and a url"},
		{`{"mcpServers": {"a": {"url": "file:///etc/passwd"}}}`, "want an http:// or https:// URL"},
		{`{"mcpServers": {"a": {"url": "http://h/", "type": "websocket"}}}`, `type "websocket"`},
		{`{"mcpServers": {"a": {"command": "x", "type": "http"}}}`, `type "http" with a command`},
		{`{"mcpServers": {"a": {"command": "x", "args": "-y"}}}`, "args a list of strings"},
		{`{"mcpServers": {"a": {"command": 7}}}`, "command and url are strings"},
		{`{"mcpServers": {"a": {"url": "http://h/", "headers": {"X": "a\r\nEvil: 1"}}}}`, "line break"},
		{`{"mcpServers": {"a": {"url": "http://h/", "headers": {"Bad Name": "1"}}}}`, "header name"},
	} {
		_, err := Parse([]byte(c.doc), "f.json")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %q", c.doc, err, c.want)
		}
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(filepath.Join(dir, "missing.json")); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("missing file: %v", err)
	}
	big := filepath.Join(dir, "big.json")
	if err := os.WriteFile(big, make([]byte, maxConfigBytes+10), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(big); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("big file: %v", err)
	}
	many := `{"mcpServers": {`
	for i := 0; i <= maxServers; i++ {
		if i > 0 {
			many += ","
		}
		many += `"s` + strings.Repeat("x", i) + `": {"command": "x"}`
	}
	many += "}}"
	if _, err := Parse([]byte(many), "many.json"); err == nil || !strings.Contains(err.Error(), "more than the 64") {
		t.Errorf("too many servers: %v", err)
	}
}
