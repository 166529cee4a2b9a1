package setup

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// tomlTable is Codex's [mcp_servers.NAME] table for the entry.
func tomlTable(e Entry) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[mcp_servers.%s]\n", tomlKey(e.Name))
	if e.URL != "" {
		fmt.Fprintf(&b, "url = %s\n", tomlString(e.URL))
		if len(e.Headers) > 0 {
			q := make([]string, len(e.Headers))
			for i, h := range e.Headers {
				q[i] = tomlString(h.Name) + " = " + tomlString(h.Value)
			}
			fmt.Fprintf(&b, "http_headers = { %s }\n", strings.Join(q, ", "))
		}
	} else {
		fmt.Fprintf(&b, "command = %s\n", tomlString(e.Command))
		q := make([]string, len(e.Args))
		for i, a := range e.Args {
			q[i] = tomlString(a)
		}
		fmt.Fprintf(&b, "args = [%s]\n", strings.Join(q, ", "))
	}
	if e.ToolTimeout > 0 {
		// Whole seconds, rounded up.
		fmt.Fprintf(&b, "tool_timeout_sec = %d\n", (e.ToolTimeout+time.Second-1)/time.Second)
	}
	return b.String()
}

func tomlString(s string) string {
	var b bytes.Buffer
	toml.NewEncoder(&b).Encode(map[string]string{"v": s})
	return strings.TrimSpace(strings.TrimPrefix(b.String(), "v = "))
}

func tomlKey(k string) string {
	for _, r := range k {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return tomlString(k)
		}
	}
	return k
}

// mergeTOML replaces the entry's table in a Codex config.toml (every line
// from its header to the next table header), or appends it; every other
// line stays as it was. The file must parse before and after.
func mergeTOML(data []byte, e Entry) ([]byte, error) {
	var probe map[string]any
	if _, err := toml.Decode(string(data), &probe); err != nil {
		return nil, err
	}
	header := fmt.Sprintf("[mcp_servers.%s]", tomlKey(e.Name))
	lines := strings.SplitAfter(string(data), "\n")
	var out strings.Builder
	replaced, skipping := false, false
	for _, line := range lines {
		t := strings.TrimSpace(line)
		isHeader := strings.HasPrefix(t, "[")
		if skipping && isHeader {
			skipping = false
		}
		if t == header {
			out.WriteString(tomlTable(e))
			replaced, skipping = true, true
			continue
		}
		if !skipping {
			out.WriteString(line)
		}
	}
	s := out.String()
	if !replaced {
		if s != "" && !strings.HasSuffix(s, "\n") {
			s += "\n"
		}
		if s != "" {
			s += "\n"
		}
		s += tomlTable(e)
	}
	// The merge works on lines: check what it means. The result must be
	// the file as it was, with mcp_servers.NAME the entry and nothing
	// else different (a table header inside a multi-line string would
	// otherwise fool it).
	var after map[string]any
	if _, err := toml.Decode(s, &after); err != nil {
		return nil, fmt.Errorf("the merged file would not parse: %v", err)
	}
	want := map[string]any{}
	for k, v := range probe {
		want[k] = v
	}
	servers := map[string]any{}
	if old, ok := probe["mcp_servers"].(map[string]any); ok {
		for k, v := range old {
			servers[k] = v
		}
	} else if _, there := probe["mcp_servers"]; there {
		return nil, fmt.Errorf("mcp_servers is not a table")
	}
	var table map[string]any
	if _, err := toml.Decode(tomlTable(e), &table); err != nil {
		return nil, fmt.Errorf("the entry does not encode: %v", err)
	}
	servers[e.Name] = table["mcp_servers"].(map[string]any)[e.Name]
	want["mcp_servers"] = servers
	if !reflect.DeepEqual(want, after) {
		return nil, fmt.Errorf("the file's layout (a table header inside a string, or the entry split over several tables) keeps an exact merge from being sure")
	}
	return []byte(s), nil
}
