package upstream

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestHostileCatalog: what a server lists is bounded: too many tools,
// names that are not names, schemas too large, duplicates.
func TestHostileCatalog(t *testing.T) {
	srv := mcp.NewServer(&mcp.Implementation{Name: "hostile", Version: "1"}, nil)
	h := func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{}, nil
	}
	obj := map[string]any{"type": "object"}
	for i := 0; i < MaxTools+20; i++ {
		srv.AddTool(&mcp.Tool{Name: fmt.Sprintf("t%04d", i), InputSchema: obj}, h)
	}
	big := map[string]any{"type": "object", "description": strings.Repeat("x", MaxSchema)}
	srv.AddTool(&mcp.Tool{Name: "a-big", InputSchema: big}, h)
	srv.AddTool(&mcp.Tool{Name: "a-long-description", InputSchema: obj, Description: strings.Repeat("é", MaxDescription)}, h)
	m := start(t, map[string]any{"hostile": map[string]any{"command": "unused"}}, Options{Wrap: func(string, mcp.Transport) mcp.Transport {
		ct, st := mcp.NewInMemoryTransports()
		srv.Connect(context.Background(), st, nil)
		return ct
	}})
	tools := m.Tools()
	if len(tools) != MaxTools {
		t.Errorf("%d tools, want the first %d", len(tools), MaxTools)
	}
	if _, ok := m.Lookup("hostile.a-big"); ok {
		t.Error("a tool with a schema over the bound was kept")
	}
	if tl, ok := m.Lookup("hostile.a-long-description"); !ok || len(tl.Description) > MaxDescription+3 || !strings.HasSuffix(tl.Description, "é...") {
		t.Errorf("long description: %v %d", ok, len(tl.Description))
	}
}
