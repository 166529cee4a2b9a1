package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/pysandbox/pysandbox/internal/confdoc"
)

// MaxFileBytes caps a policy file; real ones are a few hundred bytes.
const MaxFileBytes = 1 << 20

// Load reads and parses a policy file. YAML is accepted for .yaml and .yml
// files and for any file that does not start with '{'. The rules that can
// never take effect are in the policy's Warnings, for the caller to log.
func Load(path string, tools []string) (*Policy, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("policy: read %s: %w", path, err)
	}
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("policy: %s is larger than %d bytes; that is not a policy file", path, MaxFileBytes)
	}
	p, err := Parse(data, filepath.Base(path), tools)
	if err != nil {
		return nil, err
	}
	p.Source = path
	return p, nil
}

// Error is a policy file problem, naming the field and its line.
type Error struct {
	File  string
	Line  int    // 0: none in particular
	Field string // e.g. tools.run_python.limits[0].window; "" for the whole file
	Msg   string
}

// Error reads "policy FILE: line N: FIELD: MSG".
func (e *Error) Error() string {
	return "policy " + (&confdoc.Error{File: e.File, Line: e.Line, Field: e.Field, Msg: e.Msg}).Error()
}

// Parse parses a policy. name labels errors; tools are the tool names this
// server has, which the policy may name. Rules that parse but can never
// take effect are not errors: they are listed in the policy's Warnings.
// JSON and YAML are read strictly and alike (see internal/confdoc): one
// document, no duplicate keys, no YAML merge keys, anchors or tags.
func Parse(data []byte, name string, tools []string) (*Policy, error) {
	sum := sha256.Sum256(data)
	doc, err := confdoc.Decode(data, name)
	if err != nil {
		var ce *confdoc.Error
		if errors.As(err, &ce) {
			return nil, &Error{File: name, Line: ce.Line, Field: ce.Field, Msg: ce.Msg}
		}
		return nil, &Error{File: name, Msg: err.Error()}
	}
	p := &Policy{SHA256: hex.EncodeToString(sum[:])}
	v := &validator{file: name, tools: tools}
	v.policy(doc.Root, p)
	if v.err != nil {
		// Name the line of the field the validator stopped at.
		if pe, ok := v.err.(*Error); ok && pe.Line == 0 {
			pe.Line = doc.Line(pe.Field)
		}
		return nil, v.err
	}
	p.Warnings = p.warnings()
	return p, nil
}

