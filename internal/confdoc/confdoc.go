// Package confdoc is strict decoding of operator files: the policy and the
// --upstream list, written in JSON or YAML.
//
// Both formats decode to the same plain Go values (map[string]any with
// string keys, []any, string, bool, json.Number, nil), so a file means the
// same whichever format it is written in, and the callers validate one
// thing. What either decoder would accept silently, and what could make a
// file say something other than what its reader sees, is an error naming
// the line:
//
//   - a key that appears twice in one object (which did the author mean?);
//   - in YAML: a second document (after "---"; the first decoder to read
//     the file would drop it), the merge key "<<", anchors and aliases
//     (how merge keys and "billion laughs" work), explicit tags ("!!str",
//     "!custom"), keys that are not strings, and numbers JSON has no
//     spelling for (0x10, 010, 1_000, .inf);
//   - in JSON: anything after the top-level value;
//   - in both: nesting deeper than MaxDepth, and bytes that are not UTF-8.
//
// Field names are left exact: a caller that compares keys with == sees
// "COMMAND" as a field other than "command", as it should.
package confdoc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// MaxDepth bounds how deeply objects and lists nest.
const MaxDepth = 32

// Error is a problem in an operator file: its line (0: none in
// particular) and the field (a path like tools.run_python.limits[0].max;
// "" for the whole file).
type Error struct {
	File  string
	Line  int
	Field string
	Msg   string
}

// Error reads "FILE: line N: FIELD: MSG", leaving out what is not known.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	b.WriteString(": ")
	if e.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Doc is a decoded file.
type Doc struct {
	// Name labels errors (a file name).
	Name string
	// Format is "json" or "yaml".
	Format string
	// Root is the top-level value.
	Root any
	// lines holds each value's line, shaped as Root is.
	lines *lineNode
}

// lineNode is a value's line and, for objects and lists, its children's.
type lineNode struct {
	line  int
	keys  map[string]*lineNode
	items []*lineNode
}

// Line returns the line of a field, written as the callers write paths:
// keys joined with '.', list items as [i] (tools.run_python.limits[0].max;
// "" is the top-level value). For a field the file does not have (a
// missing one, say), it is the line of the nearest enclosing field that
// it has. 0 when the Doc has no lines at all.
func (d *Doc) Line(field string) int {
	if d == nil || d.lines == nil {
		return 0
	}
	n, rest := d.lines, field
	for rest != "" {
		next, after := n.child(rest)
		if next == nil {
			break
		}
		n, rest = next, after
	}
	return n.line
}

// child finds the child of n that path begins with, and the rest of path
// after it. Keys may hold '.' and '[' themselves ("github.*"), so the
// longest key that path begins with wins.
func (n *lineNode) child(path string) (*lineNode, string) {
	if strings.HasPrefix(path, "[") && n.items != nil {
		end := strings.IndexByte(path, ']')
		i, err := strconv.Atoi(path[1:max(end, 1)])
		if end < 0 || err != nil || i < 0 || i >= len(n.items) {
			return nil, ""
		}
		return n.items[i], trimDot(path[end+1:])
	}
	var best *lineNode
	bestLen := -1
	for k, c := range n.keys {
		if len(k) > bestLen && strings.HasPrefix(path, k) {
			if r := path[len(k):]; r == "" || r[0] == '.' || r[0] == '[' {
				best, bestLen = c, len(k)
			}
		}
	}
	if best == nil {
		return nil, ""
	}
	return best, trimDot(path[bestLen:])
}

func trimDot(s string) string { return strings.TrimPrefix(s, ".") }

// Errorf makes an Error about a field of this Doc, at the field's line.
func (d *Doc) Errorf(field, format string, a ...any) *Error {
	return &Error{File: d.Name, Line: d.Line(field), Field: field, Msg: fmt.Sprintf(format, a...)}
}

// IsYAML reports whether a file is read as YAML: a name ending in .yaml or
// .yml, or content that does not start with '{' (JSON files are objects).
func IsYAML(data []byte, name string) bool {
	ext := strings.ToLower(filepath.Ext(name))
	trimmed := bytes.TrimSpace(bytes.TrimPrefix(data, bom))
	return ext == ".yaml" || ext == ".yml" || len(trimmed) == 0 || trimmed[0] != '{'
}

var bom = []byte("\xef\xbb\xbf")

