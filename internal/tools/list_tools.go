package tools

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"sort"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/policy"
	"github.com/pysandbox/pysandbox/internal/upstream"
	"github.com/pysandbox/pysandbox/internal/worker"
)

// list_tools_in_sandbox: what code can call, disclosed progressively so an
// agent's context is not flooded: names first, then one line each, then
// full signatures for the few it will use.

// ListToolsInput is list_tools_in_sandbox's input.
type ListToolsInput struct {
	Filter string `json:"filter,omitempty" jsonschema:"Only tools whose full name (SERVER.TOOL) matches: a glob like \"github.*\" or \"*issue*\", or a plain substring. Omit for all."`
	Detail string `json:"detail,omitempty" jsonschema:"names (the default: just the names, by server), summary (plus the first line of each description), or full (the Python signature, the whole description and the input schema)."`
}

// ListToolsOutput is its result.
type ListToolsOutput struct {
	Outcome
	Servers []worker.ServerStatus `json:"servers" jsonschema:"the upstream servers: name, status (ready, connecting, failed), error, and how many of their tools code may call"`
	Tools   []ToolInfo            `json:"tools" jsonschema:"the matching tools"`
	// Omitted counts matching tools left out of a full listing.
	Omitted int `json:"omitted,omitempty" jsonschema:"matching tools left out: narrow the filter"`
}

// ToolInfo is one tool as list_tools_in_sandbox shows it.
type ToolInfo struct {
	Name        string         `json:"name" jsonschema:"the full name, SERVER.TOOL"`
	Python      string         `json:"python" jsonschema:"how code calls it"`
	Summary     string         `json:"summary,omitempty"`
	Description string         `json:"description,omitempty"`
	InputSchema map[string]any `json:"input_schema,omitempty"`
	Approval    bool           `json:"approval,omitempty" jsonschema:"the user is asked before the first call in a run"`
}

// maxFullTools bounds a full listing: each can be kilobytes.
const maxFullTools = 30

const listToolsDescription = `List the tools of other MCP servers that Python code in run_python can call, through its "tools" module: tools.SERVER.TOOL(**kwargs), or await tools.SERVER.TOOL.acall(**kwargs) to make calls in parallel.

Start with the names (the default), then ask for detail "full" with a filter for the few tools you will use: that gives each one's Python signature, description and input schema. Calling tools from code keeps intermediate data in the sandbox: filter, join and loop there, and return only what matters. Each call is checked by the server's policy, counted against the run's limits and recorded; a refused or failed call raises a Python exception (tools.ToolError and subclasses) that says why.`

func (s *server) addListTools(srv *mcp.Server) {
	if !s.upstreamsOn() {
		return
	}
	addTool(s, srv, &mcp.Tool{
		Name:        "list_tools_in_sandbox",
		Title:       "List tools callable from code",
		Description: listToolsDescription,
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
	}, s.listTools)
}

// visibleTools are the upstream tools the policy lets code see.
func (s *server) visibleTools() ([]worker.ToolSpec, []worker.ServerStatus) {
	pol := s.gov.Policy()
	var specs []worker.ToolSpec
	for _, t := range s.up.Tools() {
		d := pol.Decide(t.Full)
		if d.Action == policy.Deny {
			continue
		}
		specs = append(specs, worker.ToolSpec{Name: t.Full, Server: t.Server, Tool: t.Name, Description: t.Description,
			InputSchema: t.InputSchema, OutputSchema: t.OutputSchema, Approval: d.Action == policy.Approve})
	}
	servers := []worker.ServerStatus{}
	for _, st := range s.up.Status() {
		n := 0
		for _, sp := range specs {
			if sp.Server == st.Name {
				n++
			}
		}
		servers = append(servers, worker.ServerStatus{Name: st.Name, Status: st.State, Error: st.Error, Tools: n})
	}
	return specs, servers
}

func (s *server) listTools(ctx context.Context, req *mcp.CallToolRequest, in ListToolsInput) (*mcp.CallToolResult, ListToolsOutput, error) {
	detail := in.Detail
	switch detail {
	case "":
		detail = "names"
	case "names", "summary", "full":
	default:
		return nil, ListToolsOutput{}, errorResult(fmt.Sprintf("detail %q is not one of names, summary, full.", in.Detail))
	}
	if len(in.Filter) > 200 {
		return nil, ListToolsOutput{}, errorResult("filter is longer than 200 characters; pass a shorter glob or substring.")
	}
	// As the tools module's catalog does: listed at once after startup,
	// it has the tools of servers still on their first attempt.
	s.up.Settle(ctx)
	specs, servers := s.visibleTools()
	out := ListToolsOutput{Servers: servers, Tools: []ToolInfo{}}
	for _, sp := range specs {
		if !matchTool(in.Filter, sp.Name) {
			continue
		}
		if detail == "full" && len(out.Tools) >= maxFullTools {
			out.Omitted++
			continue
		}
		info := ToolInfo{Name: sp.Name, Python: pySignature(sp), Approval: sp.Approval}
		switch detail {
		case "summary":
			info.Summary = firstLine(sp.Description)
		case "full":
			info.Description = sp.Description
			json.Unmarshal(sp.InputSchema, &info.InputSchema)
		}
		out.Tools = append(out.Tools, info)
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: toolsListText(out, detail, in.Filter)}}}, out, nil
}

