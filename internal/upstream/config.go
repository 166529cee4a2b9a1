// Package upstream connects pysandbox, as an MCP client, to the MCP servers
// an operator lists with --upstream, so that Python code in a run can call
// their tools (see internal/tools' toolRun and the worker's tool messages).
//
// The file uses the mcpServers JSON format of Claude Desktop, Cursor and
// VS Code, in JSON or the same in YAML. Stdio servers are started as children of this process and
// stopped with it; HTTP servers are reached with the Go SDK's streamable
// (or SSE) client. The package lists each server's tools, follows
// notifications/tools/list_changed, restarts a server that exits, and
// makes calls; it decides nothing: the policy, the caps and the audit
// records are the caller's.
package upstream

import (
	"fmt"
	"io"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strings"

	"github.com/pysandbox/pysandbox/internal/confdoc"
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

// Parse parses the mcpServers format, in JSON or YAML (a .yaml or .yml
// source, or content that does not start with '{'), read strictly (see
// internal/confdoc): one document, no key twice (a server named twice is
// an error, not the last one), no YAML merge keys, anchors or tags. A
// malformed file, or an entry that is neither a command nor a URL, is an
// error naming its line: the server must not start with a list the
// operator did not mean. Field names are exact; a field this package does
// not know is a warning (clients add their own), but one that differs
// from a known field only by case ("COMMAND") is an error, since a
// case-blind reader would have obeyed it. An entry whose variables are
// not set only fails that entry (ServerConfig.Err).
func Parse(data []byte, source string) (*Config, error) {
	doc, err := confdoc.Decode(data, source)
	if err != nil {
		return nil, wrapErr(err)
	}
	fail := func(field, format string, a ...any) error {
		return wrapErr(doc.Errorf(field, format, a...))
	}
	root, ok := doc.Root.(map[string]any)
	if !ok {
		return nil, fail("", `not a JSON object (nor a YAML mapping) but %s; the format is {"mcpServers": {"NAME": {"command": "...", "args": [...]}}}`, kind(doc.Root))
	}
	cfg := &Config{Source: source}
	warn := func(field, format string, a ...any) {
		cfg.Warnings = append(cfg.Warnings, fmt.Sprintf("line %d: ", doc.Line(field))+fmt.Sprintf(format, a...))
	}
	key := "mcpServers"
	raw, ok := root["mcpServers"]
	if !ok {
		// VS Code's mcp.json calls the object "servers".
		if raw, ok = root["servers"]; ok {
			key = "servers"
		}
	}
	for _, k := range sortedKeys(root) {
		if known := folded(k, "mcpServers", "servers"); known != "" && known != k {
			return nil, fail(k, "field names are exact: did you mean %q? (a reader that ignores case would use this field)", known)
		}
	}
	if !ok {
		return nil, fail("", `no "mcpServers" object; the format is {"mcpServers": {"NAME": {"command": "...", "args": [...]}}} or {"mcpServers": {"NAME": {"url": "https://..."}}}`)
	}
	for _, k := range sortedKeys(root) {
		switch {
		case k == key:
		case k == "servers":
			warn(k, "field %q is ignored (the servers are those of %q)", k, key)
		default:
			warn(k, "field %q is ignored", k)
		}
	}
	var entries map[string]any
	switch e := raw.(type) {
	case map[string]any:
		entries = e
	case nil: // every entry commented out
	default:
		return nil, fail(key, "want an object of servers by name, got %s", kind(raw))
	}
	if len(entries) > maxServers {
		return nil, fail(key, "%d servers, more than the %d allowed", len(entries), maxServers)
	}
	for _, name := range sortedKeys(entries) {
		field := key + "." + name
		if !serverName.MatchString(name) {
			return nil, fail(field, "server name %q: want a letter, then up to 63 letters, digits, _ or - (code calls tools.NAME.TOOL, and the policy names its tools NAME.TOOL)", name)
		}
		sc, disabled, err := parseServer(doc, field, name, entries[name], warn)
		if err != nil {
			return nil, wrapErr(err)
		}
		if disabled {
			warn(field, "%s is disabled and not started", field)
			continue
		}
		cfg.Servers = append(cfg.Servers, sc)
	}
	return cfg, nil
}

// wrapErr prefixes a file error as the server logs it.
func wrapErr(err error) error { return fmt.Errorf("upstream servers: %w", err) }

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// folded returns the one of known that k equals ignoring case, as
// encoding/json matches field names (Unicode simple folding: "argſ" is
// "args" to it), or "".
func folded(k string, known ...string) string {
	for _, f := range known {
		if strings.EqualFold(k, f) {
			return f
		}
	}
	return ""
}

func kind(x any) string {
	switch x.(type) {
	case nil:
		return "nothing (null)"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case []any:
		return "a list"
	case map[string]any:
		return "an object"
	}
	return "a number"
}

// knownFields are the fields an entry may have; others are warned about
// (clients add their own, e.g. Cursor's "autoApprove").
var knownFields = []string{"type", "command", "args", "env", "cwd", "url", "headers", "disabled"}

// typeHint ends the errors of a field of the wrong type.
const typeHint = "(command and url are strings, args a list of strings, env and headers objects of strings)"

func parseServer(doc *confdoc.Doc, field, name string, raw any, warn func(field, format string, a ...any)) (sc ServerConfig, disabled bool, err error) {
	fields, ok := raw.(map[string]any)
	if !ok {
		return sc, false, doc.Errorf(field, "want an object, got %s", kind(raw))
	}
	for _, k := range sortedKeys(fields) {
		switch known := folded(k, knownFields...); {
		case known == k:
		case known != "":
			return sc, false, doc.Errorf(field+"."+k, "field names are exact: did you mean %q? (a reader that ignores case would use this field)", known)
		default:
			warn(field+"."+k, "%s: field %q is ignored", field, k)
		}
	}
	// Each field is its type or absent (null is absent).
	str := func(k string) (string, error) {
		switch v := fields[k].(type) {
		case nil:
			return "", nil
		case string:
			return v, nil
		default:
			return "", doc.Errorf(field+"."+k, "want a string, got %s %s", kind(v), typeHint)
		}
	}
	strs := func(k string) ([]string, error) {
		switch v := fields[k].(type) {
		case nil:
			return nil, nil
		case []any:
			out := make([]string, len(v))
			for i, x := range v {
				s, ok := x.(string)
				if !ok {
					return nil, doc.Errorf(fmt.Sprintf("%s.%s[%d]", field, k, i), "want a string, got %s %s", kind(x), typeHint)
				}
				out[i] = s
			}
			return out, nil
		default:
			return nil, doc.Errorf(field+"."+k, "want a list of strings, got %s %s", kind(v), typeHint)
		}
	}
	strMap := func(k string) (map[string]string, error) {
		switch v := fields[k].(type) {
		case nil:
			return nil, nil
		case map[string]any:
			out := make(map[string]string, len(v))
			for _, mk := range sortedKeys(v) {
				s, ok := v[mk].(string)
				if !ok {
					return nil, doc.Errorf(field+"."+k+"."+mk, "want a string, got %s %s", kind(v[mk]), typeHint)
				}
				out[mk] = s
			}
			return out, nil
		default:
			return nil, doc.Errorf(field+"."+k, "want an object of strings, got %s %s", kind(v), typeHint)
		}
	}
	var e struct {
		Type, Command, Cwd, URL string
		Args                    []string
		Env, Headers            map[string]string
	}
	for k, dst := range map[string]*string{"type": &e.Type, "command": &e.Command, "cwd": &e.Cwd, "url": &e.URL} {
		if *dst, err = str(k); err != nil {
			return sc, false, err
		}
	}
	if e.Args, err = strs("args"); err != nil {
		return sc, false, err
	}
	if e.Env, err = strMap("env"); err != nil {
		return sc, false, err
	}
	if e.Headers, err = strMap("headers"); err != nil {
		return sc, false, err
	}
	switch v := fields["disabled"].(type) {
	case nil:
	case bool:
		disabled = v
	default:
		return sc, false, doc.Errorf(field+".disabled", "want true or false, got %s", kind(v))
	}
	sc.Name = name
	switch {
	case e.Command != "" && e.URL != "":
		return sc, false, doc.Errorf(field, "has both a command and a url; give one")
	case e.Command != "":
		if e.Type != "" && e.Type != "stdio" {
			return sc, false, doc.Errorf(field+".type", "type %q with a command; a command is a stdio server", e.Type)
		}
		if len(e.Headers) > 0 {
			warn(field+".headers", "%s: headers are for url servers and are ignored", field)
		}
		sc.Command, sc.Args, sc.Env, sc.Cwd = e.Command, e.Args, e.Env, e.Cwd
	case e.URL != "":
		switch e.Type {
		case "", "http", "streamable-http", "streamableHttp":
			sc.Transport = "http"
		case "sse":
			sc.Transport = "sse"
		default:
			return sc, false, doc.Errorf(field+".type", "type %q: want http (streamable HTTP) or sse for a url", e.Type)
		}
		if len(e.Env) > 0 || len(e.Args) > 0 || e.Cwd != "" {
			warn(field, "%s: env, args and cwd are for command servers and are ignored", field)
		}
		sc.URL, sc.Headers = e.URL, e.Headers
	default:
		return sc, false, doc.Errorf(field, `has neither a "command" (a stdio server) nor a "url" (an HTTP server)`)
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
			return sc, false, doc.Errorf(field+".url", "url %q: want an http:// or https:// URL", sc.URL)
		}
	}
	// A header is set by its name ignoring case: two names that differ
	// only by case would leave which value is sent to chance.
	seen := map[string]string{}
	for _, k := range sortedKeys(anyMap(sc.Headers)) {
		f := field + ".headers." + k
		if k == "" || strings.ContainsAny(k, " :\r\n\t") {
			return sc, false, doc.Errorf(f, "header name %q is not valid", k)
		}
		if strings.ContainsAny(sc.Headers[k], "\r\n") {
			return sc, false, doc.Errorf(f, "header %s: a value may not contain a line break", k)
		}
		lower := strings.ToLower(k)
		if other, dup := seen[lower]; dup {
			return sc, false, doc.Errorf(f, "header %q is also given as %q; header names ignore case, so give it once", k, other)
		}
		seen[lower] = k
	}
	return sc, disabled, nil
}

func anyMap(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
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