// Decode decodes one operator file, in JSON or YAML as IsYAML says. name
// labels errors and decides the format by its extension. Every error is
// an *Error. The caller bounds the size of data.
func Decode(data []byte, name string) (*Doc, error) {
	data = bytes.TrimPrefix(data, bom)
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, &Error{File: name, Msg: "the file is empty"}
	}
	if !utf8.Valid(data) {
		i := 0
		for i < len(data) {
			r, size := utf8.DecodeRune(data[i:])
			if r == utf8.RuneError && size <= 1 {
				break
			}
			i += size
		}
		return nil, &Error{File: name, Line: 1 + bytes.Count(data[:i], []byte("\n")), Msg: "the file is not UTF-8 text"}
	}
	d := &Doc{Name: name}
	var err error
	if IsYAML(data, name) {
		d.Format = "yaml"
		err = d.decodeYAML(data)
	} else {
		d.Format = "json"
		err = d.decodeJSON(data)
	}
	if err != nil {
		return nil, err
	}
	return d, nil
}

// --- JSON ---

// jsonDecoder walks a JSON document token by token, which is the only way
// encoding/json tells of duplicate keys, and counts lines from the token
// offsets.
type jsonDecoder struct {
	doc  *Doc
	data []byte
	dec  *json.Decoder
	// off and line: the line at byte off, counted so far.
	off  int
	line int
}

func (d *Doc) decodeJSON(data []byte) error {
	j := &jsonDecoder{doc: d, data: data, dec: json.NewDecoder(bytes.NewReader(data)), line: 1}
	j.dec.UseNumber()
	root, lines, err := j.value("", 1)
	if err != nil {
		return err
	}
	if _, err := j.dec.Token(); err != io.EOF {
		return &Error{File: d.Name, Line: j.lineAt(int(j.dec.InputOffset())), Msg: "invalid JSON: data after the top-level object"}
	}
	d.Root, d.lines = root, lines
	return nil
}

// lineAt returns the line of byte offset off; offsets only grow.
func (j *jsonDecoder) lineAt(off int) int {
	off = min(off, len(j.data))
	if off > j.off {
		j.line += bytes.Count(j.data[j.off:off], []byte("\n"))
		j.off = off
	}
	return j.line
}

// token reads the next token and the line it ends on (a JSON token never
// spans lines).
func (j *jsonDecoder) token() (json.Token, int, error) {
	tok, err := j.dec.Token()
	if err != nil {
		var se *json.SyntaxError
		line := j.lineAt(int(j.dec.InputOffset()))
		if errors.As(err, &se) {
			line = j.lineAt(int(se.Offset))
		}
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, 0, &Error{File: j.doc.Name, Line: line, Msg: "invalid JSON: " + err.Error()}
	}
	return tok, j.lineAt(int(j.dec.InputOffset())), nil
}

func (j *jsonDecoder) value(field string, depth int) (any, *lineNode, error) {
	tok, line, err := j.token()
	if err != nil {
		return nil, nil, err
	}
	ln := &lineNode{line: line}
	delim, ok := tok.(json.Delim)
	if !ok {
		return tok, ln, nil
	}
	if depth > MaxDepth {
		return nil, nil, &Error{File: j.doc.Name, Line: line, Field: field, Msg: fmt.Sprintf("invalid JSON: nested too deeply (more than %d levels)", MaxDepth)}
	}
	switch delim {
	case '{':
		m := map[string]any{}
		ln.keys = map[string]*lineNode{}
		for j.dec.More() {
			k, kline, err := j.token()
			if err != nil {
				return nil, nil, err
			}
			key := k.(string) // the decoder allows only a string here
			f := JoinField(field, key)
			if first, dup := ln.keys[key]; dup {
				return nil, nil, &Error{File: j.doc.Name, Line: kline, Field: f, Msg: fmt.Sprintf("the key appears twice (already defined at line %d)", first.line)}
			}
			v, vl, err := j.value(f, depth+1)
			if err != nil {
				return nil, nil, err
			}
			vl.line = kline // a field's line is its key's
			m[key], ln.keys[key] = v, vl
		}
		if _, _, err := j.token(); err != nil {
			return nil, nil, err
		}
		return m, ln, nil
	default: // '['
		list := []any{}
		ln.items = []*lineNode{}
		for i := 0; j.dec.More(); i++ {
			v, vl, err := j.value(fmt.Sprintf("%s[%d]", field, i), depth+1)
			if err != nil {
				return nil, nil, err
			}
			list = append(list, v)
			ln.items = append(ln.items, vl)
		}
		if _, _, err := j.token(); err != nil {
			return nil, nil, err
		}
		return list, ln, nil
	}
}

// JoinField appends a key to a field path.
func JoinField(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// --- YAML ---

var yamlLine = regexp.MustCompile(`^(?:yaml: )?line (\d+): `)

func (d *Doc) decodeYAML(data []byte) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if err == io.EOF {
			return &Error{File: d.Name, Msg: "the file is empty (it holds only comments)"}
		}
		return d.yamlSyntax(err)
	}
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case err == io.EOF:
	case err != nil:
		return d.yamlSyntax(err)
	default:
		// Readers that stop at the first document would see only it:
		// say so, rather than let the rest be dropped (or obeyed).
		return &Error{File: d.Name, Line: next.Line, Msg: "a second YAML document (after ---); a file holds one document, so remove the --- line or join the documents"}
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return &Error{File: d.Name, Msg: "invalid YAML: not one document"}
	}
	root, lines, err := d.yamlValue(doc.Content[0], "", 1)
	if err != nil {
		return err
	}
	d.Root, d.lines = root, lines
	return nil
}

