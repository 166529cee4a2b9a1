package pep

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/testutil"
)

var update = flag.Bool("update", false, "update golden files")

// scriptResult is what a golden file records for one testdata/*.py input.
type scriptResult struct {
	Metadata *ScriptMetadata `json:"metadata"`
	Error    string          `json:"error,omitempty"`
}

func TestParseScriptMetadataGolden(t *testing.T) {
	inputs, err := filepath.Glob(filepath.Join("testdata", "*.py"))
	if err != nil {
		t.Fatal(err)
	}
	if len(inputs) == 0 {
		t.Fatal("no testdata/*.py inputs")
	}
	for _, in := range inputs {
		name := strings.TrimSuffix(filepath.Base(in), ".py")
		t.Run(name, func(t *testing.T) {
			code, err := os.ReadFile(in)
			if err != nil {
				t.Fatal(err)
			}
			var res scriptResult
			res.Metadata, err = ParseScriptMetadata(string(code))
			if err != nil {
				res.Error = err.Error()
			}
			// Keep <, > and & readable: they are in every specifier.
			var buf bytes.Buffer
			enc := json.NewEncoder(&buf)
			enc.SetEscapeHTML(false)
			enc.SetIndent("", "  ")
			if err := enc.Encode(res); err != nil {
				t.Fatal(err)
			}
			got := buf.Bytes()

			testutil.Golden(t, strings.TrimSuffix(in, ".py")+".golden", got, *update)
		})
	}
}

