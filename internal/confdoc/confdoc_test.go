package confdoc

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// TestRefused: what a lenient decoder would accept silently is an error
// naming its line (and field, where there is one).
func TestRefused(t *testing.T) {
	for _, c := range []struct {
		name, file, doc string
		line            int
		want            string // in the error's text
	}{
		{"multi doc", "p.yaml", "default: deny\n---\ntools:\n  run_python: approve\n", 2, "a second YAML document"},
		{"trailing ---", "p.yaml", "default: deny\n---\n", 2, "a second YAML document"},
		{"trailing --- comment", "p.yaml", "default: deny\n---\n# nothing\n", 2, "a second YAML document"},
		{"doc end then doc", "p.yaml", "a: 1\n...\n---\nb: 2\n", 3, "a second YAML document"},
		{"doc end then text", "p.yaml", "a: 1\n...\nb: 2\n", 2, "invalid YAML"},
		{"merge key", "p.yaml", "base: {x: 1}\ntop:\n  <<: {default: allow}\n", 3, "top: << is YAML's merge key"},
		{"merge key flow", "p.yaml", "{<<: {default: allow}, version: 1}", 1, "merge key"},
		{"merge value", "p.yaml", "a: <<\n", 1, "a: << is YAML's merge key"},
		{"anchor", "p.yaml", "a: &x {b: 1}\nc: 2\n", 1, "a: an anchor (&x)"},
		{"alias", "p.yaml", "a: 1\nb: *a\n", 0, "unknown anchor"},
		{"anchor and alias", "p.yaml", "x: &a [1]\ny: *a\n", 1, "x: an anchor"},
		{"anchored key", "p.yaml", "&k a: 1\n", 1, "anchor or alias"},
		{"billion laughs", "p.yaml", "a: &a [x, x]\nb: &b [*a, *a]\nc: [*b, *b]\n", 1, "anchor"},
		{"custom tag", "p.yaml", "default: !custom allow\n", 1, "default: a tag (!custom)"},
		{"explicit str tag", "p.yaml", "version: !!str 1\n", 1, "version: a tag (!!str)"},
		{"tagged map", "p.yaml", "tools: !!map {}\n", 1, "tools: a tag"},
		{"tagged key", "p.yaml", "!!str a: 1\n", 1, "a key with a tag"},
		{"binary", "p.yaml", "a: !!binary aGk=\n", 1, "a tag (!!binary)"},
		{"dup top yaml", "p.yaml", "version: '1'\ndefault: allow\ndefault: deny\n", 3, "line 3: default: the key appears twice (already defined at line 2)"},
		{"dup nested yaml", "p.yaml", "tools:\n  run_python: allow\n  x: 1\n  run_python: approve\n", 4, "tools.run_python: the key appears twice"},
		{"dup quoted yaml", "p.yaml", "a: 1\n\"a\": 2\n", 2, "a: the key appears twice"},
		{"dup in list yaml", "p.yaml", "l:\n  - {m: 1, m: 2}\n", 2, "l[0].m: the key appears twice"},
		{"int key", "p.yaml", "1: a\n", 1, `the key 1 is not a string; quote it ("1")`},
		{"bool key", "p.yaml", "a:\n  true: x\n", 2, "a: the key true is not a string"},
		{"null key", "p.yaml", "~: x\n", 1, "is not a string"},
		{"complex key", "p.yaml", "? [a]\n: 1\n", 1, "a key that is a list or an object"},
		{"hex number", "p.yaml", "max: 0x10\n", 1, "max: 0x10 is a number written as JSON cannot write it"},
		{"octal number", "p.yaml", "max: 010\n", 1, "010 is a number"},
		{"underscores", "p.yaml", "max: 1_000\n", 1, "1_000 is a number"},
		{"inf", "p.yaml", "max: .inf\n", 1, ".inf is a number"},
		{"deep yaml", "p.yaml", "a: " + strings.Repeat("[", 40) + strings.Repeat("]", 40) + "\n", 1, "nested too deeply"},
		{"bad yaml", "p.yaml", "a: 1\nb: [\n", 0, "invalid YAML"},
		{"yaml syntax line", "p.yaml", "a: 1\nb: c: d\n", 2, "invalid YAML: mapping values are not allowed"},
		{"only comments", "p.yaml", "# nothing\n", 0, "the file is empty"},
		{"empty", "p.json", " \n\t", 0, "the file is empty"},
		{"dup top json", "p.json", "{\"version\": \"1\",\n \"default\": \"allow\",\n \"default\": \"deny\"}", 3, "line 3: default: the key appears twice (already defined at line 2)"},
		{"dup nested json", "p.json", "{\"tools\": {\n  \"run_python\": {\"action\": \"allow\",\n    \"action\": \"deny\"}}}", 3, "tools.run_python.action: the key appears twice"},
		{"dup escaped json", "p.json", `{"a": 1, "\u0061": 2}`, 1, "a: the key appears twice"},
		{"trailing json", "p.json", "{\"version\": \"1\"}\n{}", 2, "invalid JSON: data after the top-level object"},
		{"trailing garbage", "p.json", "{}\n\nx", 3, "invalid JSON"},
		{"bad json", "p.json", "{\n\"version\": \"1\",\n}", 3, "invalid JSON"},
		{"truncated json", "p.json", "{\"a\": [1,", 1, "invalid JSON: unexpected EOF"},
		{"deep json", "p.json", `{"x": ` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`, 1, "nested too deeply"},
		{"not utf-8", "p.json", "{\"a\":\n\"\xff\"}", 2, "not UTF-8"},
	} {
		t.Run(c.name, func(t *testing.T) {
			d, err := Decode([]byte(c.doc), c.file)
			if err == nil {
				t.Fatalf("accepted %q as %#v", c.doc, d.Root)
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("%T %v is not an *Error", err, err)
			}
			if !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), c.file+": ") {
				t.Errorf("error %q, want it to contain %q", err, c.want)
			}
			if c.line != 0 && e.Line != c.line {
				t.Errorf("error %q: line %d, want %d", err, e.Line, c.line)
			}
		})
	}
}

// TestSameInBothFormats: JSON and YAML decode to the same values.
func TestSameInBothFormats(t *testing.T) {
	j := `{"version": "1", "n": 10, "f": 1.5, "e": 1e3, "neg": -2, "t": true, "no": false, "nil": null, "empty": "",
	"list": [1, "two", {"three": [3]}], "date": "2001-12-14", "Case": 1, "case": 2, "dotted.key": {"k": "v"}}`
	y := `
version: "1"
n: 10
f: 1.5
e: 1e3
neg: -2
t: true
no: false
nil:
empty: ''
list:
  - 1
  - two
  - three: [3]
date: 2001-12-14
Case: 1
case: 2
dotted.key: {k: v}
`
	dj, err := Decode([]byte(j), "x.json")
	if err != nil {
		t.Fatal(err)
	}
	dy, err := Decode([]byte(y), "x.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if dj.Format != "json" || dy.Format != "yaml" {
		t.Errorf("formats %s %s", dj.Format, dy.Format)
	}
	if !reflect.DeepEqual(dj.Root, dy.Root) {
		t.Errorf("JSON and YAML differ:\n%#v\n%#v", dj.Root, dy.Root)
	}
	m := dy.Root.(map[string]any)
	// Keys stay exact: "Case" and "case" are two fields, neither a
	// duplicate of the other.
	if m["Case"] != json.Number("1") || m["case"] != json.Number("2") || m["n"] != json.Number("10") {
		t.Errorf("%#v", m)
	}
	// The same JSON in a .yaml file, and with a byte order mark.
	for _, c := range []struct{ data, name string }{{j, "x.yaml"}, {"\xef\xbb\xbf" + j, "x.json"}, {"\xef\xbb\xbf" + y, "x"}} {
		d, err := Decode([]byte(c.data), c.name)
		if err != nil || !reflect.DeepEqual(d.Root, dj.Root) {
			t.Errorf("%s: %v %#v", c.name, err, d)
		}
	}
}

func TestFormat(t *testing.T) {
	for _, c := range []struct {
		data, name string
		yaml       bool
	}{
		{`{"a": 1}`, "p.json", false},
		{"  \n{\"a\": 1}", "p", false},
		{"\xef\xbb\xbf{}", "p.json", false},
		{`{"a": 1}`, "p.yaml", true},
		{`{"a": 1}`, "p.YML", true},
		{"a: 1", "p.json", true},
		{"[1]", "p.json", true},
	} {
		if got := IsYAML([]byte(c.data), c.name); got != c.yaml {
			t.Errorf("IsYAML(%q, %q) = %v", c.data, c.name, got)
		}
	}
}

// TestLines: a field's line is its key's (an item's, in a list); a field
// the file lacks has its nearest ancestor's.
func TestLines(t *testing.T) {
	y := `# a comment
version: "1"
tools:
  run_python:
    action: approve
    limits:
      - counter: runs
        max: 10

      - {counter: b,
         max: 3}
  github.*: {action: deny}
  github: {action: allow}
`
	j := `{
  "version": "1",
  "tools": {
    "run_python": {
      "action": "approve",
      "limits": [
        {"counter": "runs",
         "max": 10},

        {"counter": "b",
         "max": 3}]},
    "github.*": {"action": "deny"},
    "github": {"action": "allow"}
  }
}`
	want := map[string][2]int{ // field: YAML line, JSON line
		"":                               {2, 1},
		"version":                        {2, 2},
		"tools":                          {3, 3},
		"tools.run_python":               {4, 4},
		"tools.run_python.action":        {5, 5},
		"tools.run_python.limits":        {6, 6},
		"tools.run_python.limits[0]":     {7, 7},
		"tools.run_python.limits[0].max": {8, 8},
		"tools.run_python.limits[1]":     {10, 10},
		"tools.run_python.limits[1].max": {11, 11},
		"tools.run_python.limits[1].by":  {10, 10}, // missing: its object's line
		"tools.run_python.limits[7]":     {6, 6},   // no such item: the list's
		"tools.run_python.reason":        {4, 4},
		"tools.github.*":                 {12, 12},
		"tools.github.*.action":          {12, 12},
		"tools.github":                   {13, 13},
		"tools.github.action":            {13, 13},
		"nothing":                        {2, 1},
	}
	for i, c := range []struct{ data, name string }{{y, "p.yaml"}, {j, "p.json"}} {
		d, err := Decode([]byte(c.data), c.name)
		if err != nil {
			t.Fatal(err)
		}
		for field, lines := range want {
			if got := d.Line(field); got != lines[i] {
				t.Errorf("%s: line of %q is %d, want %d", c.name, field, got, lines[i])
			}
		}
		if e := d.Errorf("tools.run_python.limits[1].max", "too %s", "big"); e.Error() != c.name+": line 11: tools.run_python.limits[1].max: too big" {
			t.Errorf("%q", e)
		}
	}
}

func TestErrorText(t *testing.T) {
	for _, c := range []struct {
		e    Error
		want string
	}{
		{Error{File: "f", Msg: "m"}, "f: m"},
		{Error{File: "f", Line: 3, Msg: "m"}, "f: line 3: m"},
		{Error{File: "f", Field: "a.b", Msg: "m"}, "f: a.b: m"},
		{Error{File: "f", Line: 7, Field: "a.b", Msg: "m"}, "f: line 7: a.b: m"},
	} {
		if got := c.e.Error(); got != c.want {
			t.Errorf("%q, want %q", got, c.want)
		}
	}
}

// FuzzDecode: no input panics Decode, and what JSON input it accepts,
// encoding/json accepts too, with the same values.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"a": [1, {"b": null}], "c": "d"}`), "x.json")
	f.Add([]byte("a: [1, {b: ~}]\nc: d\n"), "x.yaml")
	f.Fuzz(func(t *testing.T, data []byte, name string) {
		d, err := Decode(data, name)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %T %v", err, err)
			}
			return
		}
		_ = d.Line("a.b[0].c")
		if d.Format == "json" {
			var v any
			if err := json.Unmarshal(data[len(data)-len(strings.TrimPrefix(string(data), "\xef\xbb\xbf")):], &v); err != nil {
				t.Fatalf("accepted what encoding/json refuses: %v", err)
			}
		}
	})
}