// matchTool matches a full name against a glob, or a substring when the
// filter has no glob characters.
func matchTool(filter, name string) bool {
	if filter == "" {
		return true
	}
	if strings.ContainsAny(filter, "*?[") {
		ok, err := path.Match(filter, name)
		return err == nil && ok
	}
	return strings.Contains(strings.ToLower(name), strings.ToLower(filter))
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexAny(s, "\n"); i >= 0 {
		s = s[:i]
	}
	if len(s) > 160 {
		s = s[:157] + "..."
	}
	return s
}

func toolsListText(out ListToolsOutput, detail, filter string) string {
	var b strings.Builder
	for _, st := range out.Servers {
		fmt.Fprintf(&b, "server %s: %s, %d tools", st.Name, st.Status, st.Tools)
		if st.Error != "" {
			fmt.Fprintf(&b, " (%s)", st.Error)
		}
		b.WriteString("\n")
	}
	if len(out.Tools) == 0 {
		if filter != "" {
			fmt.Fprintf(&b, "no tool matches %q\n", filter)
		} else {
			b.WriteString("no tools are available to code\n")
		}
		return b.String()
	}
	switch detail {
	case "names":
		byServer := map[string][]string{}
		var order []string
		for _, t := range out.Tools {
			server, tool, _ := strings.Cut(t.Name, ".")
			if _, ok := byServer[server]; !ok {
				order = append(order, server)
			}
			byServer[server] = append(byServer[server], tool)
		}
		sort.Strings(order)
		for _, server := range order {
			fmt.Fprintf(&b, "%s: %s\n", server, strings.Join(byServer[server], ", "))
		}
		b.WriteString("Call list_tools_in_sandbox with detail \"full\" and a filter for signatures.\n")
	case "summary":
		for _, t := range out.Tools {
			fmt.Fprintf(&b, "%s — %s\n", t.Name, t.Summary)
		}
	case "full":
		for _, t := range out.Tools {
			fmt.Fprintf(&b, "\n%s\n", t.Python)
			if t.Approval {
				b.WriteString("    (the user is asked before the first call in a run)\n")
			}
			for _, l := range strings.Split(strings.TrimSpace(t.Description), "\n") {
				fmt.Fprintf(&b, "    %s\n", l)
			}
			if len(t.InputSchema) > 0 {
				schema, _ := json.Marshal(t.InputSchema)
				fmt.Fprintf(&b, "    input schema: %s\n", schema)
			}
		}
		if out.Omitted > 0 {
			fmt.Fprintf(&b, "\n(%d more match; narrow the filter)\n", out.Omitted)
		}
	}
	return b.String()
}

// pyKeywords are Python's keywords: a name that is one gets a trailing _
// in the tools module, as here.
var pyKeywords = map[string]bool{"False": true, "None": true, "True": true, "and": true, "as": true, "assert": true, "async": true,
	"await": true, "break": true, "class": true, "continue": true, "def": true, "del": true, "elif": true, "else": true, "except": true,
	"finally": true, "for": true, "from": true, "global": true, "if": true, "import": true, "in": true, "is": true, "lambda": true,
	"nonlocal": true, "not": true, "or": true, "pass": true, "raise": true, "return": true, "try": true, "while": true, "with": true, "yield": true}

