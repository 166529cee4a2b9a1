package tools

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
)

// TestToolSchemas: the tools listed are exactly Names, and every property
// of every input and output schema is a JSON object. A bare `true` schema
// (what an untagged `any` field becomes) is valid JSON Schema but other
// SDKs refuse it: the official conformance suite failed on one.
func TestToolSchemas(t *testing.T) {
	cs := connect(t, nil)
	list, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range list.Tools {
		names = append(names, tool.Name)
		for kind, schema := range map[string]any{"input": tool.InputSchema, "output": tool.OutputSchema} {
			if schema == nil {
				continue
			}
			raw, _ := json.Marshal(schema)
			var s struct {
				Properties map[string]json.RawMessage `json:"properties"`
			}
			if err := json.Unmarshal(raw, &s); err != nil {
				t.Fatalf("%s %s schema: %v", tool.Name, kind, err)
			}
			for prop, v := range s.Properties {
				if len(v) == 0 || v[0] != '{' {
					t.Errorf("%s %s schema: property %q is %s, want an object", tool.Name, kind, prop, v)
				}
			}
		}
		if tool.Description == "" {
			t.Errorf("%s has no description", tool.Name)
		}
	}
	slices.Sort(names)
	// list_tools_in_sandbox is there only with upstream servers
	// (TestToolsFromCode lists it).
	want := slices.DeleteFunc(slices.Clone(Names), func(n string) bool { return n == "list_tools_in_sandbox" })
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("tools %v, want Names %v", names, want)
	}
}