func TestParseScriptMetadata(t *testing.T) {
	const block = "# /// script\n# requires-python = '>=3.9'\n# dependencies = ['rich']\n# ///\n"
	want := &ScriptMetadata{RequiresPython: ">=3.9", Dependencies: []string{"rich"}, StartLine: 1, EndLine: 4}

	tests := []struct {
		name string
		code string
		want *ScriptMetadata
	}{
		{"plain", block, want},
		{"crlf", strings.ReplaceAll(block, "\n", "\r\n"), want},
		{"cr", strings.ReplaceAll(block, "\n", "\r"), want},
		{"bom", "\ufeff" + block, want},
		{"after code", "import os\n\n" + block + "print(1)\n", &ScriptMetadata{RequiresPython: ">=3.9", Dependencies: []string{"rich"}, StartLine: 3, EndLine: 6}},
		{"empty", "", nil},
		{"only opening", "# /// script\n", nil},
		{"opening at eof", "# /// script", nil},
		{"content without close", "# /// script\n# a = 1\n", nil},
		{"close after blank line", "# /// script\n# a = 1\n\n# ///\n", nil},
		{"no dependencies", "# /// script\n# requires-python = '>=3.9'\n# ///", &ScriptMetadata{RequiresPython: ">=3.9", StartLine: 1, EndLine: 3}},
		{"empty dependencies", "# /// script\n# dependencies = []\n# ///", &ScriptMetadata{Dependencies: []string{}, StartLine: 1, EndLine: 3}},
		{"empty requires-python", "# /// script\n# requires-python = ''\n# ///", &ScriptMetadata{StartLine: 1, EndLine: 3}},
		{"hash line", "# /// script\n#\n# dependencies = ['a']\n#\n# ///", &ScriptMetadata{Dependencies: []string{"a"}, StartLine: 1, EndLine: 5}},
		{"tab after hash is not a comment line", "# /// script\n#\tdependencies = ['a']\n# ///", nil},
		{"hash space only", "# /// script\n# \n# ///", &ScriptMetadata{StartLine: 1, EndLine: 3}},
		{
			// Brackets, braces and dots inside TOML strings do not count
			// towards the nesting and key-length limits.
			"strings are not structure",
			"# /// script\n" +
				"# dependencies = ['a[b]', \"c[d] ; os_name == '" + strings.Repeat("[{.", 40) + "'\"]\n" +
				"# [tool.x]\n" +
				"# ml = \"\"\"\n# " + strings.Repeat("[.", 40) + "\\\"\"\"\"\"\n" +
				"# lit = '''" + strings.Repeat("{.", 40) + "''''\n" +
				"# ///\n",
			&ScriptMetadata{Dependencies: []string{"a[b]", "c[d] ; os_name == '" + strings.Repeat("[{.", 40) + "'"}, StartLine: 1, EndLine: 7},
		},
		{"depth at the limit", "# /// script\n# a = " + strings.Repeat("[", 32) + strings.Repeat("]", 32) + "\n# ///", &ScriptMetadata{StartLine: 1, EndLine: 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseScriptMetadata(tt.code)
			if err != nil {
				t.Fatalf("ParseScriptMetadata: %v", err)
			}
			if !equalMetadata(got, tt.want) {
				t.Errorf("ParseScriptMetadata = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func equalMetadata(a, b *ScriptMetadata) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.RequiresPython == b.RequiresPython && slices.Equal(a.Dependencies, b.Dependencies) &&
		(a.Dependencies == nil) == (b.Dependencies == nil) && a.StartLine == b.StartLine && a.EndLine == b.EndLine
}

func TestParseScriptMetadataErrors(t *testing.T) {
	many := make([]string, MaxDependencies+1)
	for i := range many {
		many[i] = fmt.Sprintf("'pkg%d'", i)
	}
	tests := []struct {
		name, code, want string
	}{
		{
			"toml error line is the source line",
			"\n\n# /// script\n# a = 1\n# b = \n# ///\n",
			"pep723: line 5: invalid TOML in script metadata: ",
		},
		{
			"duplicate",
			"# /// script\n# a = 1\n# ///\nx = 1\n# /// script\n# a = 1\n# ///\n",
			"pep723: more than one script metadata block (lines 1 and 5)",
		},
		{
			"too many dependencies",
			"# /// script\n# dependencies = [" + strings.Join(many, ", ") + "]\n# ///\n",
			"pep723: line 2: too many dependencies (257, limit 256)",
		},
		{
			"too large",
			"# /// script\n" + strings.Repeat("# x = 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa'\n", 1000) + "# ///\n",
			"pep723: line 1: script metadata block too large (75000 bytes, limit 65536)",
		},
		{
			"dependency control character",
			"# /// script\n# dependencies = [\"foo\\u0000\"]\n# ///\n",
			`pep723: line 2: dependencies[0]: pep508: "foo\x00": control or invisible formatting character U+0000 not allowed at column 4`,
		},
		{
			"dependencies table",
			"# /// script\n# [dependencies]\n# a = 1\n# ///\n",
			"pep723: line 1: dependencies must be a list of strings, not a table",
		},
		{
			"array of tables",
			"# /// script\n# [[dependencies]]\n# a = 1\n# ///\n",
			"pep723: line 1: dependencies must be a list of strings, not an array",
		},
		{
			"nested too deeply",
			"# /// script\n# a = " + strings.Repeat("[", 33) + "\n# ///\n",
			"pep723: line 2: script metadata nested too deeply (limit 32)",
		},
		{
			"key too long",
			"# /// script\n# x = 1\n# " + strings.Repeat("a.", 65) + "b = 1\n# ///\n",
			"pep723: line 3: too many dotted parts on one line of script metadata (limit 64)",
		},
		{
			"requires-python bool",
			"# /// script\n# requires-python=true\n# ///\n",
			"pep723: line 2: requires-python must be a string, not a boolean",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			md, err := ParseScriptMetadata(tt.code)
			if err == nil {
				t.Fatalf("ParseScriptMetadata = %+v, want error", md)
			}
			if !strings.HasPrefix(err.Error(), tt.want) {
				t.Errorf("ParseScriptMetadata error:\n got  %s\n want %s", err, tt.want)
			}
		})
	}
}

// TestParseScriptMetadataLinear guards against inputs that would make
// parsing slow: long runs of comment lines full of unclosed openings (a
// naive use of the reference regular expression backtracks quadratically),
// and TOML shapes the TOML parser handles in quadratic time.
func TestParseScriptMetadataLinear(t *testing.T) {
	var longKeys, longHeaders strings.Builder
	for i := range 400 {
		fmt.Fprintf(&longKeys, "# %sb%d = 1\n", strings.Repeat("a.", 60), i)
		fmt.Fprintf(&longHeaders, "# [%sb%d]\n", strings.Repeat("a.", 60), i)
	}
	for _, code := range []string{
		strings.Repeat("# /// script\n", 200_000),
		strings.Repeat("# /// a\n# x\n", 100_000) + "x = 1\n",
		strings.Repeat("# ///\n", 200_000),
		strings.Repeat("#\n", 200_000),
		"# /// script\n" + longKeys.String() + "# ///\n",
		"# /// script\n" + longHeaders.String() + "# ///\n",
		"# /// script\n# a = " + strings.Repeat("{b=", 20_000) + "\n# ///\n",
		"# /// script\n# " + strings.Repeat("a.", 30_000) + "b = 1\n# ///\n",
	} {
		start := time.Now()
		// Only the time matters here; some of these are errors.
		ParseScriptMetadata(code)
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("ParseScriptMetadata on %d bytes took %v", len(code), d)
		}
	}
}

func FuzzParseScriptMetadata(f *testing.F) {
	if seeds, _ := filepath.Glob(filepath.Join("testdata", "*.py")); seeds != nil {
		for _, path := range seeds {
			if b, err := os.ReadFile(path); err == nil {
				f.Add(string(b))
			}
		}
	}
	f.Add("# /// script\r\n# dependencies = ['a']\r\n# ///")
	f.Add("# /// script\n# dependencies = [[[[[[[\n# ///")
	f.Add("# /// script\n# x = 1979-05-27T07:32:00Z\n# dependencies = ['a']\n# ///\n# /// a\n# ///")
	f.Fuzz(func(t *testing.T, code string) {
		md, err := ParseScriptMetadata(code)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "pep723: ") {
				t.Fatalf("error %q lacks the pep723 prefix", err)
			}
			return
		}
		if md == nil {
			return
		}
		lines := strings.Count(normalizeNewlines(code), "\n") + 1
		if md.StartLine < 1 || md.EndLine < md.StartLine+2 || md.EndLine > lines {
			t.Fatalf("bad block lines %d-%d in %d lines", md.StartLine, md.EndLine, lines)
		}
		if len(md.Dependencies) > MaxDependencies {
			t.Fatalf("%d dependencies accepted", len(md.Dependencies))
		}
		for _, d := range md.Dependencies {
			if _, err := ParseRequirement(d); err != nil {
				t.Fatalf("invalid dependency accepted: %v", err)
			}
		}
		if _, err := ParseSpecifierSet(md.RequiresPython); err != nil {
			t.Fatalf("invalid requires-python accepted: %v", err)
		}
	})
}

// TestInspectScriptMetadata: a checker gets the block, everything valid in
// it, and every problem, where a run gets the first problem alone.
func TestInspectScriptMetadata(t *testing.T) {
	code := "import x\n# /// script\n# requires-python = \">=3.9\"\n# dependencies = [\n#   \"requests\",\n#   \"numpy===\",\n#   3,\n#   \"pandas>=2\",\n# ]\n# ///\n"
	md, problems := InspectScriptMetadata(code)
	if md == nil || md.StartLine != 2 || md.EndLine != 10 || md.RequiresPython != ">=3.9" || !slices.Equal(md.Dependencies, []string{"requests", "pandas>=2"}) {
		t.Fatalf("metadata %+v", md)
	}
	if len(problems) != 2 {
		t.Fatalf("problems %v", problems)
	}
	var de *DependencyError
	if !errors.As(problems[0], &de) || de.Index != 1 || de.Requirement != "numpy===" || de.Line != 6 {
		t.Errorf("first problem %#v", problems[0])
	}
	if !errors.As(problems[1], &de) || de.Index != 2 || de.Requirement != "" || problems[1].Error() != "pep723: line 4: dependencies[2] must be a string, not an integer" {
		t.Errorf("second problem %v", problems[1])
	}
	// A run is refused on the first.
	if _, err := ParseScriptMetadata(code); err == nil || err.Error() != problems[0].Error() {
		t.Errorf("ParseScriptMetadata: %v", err)
	}
	// A bad requires-python leaves the dependencies.
	md, problems = InspectScriptMetadata("# /// script\n# requires-python = \">=3.x\"\n# dependencies = [\"a\"]\n# ///\n")
	if md == nil || md.RequiresPython != "" || !slices.Equal(md.Dependencies, []string{"a"}) || len(problems) != 1 || !strings.Contains(problems[0].Error(), "requires-python") {
		t.Errorf("bad requires-python: %+v %v", md, problems)
	}
	// Unparsable TOML, or two blocks: the block is there, with nothing in it.
	for _, c := range []string{"# /// script\n# a = \n# ///\n", "# /// script\n# a = 1\n# ///\n# /// script\n# a = 1\n# ///\n"} {
		md, problems = InspectScriptMetadata(c)
		if md == nil || md.StartLine != 1 || md.Dependencies != nil || len(problems) != 1 {
			t.Errorf("%q: %+v %v", c, md, problems)
		}
	}
	if md, problems := InspectScriptMetadata("print(1)\n"); md != nil || problems != nil {
		t.Errorf("no block: %+v %v", md, problems)
	}
}