func (d *Doc) yamlSyntax(err error) error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	line := 0
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		line, _ = strconv.Atoi(m[1])
		msg = msg[len(m[0]):]
	}
	return &Error{File: d.Name, Line: line, Msg: "invalid YAML: " + msg}
}

// jsonNumber is the JSON spelling of a number (RFC 8259).
var jsonNumber = regexp.MustCompile(`^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?$`)

func (d *Doc) yamlValue(n *yaml.Node, field string, depth int) (any, *lineNode, error) {
	fail := func(format string, a ...any) (any, *lineNode, error) {
		return nil, nil, &Error{File: d.Name, Line: n.Line, Field: field, Msg: fmt.Sprintf(format, a...)}
	}
	ln := &lineNode{line: n.Line}
	switch {
	case n.Kind == yaml.AliasNode:
		return fail("an alias (*%s); anchors and aliases are not accepted: write the value out", n.Value)
	case n.Anchor != "":
		return fail("an anchor (&%s); anchors and aliases are not accepted: write the value out where it is used", n.Anchor)
	case n.Style&yaml.TaggedStyle != 0:
		return fail("a tag (%s); tags are not accepted: write the plain value (quote it to make it a string)", n.Tag)
	}
	switch n.Kind {
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!str", "!!timestamp":
			// A date is a string here, as it is in JSON.
			return n.Value, ln, nil
		case "!!null":
			return nil, ln, nil
		case "!!bool":
			return n.Value == "true" || n.Value == "True" || n.Value == "TRUE", ln, nil
		case "!!int", "!!float":
			if !jsonNumber.MatchString(n.Value) {
				return fail("%s is a number written as JSON cannot write it; write it in decimal (as 1000 or 0.5), or quote it if it is a string", n.Value)
			}
			return json.Number(n.Value), ln, nil
		case "!!merge":
			return fail("<< is YAML's merge key, which is not accepted: write the fields out (quote it if you mean the string)")
		}
		return fail("a value of type %s is not accepted", n.Tag)
	case yaml.SequenceNode, yaml.MappingNode:
		if depth > MaxDepth {
			return fail("invalid YAML: nested too deeply (more than %d levels)", MaxDepth)
		}
	default:
		return fail("invalid YAML: unexpected node")
	}
	if n.Kind == yaml.SequenceNode {
		list := make([]any, 0, len(n.Content))
		ln.items = make([]*lineNode, 0, len(n.Content))
		for i, c := range n.Content {
			v, cl, err := d.yamlValue(c, fmt.Sprintf("%s[%d]", field, i), depth+1)
			if err != nil {
				return nil, nil, err
			}
			list = append(list, v)
			ln.items = append(ln.items, cl)
		}
		return list, ln, nil
	}
	m := make(map[string]any, len(n.Content)/2)
	ln.keys = make(map[string]*lineNode, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		keyErr := func(format string, a ...any) (any, *lineNode, error) {
			return nil, nil, &Error{File: d.Name, Line: k.Line, Field: field, Msg: fmt.Sprintf(format, a...)}
		}
		switch {
		case k.Kind == yaml.AliasNode || k.Anchor != "":
			return keyErr("a key with an anchor or alias; anchors and aliases are not accepted")
		case k.Style&yaml.TaggedStyle != 0:
			return keyErr("a key with a tag (%s); tags are not accepted", k.Tag)
		case k.Kind == yaml.ScalarNode && k.Tag == "!!merge":
			return keyErr("<< is YAML's merge key, which is not accepted: write the fields out")
		case k.Kind != yaml.ScalarNode:
			return keyErr("a key that is a list or an object; keys are strings")
		case k.Tag != "!!str":
			return keyErr("the key %s is not a string; quote it (\"%s\")", k.Value, k.Value)
		}
		f := JoinField(field, k.Value)
		if first, dup := ln.keys[k.Value]; dup {
			return nil, nil, &Error{File: d.Name, Line: k.Line, Field: f, Msg: fmt.Sprintf("the key appears twice (already defined at line %d)", first.line)}
		}
		val, vl, err := d.yamlValue(v, f, depth+1)
		if err != nil {
			return nil, nil, err
		}
		vl.line = k.Line // a field's line is its key's
		m[k.Value], ln.keys[k.Value] = val, vl
	}
	return m, ln, nil
}
