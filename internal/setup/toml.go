package setup

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/BurntSushi/toml"
)

// tomlTable is Codex's [mcp_servers.NAME] table for the entry.
func tomlTable(e Entry) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[mcp_servers.%s]\n", tomlKey(e.Name))
	fmt.Fprintf(&b, "command = %s\n", tomlString(e.Command))
	q := make([]string, len(e.Args))
	for i, a := range e.Args {
		q[i] = tomlString(a)
	}
	fmt.Fprintf(&b, "args = [%s]\n", strings.Join(q, ", "))
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
	if _, err := toml.Decode(s, &probe); err != nil {
		return nil, fmt.Errorf("the merged file would not parse: %v", err)
	}
	return []byte(s), nil
}