func joinField(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// validator walks the decoded document, filling a Policy and keeping the
// first error.
type validator struct {
	file  string
	tools []string
	err   error
}

func (v *validator) fail(field, format string, args ...any) {
	if v.err == nil {
		v.err = &Error{File: v.file, Field: field, Msg: fmt.Sprintf(format, args...)}
	}
}

// object checks that x is an object with only the allowed keys.
func (v *validator) object(field string, x any, allowed ...string) map[string]any {
	m, ok := x.(map[string]any)
	if !ok {
		v.fail(field, "want an object, got %s", kind(x))
		return nil
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if slices.Contains(allowed, k) || field == "tools" && knownTool(k, allowed) {
			continue
		}
		if field == "tools" {
			if server, rest, ok := strings.Cut(k, "."); ok && slices.Contains(allowed, UpstreamPattern(server)) && strings.ContainsAny(rest, "*?[") {
				v.fail(joinField(field, k), "a rule names one upstream tool (%s.TOOL) or all of its tools (%s.*); other patterns are not supported", server, server)
				continue
			}
			if server, _, ok := strings.Cut(k, "."); ok {
				v.fail(joinField(field, k), "this server has no upstream named %q (upstream tools are named SERVER.TOOL or SERVER.*, for the servers of --upstream); its tools are %s", server, strings.Join(allowed, ", "))
				continue
			}
			v.fail(joinField(field, k), "this server has no such tool; its tools are %s", strings.Join(allowed, ", "))
		} else {
			v.fail(joinField(field, k), "unknown field; the fields here are %s", strings.Join(allowed, ", "))
		}
	}
	return m
}

func (v *validator) str(field string, x any) (string, bool) {
	s, ok := x.(string)
	if !ok {
		v.fail(field, "want a string, got %s", kind(x))
	}
	return s, ok
}

func (v *validator) policy(doc any, p *Policy) {
	m := v.object("", doc, "version", "default", "hide", "all_tools", "tools", "packages", "python", "quotas", "network", "upstream")
	if m == nil {
		return
	}
	switch ver := m["version"].(type) {
	case nil:
		v.fail("version", `missing; want "1"`)
	case string:
		p.Version = ver
	case json.Number:
		p.Version = ver.String()
	case int:
		p.Version = fmt.Sprint(ver)
	default:
		v.fail("version", `want "1", got %s`, kind(ver))
	}
	if p.Version != "" && p.Version != "1" {
		v.fail("version", `%q is not supported; want "1"`, p.Version)
	}
	// No default means deny: a policy file exists to restrict, and
	// failing closed is the safe reading of an omission.
	p.Default = Deny
	if d, ok := m["default"]; ok {
		p.Default = v.action("default", d)
	}
	p.Tools = map[string]*ToolRule{}
	if t, ok := m["tools"]; ok {
		tm := v.object("tools", t, v.tools...)
		names := make([]string, 0, len(tm))
		for name := range tm {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			if knownTool(name, v.tools) {
				p.Tools[name] = v.tool("tools."+name, tm[name])
			}
		}
	}
	if h, ok := m["hide"]; ok {
		p.Hide = v.hide("hide", h)
	}
	if a, ok := m["all_tools"]; ok {
		p.AllTools = v.allTools("all_tools", a)
	}
	if py, ok := m["python"]; ok {
		p.Python = v.python("python", py)
	}
	if pk, ok := m["packages"]; ok {
		p.Packages = v.packages("packages", pk)
	}
	if q, ok := m["quotas"]; ok {
		p.Quotas = v.quotas("quotas", q)
	}
	if n, ok := m["network"]; ok {
		p.Network = v.network("network", n)
	}
	if u, ok := m["upstream"]; ok {
		p.Upstream = v.upstream("upstream", u)
	}
}

// Quotas are per-identity bounds on what a caller holds at once. A zero
// field means the server's flag applies.
type Quotas struct {
	QuotaLimits
	// Identities override the defaults for named callers (token names).
	Identities map[string]QuotaLimits `json:"identities,omitempty"`
}

// QuotaLimits bound one identity: runs executing, runs waiting, sessions.
type QuotaLimits struct {
	Runs     int `json:"runs,omitempty"`
	Queue    int `json:"queue,omitempty"`
	Sessions int `json:"sessions,omitempty"`
}

func (v *validator) quotas(field string, x any) *Quotas {
	m := v.object(field, x, "runs", "queue", "sessions", "identities")
	q := &Quotas{}
	if m == nil {
		return q
	}
	q.QuotaLimits = v.quotaLimits(field, m)
	if ids, ok := m["identities"]; ok {
		im, ok := ids.(map[string]any)
		if !ok {
			v.fail(field+".identities", "want an object of identity names, got %s", kind(ids))
			return q
		}
		q.Identities = map[string]QuotaLimits{}
		for name, lim := range im {
			f := field + ".identities." + name
			if name == "" || len(name) > 200 {
				v.fail(f, "want an identity name of 1 to 200 characters")
				continue
			}
			lm := v.object(f, lim, "runs", "queue", "sessions")
			if lm != nil {
				q.Identities[name] = v.quotaLimits(f, lm)
			}
		}
	}
	return q
}

func (v *validator) quotaLimits(field string, m map[string]any) QuotaLimits {
	var l QuotaLimits
	for key, dst := range map[string]*int{"runs": &l.Runs, "queue": &l.Queue, "sessions": &l.Sessions} {
		x, ok := m[key]
		if !ok {
			continue
		}
		n, ok := integer(x)
		if !ok || n < 0 || n > 100_000 {
			v.fail(joinField(field, key), "want a whole number from 0 to 100000 (0: the server's flag applies)")
			continue
		}
		*dst = int(n)
	}
	return l
}

func (v *validator) action(field string, x any) Action {
	s, ok := v.str(field, x)
	if !ok {
		return Deny
	}
	switch a := Action(s); a {
	case Allow, Deny, Approve:
		return a
	}
	v.fail(field, "%q is not an action; want allow, deny or approve", s)
	return Deny
}

func (v *validator) tool(field string, x any) *ToolRule {
	m := v.object(field, x, "action", "reason", "limits", "by", "require", "deny_if", "approve_if")
	// A listed tool without an action is allowed (with its limits): that
	// is how gateway policies write "allowed, but rate-limited".
	r := &ToolRule{Action: Allow}
	if m == nil {
		return r
	}
	if a, ok := m["action"]; ok {
		r.Action = v.action(field+".action", a)
	}
	if s, ok := m["reason"]; ok {
		r.Reason, _ = v.str(field+".reason", s)
		if len(r.Reason) > 1000 {
			v.fail(field+".reason", "longer than 1000 characters")
		}
	}
	if b, ok := m["by"]; ok {
		r.By, _ = v.str(field+".by", b)
		switch {
		case r.By != ApproveByUser && r.By != ApproveByOperator:
			v.fail(field+".by", "%q is not who approves; want user (the agent's user, asked through MCP) or operator (in the console)", r.By)
		case r.Action != Approve:
			v.fail(field+".by", "says who approves, so it goes with action: approve")
		}
	}
	if x, ok := m["require"]; ok {
		r.Require = v.rules(field+".require", x, "require")
	}
	if x, ok := m["deny_if"]; ok {
		r.DenyIf = v.rules(field+".deny_if", x, "deny_if")
	}
	if x, ok := m["approve_if"]; ok {
		r.ApproveIf = v.rules(field+".approve_if", x, "approve_if")
	}
	if l, ok := m["limits"]; ok {
		list, ok := l.([]any)
		if !ok {
			v.fail(field+".limits", "want a list, got %s", kind(l))
			return r
		}
		for i, item := range list {
			r.Limits = append(r.Limits, v.limit(fmt.Sprintf("%s.limits[%d]", field, i), item))
		}
	}
	return r
}

var windows = map[string]time.Duration{"second": time.Second, "minute": time.Minute, "hour": time.Hour, "day": 24 * time.Hour}

// maxLimit bounds max: beyond it a limit limits nothing, and the bound
// keeps the arithmetic far from overflow.
const maxLimit = 1_000_000_000

func (v *validator) limit(field string, x any) Limit {
	m := v.object(field, x, "counter", "window", "max", "scope")
	l := Limit{Scope: ScopeGlobal}
	if m == nil {
		return l
	}
	if c, ok := m["counter"]; ok {
		l.Counter, _ = v.str(field+".counter", c)
	}
	if l.Counter == "" || len(l.Counter) > 200 {
		v.fail(field+".counter", "want a counter name of 1 to 200 characters")
	}
	w, _ := v.str(field+".window", m["window"])
	if d, ok := windows[w]; ok {
		l.Window, l.Period = w, d
	} else {
		v.fail(field+".window", "%q is not a window; want second, minute, hour or day", w)
	}
	n, ok := integer(m["max"])
	if !ok || n < 1 || n > maxLimit {
		v.fail(field+".max", "want a whole number from 1 to %d, got %s", maxLimit, show(m["max"]))
	}
	l.Max = n
	if s, ok := m["scope"]; ok {
		l.Scope, _ = v.str(field+".scope", s)
		switch l.Scope {
		case ScopeGlobal, ScopeGrant, ScopeClient:
		default:
			v.fail(field+".scope", "%q is not a scope; want global, grant or client", l.Scope)
		}
	}
	return l
}

// hideAll is the hide entry that hides every tool.
const hideAll = "*"

func (v *validator) hide(field string, x any) []string {
	list, ok := x.([]any)
	if !ok {
		v.fail(field, "want a list of tool names, got %s", show(x))
		return nil
	}
	var out []string
	for i, item := range list {
		f := fmt.Sprintf("%s[%d]", field, i)
		name, ok := v.str(f, item)
		switch {
		case !ok:
		case name == "":
			v.fail(f, "entry must not be empty")
		case slices.Contains(out, name):
			v.fail(f, "duplicate entry %q", name)
		case name != hideAll && !knownTool(name, v.tools):
			v.fail(f, "this server has no such tool; its tools are %s", strings.Join(v.tools, ", "))
		default:
			out = append(out, name)
		}
	}
	return out
}

func (v *validator) allTools(field string, x any) []Limit {
	m := v.object(field, x, "limits")
	if m == nil {
		return nil
	}
	l, ok := m["limits"]
	if !ok {
		return nil
	}
	list, ok := l.([]any)
	if !ok {
		v.fail(field+".limits", "want a list, got %s", kind(l))
		return nil
	}
	var out []Limit
	for i, item := range list {
		out = append(out, v.limit(fmt.Sprintf("%s.limits[%d]", field, i), item))
	}
	return out
}

func integer(x any) (int64, bool) {
	switch n := x.(type) {
	case json.Number:
		i, err := n.Int64()
		return i, err == nil
	case int:
		return int64(n), true
	case int64:
		return n, true
	case uint64:
		if n > maxLimit {
			return 0, false
		}
		return int64(n), true
	case float64:
		if n == float64(int64(n)) && n >= -maxLimit && n <= maxLimit {
			return int64(n), true
		}
	}
	return 0, false
}

func kind(x any) string {
	switch x.(type) {
	case nil:
		return "nothing"
	case string:
		return "a string"
	case json.Number, int, int64, uint64, float64:
		return "a number"
	case bool:
		return "a boolean"
	case []any:
		return "a list"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", x)
}

func show(x any) string {
	if x == nil {
		return "nothing"
	}
	b, err := json.Marshal(x)
	if err != nil || len(b) > 40 {
		return kind(x)
	}
	return string(b)
}
