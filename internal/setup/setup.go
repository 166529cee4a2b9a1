// Package setup puts pysandbox into an MCP client's configuration
// (`pysandbox setup CLIENT`): it prints the exact entry for this binary,
// and with Write merges it into the client's file at its documented
// location, keeping every other entry and the file's layout where it can,
// idempotently, with a backup.
package setup

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"
)

// Entry is what the client runs: this binary, serve, and flags; or, with
// URL, the running server it reaches over streamable HTTP.
type Entry struct {
	Name    string   // the server's name in the client, "pysandbox"
	Command string   // absolute path of the binary
	Args    []string // "serve" and the flags
	// URL is a server's streamable HTTP endpoint (http(s)://HOST/mcp);
	// with it, Command and Args are unused.
	URL string
	// Headers go with every request to URL (the bearer token).
	Headers []Header
	// ToolTimeout is how long the client waits for a tool call, where its
	// file has a setting for it; 0 leaves the client's default.
	ToolTimeout time.Duration
}

// Header is an HTTP header of an Entry.
type Header struct{ Name, Value string }

// Client is one MCP client's configuration format and place.
type Client struct {
	ID, Title string
	// Path is the user-level config file, for the OS and home directory
	// (and %APPDATA% on Windows).
	Path func(goos, home, appData string) string
	// Key is the JSON object holding servers ("mcpServers", "servers");
	// "" for TOML (Codex).
	Key string
	// Type adds "type": "stdio" or "http" to an entry (VS Code, Claude
	// Code).
	Type bool
	// URLKey is the key of a streamable HTTP server's URL in the client's
	// entry ("url"; Gemini CLI's "httpUrl"); "" when its file has no HTTP
	// entry, and NoHTTP says what to do instead.
	URLKey, NoHTTP string
	// TimeoutMSKey is the key of the entry's tool-call timeout in
	// milliseconds, when the client has one (Gemini CLI's "timeout").
	// Codex's, in seconds, is in its TOML table.
	TimeoutMSKey string
	// Command is a shell command that does the same, when the client has
	// one (Claude Code's claude mcp add).
	Command func(e Entry) string
}

func joinHome(home string, parts ...string) string {
	return filepath.Join(append([]string{home}, parts...)...)
}

// appSupport is the per-user application directory of an app (Claude,
// Code) on each OS.
func appSupport(goos, home, appData, app string) string {
	switch goos {
	case "darwin":
		return joinHome(home, "Library", "Application Support", app)
	case "windows":
		return filepath.Join(appData, app)
	}
	return joinHome(home, ".config", app)
}

// Clients are the supported clients, by ID. The formats, HTTP entries and
// timeouts are as each client documents them:
//
//   - Claude Code: https://code.claude.com/docs/en/mcp ("type": "http",
//     "url", "headers"; claude mcp add --transport http ... --header). Its
//     tool-call timeout is the MCP_TOOL_TIMEOUT environment variable, not
//     a setting of the entry.
//   - Claude Desktop: claude_desktop_config.json holds local servers only;
//     remote ones are added under Settings > Connectors
//     (https://support.anthropic.com/en/articles/11503834), without
//     static headers.
//   - Cursor: https://cursor.com/docs/mcp ("url", "headers").
//   - VS Code: https://code.visualstudio.com/docs/copilot/reference/mcp-configuration
//     ("type": "http", "url", "headers").
//   - Codex: https://github.com/openai/codex/blob/main/docs/config.md
//     (url, http_headers; tool_timeout_sec, default 60 s).
//   - Gemini CLI: https://github.com/google-gemini/gemini-cli/blob/main/docs/tools/mcp-server.md
//     ("httpUrl", "headers"; "timeout" in ms, default 600,000).
var Clients = map[string]Client{
	"claude-code": {ID: "claude-code", Title: "Claude Code", Key: "mcpServers", Type: true, URLKey: "url",
		Path: func(_, home, _ string) string { return joinHome(home, ".claude.json") },
		Command: func(e Entry) string {
			if e.URL != "" {
				cmd := "claude mcp add --scope user --transport http " + shellQuote(e.Name) + " " + shellQuote(e.URL)
				for _, h := range e.Headers {
					cmd += " --header " + shellQuote(h.Name+": "+h.Value)
				}
				return cmd
			}
			return "claude mcp add --scope user " + shellQuote(e.Name) + " -- " + shellQuote(e.Command) + " " + shellJoin(e.Args)
		}},
	"claude-desktop": {ID: "claude-desktop", Title: "Claude Desktop", Key: "mcpServers",
		NoHTTP: "Claude Desktop does not read remote servers from claude_desktop_config.json: add the URL under Settings > Connectors > Add custom connector (it connects from Anthropic's cloud, without auth or with OAuth, not with a token header), or give it a local server (setup claude-desktop without --url)",
		Path: func(goos, home, appData string) string {
			return filepath.Join(appSupport(goos, home, appData, "Claude"), "claude_desktop_config.json")
		}},
	"cursor": {ID: "cursor", Title: "Cursor", Key: "mcpServers", URLKey: "url",
		Path: func(_, home, _ string) string { return joinHome(home, ".cursor", "mcp.json") }},
	"vscode": {ID: "vscode", Title: "VS Code", Key: "servers", Type: true, URLKey: "url",
		Path: func(goos, home, appData string) string {
			return filepath.Join(appSupport(goos, home, appData, "Code"), "User", "mcp.json")
		}},
	"codex": {ID: "codex", Title: "Codex", URLKey: "url",
		Path: func(_, home, _ string) string { return joinHome(home, ".codex", "config.toml") }},
	"gemini": {ID: "gemini", Title: "Gemini CLI", Key: "mcpServers", URLKey: "httpUrl", TimeoutMSKey: "timeout",
		Path: func(_, home, _ string) string { return joinHome(home, ".gemini", "settings.json") }},
}

