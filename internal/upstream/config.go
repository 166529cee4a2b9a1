// Package upstream connects pysandbox, as an MCP client, to the MCP servers
// an operator lists with --upstream, so that Python code in a run can call
// their tools (see internal/tools' toolRun and the worker's tool messages).
//
// The file uses the mcpServers JSON format of Claude Desktop, Cursor and
// VS Code. Stdio servers are started as children of this process and
// stopped with it; HTTP servers are reached with the Go SDK's streamable
// (or SSE) client. The package lists each server's tools, follows
// notifications/tools/list_changed, restarts a server that exits, and
// makes calls; it decides nothing: the policy, the caps and the audit
// records are the caller's.
package upstream

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strings"
)

// ServerConfig is one entry of the file's mcpServers object.
type ServerConfig struct {
	// Name is the entry's key: code calls tools.NAME.TOOL and the policy
	// names the tools NAME.TOOL.
	Name string
	// Stdio: the command, its arguments, environment additions (to this
	// server's environment) and working directory.
	Command string
	Args    []string
	Env     map[string]string
	Cwd     string
	// HTTP: the endpoint and the headers sent with every request (e.g. a
	// bearer token). Transport is "http" (streamable HTTP) or "sse".
	URL       string
	Headers   map[string]string
	Transport string
	// Err, when set, is why this entry cannot be used (a variable it names
	// is not set, ...): the server is reported as failed with it, and the
	// other servers still work.
	Err string
}

// Config is a parsed --upstream file.
type Config struct {
	Servers []ServerConfig // sorted by name
	// Warnings are what the operator should hear about but that does not
	// stop the server: unknown fields, disabled entries.
	Warnings []string
	Source   string
}

// maxConfigBytes bounds the file: it is a short list of servers.
const maxConfigBytes = 1 << 20

// maxServers bounds the entries of one file.
const maxServers = 64