// pyIdent is the attribute name the tools module gives a server or tool
// name: every character that cannot be in an identifier becomes _, a
// leading digit gets a _ before it, and a keyword a _ after it.
func pyIdent(name string) string {
	var b strings.Builder
	for i, r := range name {
		switch {
		case r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z':
			b.WriteRune(r)
		case r >= '0' && r <= '9':
			if i == 0 {
				b.WriteByte('_')
			}
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	id := b.String()
	if id == "" {
		id = "_"
	}
	if pyKeywords[id] {
		id += "_"
	}
	return id
}

// pySignature renders how code calls a tool, with Python type hints from
// its input schema: tools.memory.search_nodes(*, query: str) -> dict.
func pySignature(sp worker.ToolSpec) string {
	var schema struct {
		Properties map[string]json.RawMessage `json:"properties"`
		Required   []string                   `json:"required"`
	}
	json.Unmarshal(sp.InputSchema, &schema)
	req := map[string]bool{}
	for _, r := range schema.Required {
		req[r] = true
	}
	names := make([]string, 0, len(schema.Properties))
	for n := range schema.Properties {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		if req[names[i]] != req[names[j]] {
			return req[names[i]]
		}
		return names[i] < names[j]
	})
	var params []string
	for _, n := range names {
		p := pyIdent(n) + ": " + pyType(schema.Properties[n])
		if !req[n] {
			p += " = None"
		}
		params = append(params, p)
	}
	sig := "tools." + pyIdent(sp.Server) + "." + pyIdent(sp.Tool) + "("
	if len(params) > 0 {
		sig += "*, " + strings.Join(params, ", ")
	}
	ret := "str"
	if len(sp.OutputSchema) > 0 {
		ret = "dict"
	}
	return sig + ") -> " + ret
}

// pyType is the Python type hint of a JSON schema.
func pyType(raw json.RawMessage) string {
	var s struct {
		Type  any             `json:"type"`
		Items json.RawMessage `json:"items"`
		Enum  []any           `json:"enum"`
	}
	if json.Unmarshal(raw, &s) != nil {
		return "Any"
	}
	if len(s.Enum) > 0 && len(s.Enum) <= 8 {
		var vals []string
		for _, v := range s.Enum {
			b, _ := json.Marshal(v)
			vals = append(vals, string(b))
		}
		return "Literal[" + strings.Join(vals, ", ") + "]"
	}
	one := func(t string) string {
		switch t {
		case "string":
			return "str"
		case "integer":
			return "int"
		case "number":
			return "float"
		case "boolean":
			return "bool"
		case "object":
			return "dict"
		case "null":
			return "None"
		case "array":
			if len(s.Items) > 0 {
				return "list[" + pyType(s.Items) + "]"
			}
			return "list"
		}
		return "Any"
	}
	switch t := s.Type.(type) {
	case string:
		return one(t)
	case []any:
		var parts []string
		for _, x := range t {
			if ts, ok := x.(string); ok {
				parts = append(parts, one(ts))
			}
		}
		if len(parts) > 0 {
			return strings.Join(parts, " | ")
		}
	}
	return "Any"
}

// upstreamSummary is the upstream part of check_environment.
func (s *server) upstreamSummary() *engine.UpstreamPolicy {
	if !s.upstreamsOn() {
		return nil
	}
	pol := s.gov.Policy()
	_, servers := s.visibleTools()
	u := &engine.UpstreamPolicy{Default: string(pol.Default), Rules: map[string]string{}}
	lim := pol.UpstreamLimitsOf()
	u.CallsPerRun, u.BytesPerRun = lim.Calls, lim.Bytes
	for _, st := range servers {
		u.Servers = append(u.Servers, engine.UpstreamServer{Name: st.Name, Status: st.Status, Error: st.Error, Tools: st.Tools})
	}
	for name := range pol.Tools {
		if !strings.Contains(name, ".") {
			continue
		}
		v := pol.Describe(name) + s.ruleMatchesNothing(name)
		u.Rules[name] = v
	}
	return u
}

func upstreamText(u *engine.UpstreamPolicy) string {
	if u == nil {
		return ""
	}
	var b strings.Builder
	b.WriteString("tools from code (import tools; list_tools_in_sandbox lists them):\n")
	for _, st := range u.Servers {
		fmt.Fprintf(&b, "  server %s: %s, %d tools", st.Name, st.Status, st.Tools)
		if st.Error != "" {
			fmt.Fprintf(&b, " (%s)", st.Error)
		}
		b.WriteString("\n")
	}
	names := make([]string, 0, len(u.Rules))
	for n := range u.Rules {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(&b, "  %-18s %s\n", n, u.Rules[n])
	}
	fmt.Fprintf(&b, "  other upstream tools: %s (the policy's default)\n", u.Default)
	fmt.Fprintf(&b, "  per run: at most %d calls and %d bytes of arguments and results\n", u.CallsPerRun, u.BytesPerRun)
	return b.String()
}

// ruleMatchesNothing warns, for check_environment, about a policy rule
// that names a tool its server (when ready) does not have: a rule for
// "get_env" does nothing to "get-env".
func (s *server) ruleMatchesNothing(rule string) string {
	server, tool, _ := strings.Cut(rule, ".")
	if tool == "*" {
		return ""
	}
	if _, ok := s.up.Lookup(rule); ok {
		return ""
	}
	ready := false
	for _, st := range s.up.Status() {
		ready = ready || st.Name == server && st.State == upstream.StateReady
	}
	if !ready {
		return ""
	}
	for _, t := range s.up.Tools() {
		if t.Server == server && pyIdent(t.Name) == pyIdent(tool) {
			return fmt.Sprintf(" (WARNING: %s has no tool %q, so this rule applies to nothing; did you mean %s?)", server, tool, t.Full)
		}
	}
	return fmt.Sprintf(" (WARNING: %s has no tool %q, so this rule applies to nothing)", server, tool)
}
