package setup

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// member is one key of a JSON object, in the file's order, with its value
// as written.
type member struct {
	key    string
	rawKey []byte // as written in the file; nil for pysandbox's own
	raw    json.RawMessage
	// fresh values are pysandbox's (indented when written); the others
	// are written as the file had them.
	fresh bool
}

// objectMembers splits a JSON object into its members, in order.
func objectMembers(data []byte) ([]member, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, errors.New("not a JSON object")
	}
	var out []member
	seen := map[string]bool{}
	for dec.More() {
		start := dec.InputOffset()
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, _ := tok.(string)
		if seen[key] {
			// Clients differ on which one counts; a merge would pick.
			return nil, fmt.Errorf("the key %q appears twice", key)
		}
		seen[key] = true
		// The key as the file wrote it (escapes included), so that a
		// merge never rewrites another entry's name.
		rawKey := bytes.TrimLeft(data[start:dec.InputOffset()], " \t\r\n,")
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, err
		}
		out = append(out, member{key: key, rawKey: append([]byte(nil), rawKey...), raw: raw})
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	// Only white space may follow. (Decoder.More reports none for a stray
	// '}' or ']', so a file like {"a":1} }]] would read as its first
	// object and be rewritten without the rest.)
	if rest := bytes.TrimLeft(data[dec.InputOffset():], " \t\r\n"); len(rest) > 0 {
		return nil, fmt.Errorf("%q after the object", truncate(rest, 20))
	}
	return out, nil
}

// indentOf is the indentation the file uses (its first indented line's),
// two spaces by default.
func indentOf(data []byte) string {
	for _, line := range strings.Split(string(data), "\n")[1:] {
		trimmed := strings.TrimLeft(line, " \t")
		if trimmed != "" && len(trimmed) < len(line) {
			return line[:len(line)-len(trimmed)]
		}
	}
	return "  "
}

// writeObject writes members as an indented object at depth.
func writeObject(b *bytes.Buffer, ms []member, indent string, depth int) {
	if len(ms) == 0 {
		b.WriteString("{}")
		return
	}
	pad := strings.Repeat(indent, depth+1)
	b.WriteString("{\n")
	for i, m := range ms {
		k := m.rawKey
		if k == nil {
			k, _ = json.Marshal(m.key)
		}
		b.WriteString(pad)
		b.Write(k)
		b.WriteString(": ")
		if m.fresh {
			var v bytes.Buffer
			if json.Indent(&v, m.raw, pad, indent) == nil {
				b.Write(v.Bytes())
			} else {
				b.Write(m.raw)
			}
		} else {
			b.Write(m.raw)
		}
		if i < len(ms)-1 {
			b.WriteByte(',')
		}
		b.WriteByte('\n')
	}
	b.WriteString(strings.Repeat(indent, depth) + "}")
}

func mergeJSON(data []byte, c Client, e Entry) ([]byte, error) {
	var top []member
	if len(bytes.TrimSpace(data)) > 0 {
		var err error
		if !json.Valid(data) {
			// Let objectMembers name the fault, or say where it is.
			if _, err = objectMembers(data); err == nil {
				err = errors.New("not valid JSON")
			}
		} else {
			top, err = objectMembers(data)
		}
		if err != nil {
			if bytes.Contains(data, []byte("//")) || bytes.Contains(data, []byte("/*")) {
				return nil, fmt.Errorf("%v (comments, as JSONC allows, would be lost in a merge)", err)
			}
			return nil, err
		}
	}
	indent := indentOf(data)
	entry := member{key: e.Name, raw: jsonEntry(c, e), fresh: true}
	found := false
	for i, m := range top {
		if m.key != c.Key {
			continue
		}
		found = true
		servers, err := objectMembers(m.raw)
		if err != nil {
			return nil, fmt.Errorf("%q: %v", c.Key, err)
		}
		replaced := false
		for j := range servers {
			if servers[j].key == e.Name {
				servers[j], replaced = entry, true
			}
		}
		if !replaced {
			servers = append(servers, entry)
		}
		var b bytes.Buffer
		writeObject(&b, servers, indent, 1)
		top[i].raw = b.Bytes()
	}
	if !found {
		var b bytes.Buffer
		writeObject(&b, []member{entry}, indent, 1)
		top = append(top, member{key: c.Key, raw: b.Bytes()})
	}
	var out bytes.Buffer
	writeObject(&out, top, indent, 0)
	out.WriteByte('\n')
	return out.Bytes(), nil
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}
