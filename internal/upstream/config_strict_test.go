package upstream

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestParseStrict: what a case-blind or last-one-wins reader would have
// obeyed is an error naming its line, and warnings say what happens.
func TestParseStrict(t *testing.T) {
	for _, c := range []struct{ name, file, doc, want string }{
		{"COMMAND", "f.json", `{"mcpServers": {
  "a": {"command": "ok.sh",
        "COMMAND": "evil.sh"}}}`, `upstream servers: f.json: line 3: mcpServers.a.COMMAND: field names are exact: did you mean "command"?`},
		{"Command alone", "f.json", `{"mcpServers": {"a": {"Command": "evil.sh"}}}`, `line 1: mcpServers.a.Command: field names are exact: did you mean "command"?`},
		{"Unicode fold", "f.json", `{"mcpServers": {"a": {"command": "x", "argſ": ["-evil"]}}}`, `mcpServers.a.argſ: field names are exact: did you mean "args"?`},
		{"URL in YAML", "f.yaml", "mcpServers:\n  a:\n    URL: https://evil.example/\n", `upstream servers: f.yaml: line 3: mcpServers.a.URL: field names are exact: did you mean "url"?`},
		{"top-level case", "f.json", `{"MCPServers": {"a": {"command": "x"}}, "servers": {}}`, `MCPServers: field names are exact: did you mean "mcpServers"?`},
		{"server twice", "f.json", `{"mcpServers": {
  "gh": {"url": "https://good.example/mcp"},
  "fs": {"command": "mcp-fs"},
  "gh": {"url": "https://evil.example/mcp"}
}}`, `upstream servers: f.json: line 4: mcpServers.gh: the key appears twice (already defined at line 2)`},
		{"server twice YAML", "f.yml", "mcpServers:\n  gh: {url: https://good.example/mcp}\n  gh: {url: https://evil.example/mcp}\n", `f.yml: line 3: mcpServers.gh: the key appears twice (already defined at line 2)`},
		{"field twice", "f.json", `{"mcpServers": {"a": {"command": "ok", "command": "evil"}}}`, `mcpServers.a.command: the key appears twice`},
		{"second YAML document", "f.yaml", "mcpServers:\n  a: {command: ok}\n---\nmcpServers:\n  a: {command: evil}\n", `f.yaml: line 3: a second YAML document`},
		{"merge key", "f.yaml", "mcpServers:\n  a:\n    <<: {command: evil}\n", `line 3: mcpServers.a: << is YAML's merge key`},
		{"anchor", "f.yaml", "mcpServers:\n  a: &s {command: x}\n  b: *s\n", `line 2: mcpServers.a: an anchor`},
		{"tag", "f.yaml", "mcpServers:\n  a: {command: !sh x}\n", `line 2: mcpServers.a.command: a tag (!sh)`},
		{"header twice by case", "f.json", `{"mcpServers": {"a": {"url": "https://h/", "headers": {"Authorization": "Bearer good", "authorization": "Bearer evil"}}}}`, `header "authorization" is also given as "Authorization"`},
		{"args not a list, line", "f.json", "{\"mcpServers\": {\"a\": {\"command\": \"x\",\n \"args\": \"-y\"}}}", `line 2: mcpServers.a.args: want a list of strings, got a string (command and url are strings`},
		{"env number in YAML", "f.yaml", "mcpServers:\n  a:\n    command: x\n    env:\n      PORT: 8080\n", `line 5: mcpServers.a.env.PORT: want a string, got a number`},
		{"disabled not bool", "f.json", `{"mcpServers": {"a": {"command": "x", "disabled": "yes"}}}`, `mcpServers.a.disabled: want true or false`},
		{"list", "f.yaml", "- a\n", "not a JSON object"},
		{"empty", "f.json", "", "the file is empty"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := Parse([]byte(c.doc), c.file)
			if err == nil {
				t.Fatalf("accepted %s as %+v", c.doc, cfg)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error\n%v\nwant it to contain\n%s", err, c.want)
			}
		})
	}
}

func TestParseWarningsTellTheTruth(t *testing.T) {
	cfg, err := Parse([]byte(`{
  "mcpServers": {
    "a": {"command": "x", "autoApprove": ["t"], "headers": {"X": "1"}},
    "off": {"url": "https://h/", "disabled": true}
  },
  "servers": {"b": {"command": "y"}},
  "globalShortcut": "x"
}`), "f.json")
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Servers) != 1 || cfg.Servers[0].Name != "a" || cfg.Servers[0].Command != "x" {
		t.Errorf("servers %+v", cfg.Servers)
	}
	want := []string{
		`line 7: field "globalShortcut" is ignored`,
		`line 6: field "servers" is ignored (the servers are those of "mcpServers")`,
		`line 3: mcpServers.a: field "autoApprove" is ignored`,
		`line 3: mcpServers.a: headers are for url servers and are ignored`,
		`line 4: mcpServers.off is disabled and not started`,
	}
	if !reflect.DeepEqual(cfg.Warnings, want) {
		t.Errorf("warnings\n%s\nwant\n%s", strings.Join(cfg.Warnings, "\n"), strings.Join(want, "\n"))
	}
}

// TestParseYAML: the same servers in YAML, chosen by the name or by the
// content, are the same Config as in JSON.
func TestParseYAML(t *testing.T) {
	t.Setenv("UPSTREAM_TEST_TOKEN", "s3cret")
	j := `{"mcpServers": {
  "memory": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-memory"], "env": {"MEMORY_FILE_PATH": "/tmp/m.json"}},
  "gh": {"url": "https://api.example.com/mcp", "headers": {"Authorization": "Bearer ${UPSTREAM_TEST_TOKEN}"}},
  "legacy": {"type": "sse", "url": "http://127.0.0.1:9/sse"},
  "off": {"command": "x", "disabled": true}
}}`
	y := `# upstream MCP servers
mcpServers:
  memory:
    command: npx
    args: [-y, "@modelcontextprotocol/server-memory"]
    env: {MEMORY_FILE_PATH: /tmp/m.json}
  gh:
    url: https://api.example.com/mcp
    headers:
      Authorization: Bearer ${UPSTREAM_TEST_TOKEN}
  legacy: {type: sse, url: "http://127.0.0.1:9/sse"}
  off: {command: x, disabled: true}
`
	cj, err := Parse([]byte(j), "u.json")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, name := range []string{"u.yaml", "u.yml", "upstreams"} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
		cy, err := Load(path)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(cj.Servers, cy.Servers) {
			t.Errorf("%s: YAML and JSON differ:\n%+v\n%+v", name, cj.Servers, cy.Servers)
		}
		if len(cy.Warnings) != 1 || !strings.Contains(cy.Warnings[0], "mcpServers.off is disabled") {
			t.Errorf("%s: warnings %q", name, cy.Warnings)
		}
	}
	if len(cj.Servers) != 3 || cj.Servers[0].Headers["Authorization"] != "Bearer s3cret" {
		t.Errorf("%+v", cj.Servers)
	}
}
