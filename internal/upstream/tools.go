package upstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/pysandbox/pysandbox/internal/tracing"
)

// ErrUnknownTool is returned for a name that is no tool of a ready
// server.
var ErrUnknownTool = errors.New("no such upstream tool")

// ErrNotSent marks a Call error that happened before the call went out
// (no such tool, the server is down): the upstream did nothing. Any
// other error may come after the upstream acted on the call.
var ErrNotSent = errors.New("the call was not sent")

// Bounds on what an upstream server lists: it is outside this process,
// and its catalog goes into every run that asks.
const (
	// MaxTools bounds the tools taken from one server.
	MaxTools = 500
	// MaxToolName bounds a tool's name (the MCP spec says 128).
	MaxToolName = 128
	// MaxDescription bounds a tool's description; a longer one is cut.
	MaxDescription = 8 << 10
	// MaxSchema bounds a tool's input or output schema (JSON); a tool
	// with a larger one is left out.
	MaxSchema = 64 << 10
)

// Tool is one upstream tool.
type Tool struct {
	Full        string // SERVER.TOOL
	Server      string
	Name        string
	Description string
	InputSchema json.RawMessage
	// OutputSchema is set when the tool declares a structured result.
	OutputSchema json.RawMessage
	// schema checks arguments; nil when the input schema could not be
	// resolved (only "a JSON object" is checked then, and the upstream
	// checks the rest).
	schema *jsonschema.Resolved
	// declared are the arguments the schema names; closed is set unless
	// it names none or allows others (additionalProperties true or a
	// schema). An argument it does not name is refused, as the sandbox's
	// module does: what the user approves and the audit log records is
	// then all the tool gets.
	declared map[string]bool
	closed   bool
}

// Tools lists the tools of the ready servers, and those of servers
// reconnecting after they worked (calls to them wait for the server), by
// full name.
func (m *Manager) Tools() []Tool {
	var out []Tool
	for _, s := range m.servers {
		s.mu.Lock()
		out = append(out, s.tools...)
		s.mu.Unlock()
	}
	return out
}

func (s *server) toolCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.tools)
}

// Lookup finds a tool of a ready server by its full name.
func (m *Manager) Lookup(full string) (Tool, bool) {
	_, t, _ := m.lookup(full)
	if t == nil {
		return Tool{}, false
	}
	return *t, true
}

func (m *Manager) lookup(full string) (*server, *Tool, *mcp.ClientSession) {
	name, tool, ok := strings.Cut(full, ".")
	if !ok {
		return nil, nil, nil
	}
	s := m.byName[name]
	if s == nil {
		return nil, nil, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != StateReady {
		return s, nil, nil
	}
	return s, s.byName[tool], s.cs
}

// maxValidationMessage bounds a schema error's text: it may quote the
// arguments.
const maxValidationMessage = 1000

// Validate checks a call's arguments against the tool's input schema.
func (m *Manager) Validate(full string, args json.RawMessage) error {
	_, t, _ := m.lookup(full)
	if t == nil {
		return fmt.Errorf("%w: %s", ErrUnknownTool, full)
	}
	var v any
	if err := json.Unmarshal(args, &v); err != nil {
		return fmt.Errorf("the arguments are not JSON: %v", err)
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return errors.New("the arguments must be a JSON object of named arguments")
	}
	if t.closed {
		var extra []string
		for k := range obj {
			if !t.declared[k] {
				extra = append(extra, strconv.Quote(cutUTF8(k, 100)))
			}
		}
		if len(extra) > 0 {
			sort.Strings(extra)
			if len(extra) > 10 {
				extra = append(extra[:10], fmt.Sprintf("and %d more", len(extra)-10))
			}
			return fmt.Errorf("the tool takes no argument %s", strings.Join(extra, ", "))
		}
	}
	if t.schema == nil {
		return nil
	}
	if err := t.schema.Validate(v); err != nil {
		msg := err.Error()
		if len(msg) > maxValidationMessage {
			msg = msg[:maxValidationMessage] + "..."
		}
		return fmt.Errorf("the arguments do not match the tool's input schema: %s", msg)
	}
	return nil
}

// Call calls a tool. A call to a server that is connecting waits for it
// first (see Await). ctx's end cancels the call, and the upstream is told
// so (notifications/cancelled).
func (m *Manager) Call(ctx context.Context, full string, args json.RawMessage) (res *mcp.CallToolResult, err error) {
	ctx, span := tracing.Tracer().Start(ctx, "upstream "+full, trace.WithSpanKind(trace.SpanKindClient))
	defer func() {
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}()
	s, t, cs := m.lookup(full)
	if s != nil && cs == nil {
		if err := s.await(ctx); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrNotSent, err)
		}
		s, t, cs = m.lookup(full)
	}
	switch {
	case s == nil, cs != nil && t == nil:
		return nil, fmt.Errorf("%w: %w: %s", ErrNotSent, ErrUnknownTool, full)
	case cs == nil:
		// It went down again between the wait and the lookup.
		return nil, fmt.Errorf("%w: %w", ErrNotSent, s.unavailable(0))
	}
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: t.Name, Arguments: args})
	switch {
	case err == nil:
		return res, nil
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case errors.Is(err, mcp.ErrConnectionClosed), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.ECONNRESET):
		return nil, fmt.Errorf("the upstream server %q stopped during the call", s.cfg.Name)
	}
	return nil, fmt.Errorf("the upstream server %q: %v", s.cfg.Name, err)
}