// serverName is what a server may be called: the policy's SERVER.TOOL
// splits at the first dot, and code reaches it as tools.NAME.
var serverName = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]{0,63}$`)

// Load reads and parses an --upstream file.
func Load(path string) (*Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("upstream servers: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return nil, fmt.Errorf("upstream servers: read %s: %w", path, err)
	}
	if len(data) > maxConfigBytes {
		return nil, fmt.Errorf("upstream servers: %s is larger than %d bytes", path, maxConfigBytes)
	}
	return Parse(data, path)
}

// Parse parses the mcpServers format. A malformed file, or an entry that
// is neither a command nor a URL, is an error: the server must not start
// with a list the operator did not mean. An entry whose variables are not
// set only fails that entry (ServerConfig.Err).
func Parse(data []byte, source string) (*Config, error) {
	fail := func(format string, a ...any) error {
		return fmt.Errorf("upstream servers: %s: %s", source, fmt.Sprintf(format, a...))
	}
	// Editors on some systems write a byte order mark.
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf"))
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fail("not a JSON object: %v", err)
	}
	cfg := &Config{Source: source}
	key := "mcpServers"
	raw, ok := doc["mcpServers"]
	if !ok {
		// VS Code's mcp.json calls the object "servers".
		if raw, ok = doc["servers"]; ok {
			key = "servers"
		}
	}
	if !ok {
		return nil, fail(`no "mcpServers" object; the format is {"mcpServers": {"NAME": {"command": "...", "args": [...]}}} or {"mcpServers": {"NAME": {"url": "https://..."}}}`)
	}
	for k := range doc {
		if k != key {
			cfg.Warnings = append(cfg.Warnings, fmt.Sprintf("field %q is ignored", k))
		}
	}
	var entries map[string]json.RawMessage
	if err := json.Unmarshal(raw, &entries); err != nil {
		return nil, fail("%s: want an object of servers by name: %v", key, err)
	}
	if len(entries) > maxServers {
		return nil, fail("%s: %d servers, more than the %d allowed", key, len(entries), maxServers)
	}
	names := make([]string, 0, len(entries))
	for name := range entries {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if !serverName.MatchString(name) {
			return nil, fail("%s: server name %q: want a letter, then up to 63 letters, digits, _ or - (code calls tools.NAME.TOOL, and the policy names its tools NAME.TOOL)", key, name)
		}
		sc, disabled, warns, err := parseServer(name, entries[name])
		if err != nil {
			return nil, fail("%s.%s: %v", key, name, err)
		}
		for _, w := range warns {
			cfg.Warnings = append(cfg.Warnings, fmt.Sprintf("%s.%s: %s", key, name, w))
		}
		if disabled {
			cfg.Warnings = append(cfg.Warnings, fmt.Sprintf("%s.%s is disabled and not started", key, name))
			continue
		}
		cfg.Servers = append(cfg.Servers, sc)
	}
	return cfg, nil
}

// entry is one server as the file spells it.
type entry struct {
	Type     string            `json:"type"`
	Command  string            `json:"command"`
	Args     []string          `json:"args"`
	Env      map[string]string `json:"env"`
	Cwd      string            `json:"cwd"`
	URL      string            `json:"url"`
	Headers  map[string]string `json:"headers"`
	Disabled bool              `json:"disabled"`
}

// knownFields are the fields an entry may have; others are warned about
// (clients add their own, e.g. Cursor's "autoApprove").
var knownFields = map[string]bool{"type": true, "command": true, "args": true, "env": true, "cwd": true, "url": true,
	"headers": true, "disabled": true}

func parseServer(name string, raw json.RawMessage) (sc ServerConfig, disabled bool, warns []string, err error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return sc, false, nil, fmt.Errorf("want an object: %v", err)
	}
	var unknown []string
	for k := range fields {
		if !knownFields[k] {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	for _, k := range unknown {
		warns = append(warns, fmt.Sprintf("field %q is ignored", k))
	}
	var e entry
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&e); err != nil {
		return sc, false, nil, fmt.Errorf("%v (command and url are strings, args a list of strings, env and headers objects of strings)", err)
	}
	sc.Name = name
	switch {
	case e.Command != "" && e.URL != "":
		return sc, false, nil, fmt.Errorf("has both a command and a url; give one")
	case e.Command != "":
		if e.Type != "" && e.Type != "stdio" {
			return sc, false, nil, fmt.Errorf("type %q with a command; a command is a stdio server", e.Type)
		}
		if len(e.Headers) > 0 {
			warns = append(warns, "headers are for url servers and are ignored")
		}
		sc.Command, sc.Args, sc.Env, sc.Cwd = e.Command, e.Args, e.Env, e.Cwd
	case e.URL != "":
		switch e.Type {
		case "", "http", "streamable-http", "streamableHttp":
			sc.Transport = "http"
		case "sse":
			sc.Transport = "sse"
		default:
			return sc, false, nil, fmt.Errorf("type %q: want http (streamable HTTP) or sse for a url", e.Type)
		}
		if len(e.Env) > 0 || len(e.Args) > 0 || e.Cwd != "" {
			warns = append(warns, "env, args and cwd are for command servers and are ignored")
		}
		sc.URL, sc.Headers = e.URL, e.Headers
	default:
		return sc, false, nil, fmt.Errorf(`has neither a "command" (a stdio server) nor a "url" (an HTTP server)`)
	}
	// ${VAR} and ${env:VAR} (Cursor's spelling) take the value of this
	// server's environment (which stdio servers do not inherit whole), so secrets stay out of the file; an unset one
	// fails this entry only.
	var missing []string
	expand := func(s string) string {
		out, miss := expandVars(s)
		missing = append(missing, miss...)
		return out
	}
	sc.Command, sc.Cwd, sc.URL = expand(sc.Command), expand(sc.Cwd), expand(sc.URL)
	for i, a := range sc.Args {
		sc.Args[i] = expand(a)
	}
	for _, m := range []map[string]string{sc.Env, sc.Headers} {
		for k, v := range m {
			m[k] = expand(v)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		sc.Err = fmt.Sprintf("the file names environment variables that are not set: %s", strings.Join(dedup(missing), ", "))
	}
	if sc.URL != "" && sc.Err == "" {
		u, err := url.Parse(sc.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return sc, false, nil, fmt.Errorf("url %q: want an http:// or https:// URL", sc.URL)
		}
	}
	for k := range sc.Headers {
		if k == "" || strings.ContainsAny(k, " :\r\n\t") {
			return sc, false, nil, fmt.Errorf("header name %q is not valid", k)
		}
	}
	for k, v := range sc.Headers {
		if strings.ContainsAny(v, "\r\n") {
			return sc, false, nil, fmt.Errorf("header %s: a value may not contain a line break", k)
		}
	}
	return sc, e.Disabled, warns, nil
}

var varRef = regexp.MustCompile(`\$\{(env:)?([A-Za-z_][A-Za-z0-9_]*)\}`)

// expandVars replaces ${VAR} and ${env:VAR} with the variable's value and
// returns the names of the unset ones.
func expandVars(s string) (string, []string) {
	var missing []string
	out := varRef.ReplaceAllStringFunc(s, func(m string) string {
		name := varRef.FindStringSubmatch(m)[2]
		v, ok := os.LookupEnv(name)
		if !ok {
			missing = append(missing, name)
		}
		return v
	})
	return out, missing
}

func dedup(s []string) []string {
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}

// Describe says how a server is reached, for logs and check_environment:
// the command or the URL, never the environment or headers (secrets).
func (sc ServerConfig) Describe() string {
	if sc.URL != "" {
		u, err := url.Parse(sc.URL)
		if err == nil {
			u.User = nil
			u.RawQuery = "" // may hold a key
			return sc.Transport + " " + u.String()
		}
		return sc.Transport
	}
	return "command " + sc.Command
}
