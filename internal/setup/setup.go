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
)

// Entry is what the client runs: this binary, serve, and flags.
type Entry struct {
	Name    string   // the server's name in the client, "pysandbox"
	Command string   // absolute path of the binary
	Args    []string // "serve" and the flags
}

// Client is one MCP client's configuration format and place.
type Client struct {
	ID, Title string
	// Path is the user-level config file, for the OS and home directory
	// (and %APPDATA% on Windows).
	Path func(goos, home, appData string) string
	// Key is the JSON object holding servers ("mcpServers", "servers");
	// "" for TOML (Codex).
	Key string
	// Type adds "type": "stdio" to an entry (VS Code, Claude Code).
	Type bool
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

// Clients are the supported clients, by ID.
var Clients = map[string]Client{
	"claude-code": {ID: "claude-code", Title: "Claude Code", Key: "mcpServers", Type: true,
		Path: func(_, home, _ string) string { return joinHome(home, ".claude.json") },
		Command: func(e Entry) string {
			return "claude mcp add --scope user " + shellQuote(e.Name) + " -- " + shellQuote(e.Command) + " " + shellJoin(e.Args)
		}},
	"claude-desktop": {ID: "claude-desktop", Title: "Claude Desktop", Key: "mcpServers",
		Path: func(goos, home, appData string) string {
			return filepath.Join(appSupport(goos, home, appData, "Claude"), "claude_desktop_config.json")
		}},
	"cursor": {ID: "cursor", Title: "Cursor", Key: "mcpServers",
		Path: func(_, home, _ string) string { return joinHome(home, ".cursor", "mcp.json") }},
	"vscode": {ID: "vscode", Title: "VS Code", Key: "servers", Type: true,
		Path: func(goos, home, appData string) string {
			return filepath.Join(appSupport(goos, home, appData, "Code"), "User", "mcp.json")
		}},
	"codex": {ID: "codex", Title: "Codex",
		Path: func(_, home, _ string) string { return joinHome(home, ".codex", "config.toml") }},
	"gemini": {ID: "gemini", Title: "Gemini CLI", Key: "mcpServers",
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

func jsonEntry(c Client, e Entry) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if c.Type {
		enc.Encode(struct {
			Type    string   `json:"type"`
			Command string   `json:"command"`
			Args    []string `json:"args"`
		}{"stdio", e.Command, e.Args})
	} else {
		enc.Encode(struct {
			Command string   `json:"command"`
			Args    []string `json:"args"`
		}{e.Command, e.Args})
	}
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

// Result says what Write did.
type Result struct {
	Path, Backup string
	Changed      bool
}

// Write merges the entry into the file at path (created with its
// directories when missing), leaving path+".bak" with the old content
// when it changes anything.
func (c Client) Write(path string, e Entry) (Result, error) {
	// A config file that is a symbolic link (a dotfile manager's) is
	// updated where it points, and stays a link.
	if target, err := filepath.EvalSymlinks(path); err == nil {
		path = target
	}
	r := Result{Path: path}
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return r, fmt.Errorf("setup: %w", err)
	}
	merged, err := c.Merge(old, e)
	if err != nil {
		return r, fmt.Errorf("%w: %s: %v; add the entry by hand:\n%s", ErrUnparsable, path, err, c.Snippet(e))
	}
	if bytes.Equal(old, merged) {
		return r, nil
	}
	mode := os.FileMode(0o600)
	dir := filepath.Dir(path)
	if st, err := os.Stat(path); err == nil {
		mode = st.Mode().Perm()
		r.Backup = path + ".bak"
		if err := writeNew(dir, r.Backup, old, mode); err != nil {
			return r, fmt.Errorf("setup: backup: %w", err)
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return r, fmt.Errorf("setup: %w", err)
	}
	if err := writeNew(dir, path, merged, mode); err != nil {
		return r, fmt.Errorf("setup: %w", err)
	}
	r.Changed = true
	return r, nil
}

// writeNew puts data at path through a file of its own (created
// exclusively, with mode, in dir) renamed into place: nothing already
// lying there (a stray temporary file, a symbolic link where the backup
// goes) is written through or lends its mode.
func writeNew(dir, path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(dir, ".pysandbox-setup-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			os.Remove(tmp)
		}
	}()
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	ok = true
	return nil
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