// list takes the server's tools, bounded (see MaxTools and friends).
func (s *server) list(ctx context.Context, cs *mcp.ClientSession) ([]Tool, []string, error) {
	var tools []Tool
	var warns []string
	seen := map[string]bool{}
	for t, err := range cs.Tools(ctx, nil) {
		if err != nil {
			return nil, nil, err
		}
		if len(tools) >= MaxTools {
			warns = append(warns, fmt.Sprintf("the server lists more than %d tools; the rest are left out", MaxTools))
			break
		}
		if !validToolName(t.Name) {
			warns = append(warns, fmt.Sprintf("tool name %.80q is not 1 to %d printable characters without spaces", t.Name, MaxToolName))
			continue
		}
		if seen[t.Name] {
			warns = append(warns, fmt.Sprintf("tool %q is listed twice; the first is kept", t.Name))
			continue
		}
		tool, err := s.tool(t)
		if err != nil {
			warns = append(warns, fmt.Sprintf("tool %q: %v", t.Name, err))
			continue
		}
		seen[t.Name] = true
		tools = append(tools, tool)
	}
	sort.Slice(tools, func(i, j int) bool { return tools[i].Name < tools[j].Name })
	return tools, warns, nil
}

func (s *server) tool(t *mcp.Tool) (Tool, error) {
	tool := Tool{Full: s.cfg.Name + "." + t.Name, Server: s.cfg.Name, Name: t.Name, Description: t.Description}
	if tool.Description == "" {
		tool.Description = t.Title
	}
	if len(tool.Description) > MaxDescription {
		tool.Description = cutUTF8(tool.Description, MaxDescription) + "..."
	}
	in, err := json.Marshal(t.InputSchema)
	if err != nil || len(in) > MaxSchema {
		return tool, fmt.Errorf("its input schema is not JSON, or larger than %d bytes", MaxSchema)
	}
	if t.InputSchema == nil {
		in = []byte(`{"type":"object"}`)
	}
	tool.InputSchema = in
	if t.OutputSchema != nil {
		out, err := json.Marshal(t.OutputSchema)
		if err != nil || len(out) > MaxSchema {
			return tool, fmt.Errorf("its output schema is not JSON, or larger than %d bytes", MaxSchema)
		}
		tool.OutputSchema = out
	}
	var shape struct {
		Properties           map[string]json.RawMessage `json:"properties"`
		AdditionalProperties json.RawMessage            `json:"additionalProperties"`
	}
	if json.Unmarshal(in, &shape) == nil && len(shape.Properties) > 0 {
		tool.declared = map[string]bool{}
		for k := range shape.Properties {
			tool.declared[k] = true
		}
		extra := strings.TrimSpace(string(shape.AdditionalProperties))
		tool.closed = extra == "" || extra == "false"
	}
	var sch jsonschema.Schema
	if json.Unmarshal(in, &sch) == nil {
		if r, err := sch.Resolve(nil); err == nil {
			tool.schema = r
		} else {
			s.m.log.Debug("upstream tool's input schema cannot be resolved; only its shape is checked", "tool", tool.Full, "err", err)
		}
	}
	return tool, nil
}

func validToolName(name string) bool {
	if name == "" || len(name) > MaxToolName {
		return false
	}
	for _, r := range name {
		if r <= ' ' || r == 0x7f {
			return false
		}
	}
	return true
}

func cutUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func utf8RuneStart(b byte) bool { return b&0xC0 != 0x80 }