// IDs lists the clients' IDs, sorted.
func IDs() []string {
	var out []string
	for id := range Clients {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// DefaultPath is c's config file for this user on this OS.
func (c Client) DefaultPath() (string, error) {
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("setup: no home directory: %w", err)
	}
	return c.Path(runtime.GOOS, home, os.Getenv("APPDATA")), nil
}

// Snippet is the entry as it goes into c's file: a JSON object (with the
// key holding servers around it) or a TOML table.
func (c Client) Snippet(e Entry) string {
	if c.Key == "" {
		return tomlTable(e)
	}
	b := jsonEntry(c, e)
	var out bytes.Buffer
	fmt.Fprintf(&out, "{\n  %q: {\n    %q: ", c.Key, e.Name)
	json.Indent(&out, b, "    ", "  ")
	out.WriteString("\n  }\n}\n")
	return out.String()
}

// jsonEntry is the entry's JSON object, compact, its keys in the order
// the clients' documentation shows them.
func jsonEntry(c Client, e Entry) []byte {
	var o orderedObject
	if e.URL != "" {
		if c.Type {
			o.add("type", "http")
		}
		o.add(c.URLKey, e.URL)
		if len(e.Headers) > 0 {
			var h orderedObject
			for _, x := range e.Headers {
				h.add(x.Name, x.Value)
			}
			o.addRaw("headers", h.bytes())
		}
	} else {
		if c.Type {
			o.add("type", "stdio")
		}
		o.add("command", e.Command)
		o.add("args", e.Args)
	}
	if c.TimeoutMSKey != "" && e.ToolTimeout > 0 {
		o.add(c.TimeoutMSKey, e.ToolTimeout.Milliseconds())
	}
	return o.bytes()
}

// orderedObject builds a JSON object whose keys keep their order.
type orderedObject struct{ b bytes.Buffer }

func (o *orderedObject) add(k string, v any) { o.addRaw(k, marshal(v)) }

func (o *orderedObject) addRaw(k string, raw []byte) {
	if o.b.Len() == 0 {
		o.b.WriteByte('{')
	} else {
		o.b.WriteByte(',')
	}
	o.b.Write(marshal(k))
	o.b.WriteByte(':')
	o.b.Write(raw)
}

func (o *orderedObject) bytes() []byte {
	if o.b.Len() == 0 {
		return []byte("{}")
	}
	return append(o.b.Bytes(), '}')
}

// marshal is v as JSON, with <, > and & as they are (paths and URLs
// read as written).
func marshal(v any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
	return bytes.TrimSpace(b.Bytes())
}

// ErrUnparsable: the existing file is not what its client reads (or has
// comments, which a merge would lose); nothing was written.
var ErrUnparsable = errors.New("setup: the existing file does not parse")

// Merge returns data with the entry added or replaced. Other entries and
// keys keep their order and content.
func (c Client) Merge(data []byte, e Entry) ([]byte, error) {
	if c.Key == "" {
		return mergeTOML(data, e)
	}
	return mergeJSON(data, c, e)
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=:,@+", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func shellJoin(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = shellQuote(a)
	}
	return strings.Join(q, " ")
}
