package pep

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestParseRequirement(t *testing.T) {
	tests := []struct {
		in   string
		want Requirement // the unexported canonical marker is checked through str
		str  string      // want String()
	}{
		// The examples from PEP 508's test section.
		{in: "A", want: Requirement{Name: "A", Normalized: "a"}, str: "A"},
		{in: "A.B-C_D", want: Requirement{Name: "A.B-C_D", Normalized: "a-b-c-d"}, str: "A.B-C_D"},
		{in: "aa", want: Requirement{Name: "aa", Normalized: "aa"}, str: "aa"},
		{in: "name", want: Requirement{Name: "name", Normalized: "name"}, str: "name"},
		{in: "name<=1", want: Requirement{Name: "name", Normalized: "name", Specifier: "<=1"}, str: "name<=1"},
		{in: "name>=3", want: Requirement{Name: "name", Normalized: "name", Specifier: ">=3"}, str: "name>=3"},
		{in: "name>=3,<2", want: Requirement{Name: "name", Normalized: "name", Specifier: ">=3,<2"}, str: "name>=3,<2"},
		{in: "name@http://foo.com", want: Requirement{Name: "name", Normalized: "name", URL: "http://foo.com"}, str: "name @ http://foo.com"},
		{
			in:   "name [fred,bar] @ http://foo.com ; python_version=='2.7'",
			want: Requirement{Name: "name", Normalized: "name", Extras: []string{"fred", "bar"}, URL: "http://foo.com", Marker: "python_version=='2.7'"},
			str:  `name[fred,bar] @ http://foo.com ; python_version == "2.7"`,
		},
		{
			in:   "name[quux, strange];python_version<'2.7' and platform_version=='2'",
			want: Requirement{Name: "name", Normalized: "name", Extras: []string{"quux", "strange"}, Marker: "python_version<'2.7' and platform_version=='2'"},
			str:  `name[quux,strange]; python_version < "2.7" and platform_version == "2"`,
		},
		{
			in:   "name; os_name=='a' or os_name=='b'",
			want: Requirement{Name: "name", Normalized: "name", Marker: "os_name=='a' or os_name=='b'"},
			str:  `name; os_name == "a" or os_name == "b"`,
		},
		{
			in:   `requests [security,tests] >= 2.8.1, == 2.8.* ; python_version < "2.7"`,
			want: Requirement{Name: "requests", Normalized: "requests", Extras: []string{"security", "tests"}, Specifier: ">=2.8.1,==2.8.*", Marker: `python_version < "2.7"`},
			str:  `requests[security,tests]>=2.8.1,==2.8.*; python_version < "2.7"`,
		},
		{
			in:   "pip @ https://github.com/pypa/pip/archive/1.3.1.zip#sha1=da9234ee9982d4bbb3c72346a6de940a148ea686",
			want: Requirement{Name: "pip", Normalized: "pip", URL: "https://github.com/pypa/pip/archive/1.3.1.zip#sha1=da9234ee9982d4bbb3c72346a6de940a148ea686"},
			str:  "pip @ https://github.com/pypa/pip/archive/1.3.1.zip#sha1=da9234ee9982d4bbb3c72346a6de940a148ea686",
		},

		// Everyday forms.
		{in: "  numpy  ", want: Requirement{Name: "numpy", Normalized: "numpy"}, str: "numpy"},
		{in: "Django_REST.framework", want: Requirement{Name: "Django_REST.framework", Normalized: "django-rest-framework"}, str: "Django_REST.framework"},
		{in: "numpy>=1.26,<2", want: Requirement{Name: "numpy", Normalized: "numpy", Specifier: ">=1.26,<2"}, str: "numpy>=1.26,<2"},
		{in: "numpy (>=1.26, <2)", want: Requirement{Name: "numpy", Normalized: "numpy", Specifier: ">=1.26,<2"}, str: "numpy>=1.26,<2"},
		{in: "numpy(>=1.26)", want: Requirement{Name: "numpy", Normalized: "numpy", Specifier: ">=1.26"}, str: "numpy>=1.26"},
		{in: "rich~=13.7", want: Requirement{Name: "rich", Normalized: "rich", Specifier: "~=13.7"}, str: "rich~=13.7"},
		{in: "torch==2.2.0+cpu", want: Requirement{Name: "torch", Normalized: "torch", Specifier: "==2.2.0+cpu"}, str: "torch==2.2.0+cpu"},
		{in: "foo!=1.0.*", want: Requirement{Name: "foo", Normalized: "foo", Specifier: "!=1.0.*"}, str: "foo!=1.0.*"},
		{in: "foo===1.0-weird_thing", want: Requirement{Name: "foo", Normalized: "foo", Specifier: "===1.0-weird_thing"}, str: "foo===1.0-weird_thing"},
		{in: "foo>=1.0a1.post2.dev3", want: Requirement{Name: "foo", Normalized: "foo", Specifier: ">=1.0a1.post2.dev3"}, str: "foo>=1.0a1.post2.dev3"},
		{in: "foo[]", want: Requirement{Name: "foo", Normalized: "foo"}, str: "foo"},
		{in: "foo[ a-b , c.d ]>=1", want: Requirement{Name: "foo", Normalized: "foo", Extras: []string{"a-b", "c.d"}, Specifier: ">=1"}, str: "foo[a-b,c.d]>=1"},
		{in: "foo\t>=\t1", want: Requirement{Name: "foo", Normalized: "foo", Specifier: ">=1"}, str: "foo>=1"},
		{
			in:   "pkg @ git+https://github.com/org/pkg.git@v1.2#egg=pkg",
			want: Requirement{Name: "pkg", Normalized: "pkg", URL: "git+https://github.com/org/pkg.git@v1.2#egg=pkg"},
			str:  "pkg @ git+https://github.com/org/pkg.git@v1.2#egg=pkg",
		},
		{in: "pkg @ file:///tmp/pkg-1.0.whl", want: Requirement{Name: "pkg", Normalized: "pkg", URL: "file:///tmp/pkg-1.0.whl"}, str: "pkg @ file:///tmp/pkg-1.0.whl"},
		{in: "pkg @ https://x.org/a%20b.whl", want: Requirement{Name: "pkg", Normalized: "pkg", URL: "https://x.org/a%20b.whl"}, str: "pkg @ https://x.org/a%20b.whl"},
		{
			// A ';' glued to a URL is part of the URL (PEP 508).
			in:   "pkg @ https://x.org/a.whl;x=1",
			want: Requirement{Name: "pkg", Normalized: "pkg", URL: "https://x.org/a.whl;x=1"},
			str:  "pkg @ https://x.org/a.whl;x=1",
		},

		// Markers.
		{
			in:   `foo; sys_platform == "win32"`,
			want: Requirement{Name: "foo", Normalized: "foo", Marker: `sys_platform == "win32"`},
			str:  `foo; sys_platform == "win32"`,
		},
		{
			in:   `foo ;python_version in '2.6 2.7'`,
			want: Requirement{Name: "foo", Normalized: "foo", Marker: `python_version in '2.6 2.7'`},
			str:  `foo; python_version in "2.6 2.7"`,
		},
		{
			in:   `foo; "linux" not in sys_platform`,
			want: Requirement{Name: "foo", Normalized: "foo", Marker: `"linux" not in sys_platform`},
			str:  `foo; "linux" not in sys_platform`,
		},
		{
			in:   `foo; '3.8' <= python_version`,
			want: Requirement{Name: "foo", Normalized: "foo", Marker: `'3.8' <= python_version`},
			str:  `foo; "3.8" <= python_version`,
		},
		{
			in:   `foo; platform_release >= "5.10.0-21-amd64"`,
			want: Requirement{Name: "foo", Normalized: "foo", Marker: `platform_release >= "5.10.0-21-amd64"`},
			str:  `foo; platform_release >= "5.10.0-21-amd64"`,
		},
		{
			in:   `foo; python_full_version == '3.11.*' and implementation_name=="cpython"and extra == 'test'`,
			want: Requirement{Name: "foo", Normalized: "foo", Marker: `python_full_version == '3.11.*' and implementation_name=="cpython"and extra == 'test'`},
			str:  `foo; python_full_version == "3.11.*" and implementation_name == "cpython" and extra == "test"`,
		},
		{
			in:   `foo; os_name == "it's"`,
			want: Requirement{Name: "foo", Normalized: "foo", Marker: `os_name == "it's"`},
			str:  `foo; os_name == "it's"`,
		},
		{
			in:   `foo; os_name == 'say "hi"'`,
			want: Requirement{Name: "foo", Normalized: "foo", Marker: `os_name == 'say "hi"'`},
			str:  `foo; os_name == 'say "hi"'`,
		},
		{
			in: `foo; platform_machine=="x86_64" and platform_system=="Linux" and platform_python_implementation=="CPython" ` +
				`and implementation_version>="3.9"`,
			want: Requirement{Name: "foo", Normalized: "foo", Marker: `platform_machine=="x86_64" and platform_system=="Linux" and platform_python_implementation=="CPython" and implementation_version>="3.9"`},
			str:  `foo; platform_machine == "x86_64" and platform_system == "Linux" and platform_python_implementation == "CPython" and implementation_version >= "3.9"`,
		},
	}
	for _, tt := range tests {
		got, err := ParseRequirement(tt.in)
		if err != nil {
			t.Errorf("ParseRequirement(%q): %v", tt.in, err)
			continue
		}
		if got.Name != tt.want.Name || got.Normalized != tt.want.Normalized || !slices.Equal(got.Extras, tt.want.Extras) ||
			got.Specifier != tt.want.Specifier || got.URL != tt.want.URL || got.Marker != tt.want.Marker {
			t.Errorf("ParseRequirement(%q) =\n %#v\nwant\n %#v", tt.in, got, tt.want)
		}
		if s := got.String(); s != tt.str {
			t.Errorf("ParseRequirement(%q).String() = %q, want %q", tt.in, s, tt.str)
		}
		again, err := ParseRequirement(got.String())
		if err != nil || again.key() != got.key() {
			t.Errorf("ParseRequirement(%q).String() = %q does not round-trip: %v", tt.in, got.String(), err)
		}
	}
}

// TestMarkerPrecedence checks that "and" binds tighter than "or", using the
// PEP 508 examples and the canonical spelling, which only keeps the
// parentheses that matter.
func TestMarkerPrecedence(t *testing.T) {
	tests := []struct {
		marker, want string
	}{
		// (a and b) or c
		{"os_name=='a' and os_name=='b' or os_name=='c'", `os_name == "a" and os_name == "b" or os_name == "c"`},
		// a and (b or c)
		{"os_name=='a' and (os_name=='b' or os_name=='c')", `os_name == "a" and (os_name == "b" or os_name == "c")`},
		// a or (b and c)
		{"os_name=='a' or os_name=='b' and os_name=='c'", `os_name == "a" or os_name == "b" and os_name == "c"`},
		// (a or b) and c
		{"(os_name=='a' or os_name=='b') and os_name=='c'", `(os_name == "a" or os_name == "b") and os_name == "c"`},
		// Redundant parentheses go.
		{"((os_name=='a')) and (os_name=='b' and os_name=='c')", `os_name == "a" and os_name == "b" and os_name == "c"`},
		{"(os_name=='a')or(os_name=='b')", `os_name == "a" or os_name == "b"`},
	}
	for _, tt := range tests {
		r, err := ParseRequirement("name; " + tt.marker)
		if err != nil {
			t.Errorf("marker %q: %v", tt.marker, err)
			continue
		}
		if r.marker != tt.want {
			t.Errorf("marker %q: canonical form %q, want %q", tt.marker, r.marker, tt.want)
		}
	}
}

func TestParseRequirementErrors(t *testing.T) {
	tests := []struct {
		in, want string // want is the whole error message
	}{
		{"numpy>=", `pep508: "numpy>=": expected a version after ">=" at column 8`},
		{"==1.0", `pep508: "==1.0": expected a package name, found "=" at column 1`},
		{"foo bar", `pep508: "foo bar": unexpected "b" after package name; expected a version specifier, "@ URL", ";" or end at column 5`},
		{"foo;", `pep508: "foo;": expected a marker after ";" at column 5`},
		{"foo @ notaurl", `pep508: "foo @ notaurl": invalid URL "notaurl": a URL must start with a scheme, such as "https://" at column 7`},
		{"foo~=1", `pep508: "foo~=1": "~=" needs at least two release segments, as in "~=1.0" at column 6`},
		{"", `pep508: "": empty requirement`},
		{"   ", `pep508: "   ": empty requirement`},
		{"foo-", `pep508: "foo-": invalid package name "foo-": names must start and end with a letter or digit at column 1`},
		{"_foo", `pep508: "_foo": invalid package name "_foo": names must start and end with a letter or digit at column 1`},
		{"foo=1.0", `pep508: "foo=1.0": "=" is not a version operator, use "==" at column 4`},
		{"foo=>1.0", `pep508: "foo=>1.0": "=>" is not a version operator, use ">=" at column 4`},
		{"foo>=1.0<2", `pep508: "foo>=1.0<2": missing "," between version specifiers at column 9`},
		{"foo>=1.0,", `pep508: "foo>=1.0,": expected a version specifier after "," at column 10`},
		{"foo>=1.0,,<2", `pep508: "foo>=1.0,,<2": expected a version specifier after "," at column 10`},
		{"foo 1.0", `pep508: "foo 1.0": unexpected "1" after package name; expected a version specifier, "@ URL", ";" or end at column 5`},
		{"foo>=1.0 bar", `pep508: "foo>=1.0 bar": unexpected "b" after version specifier at column 10`},
		{"foo>=1.*", `pep508: "foo>=1.*": ".*" suffix can only be used with "==" or "!=", not ">=" at column 6`},
		{"foo==1.*.1", `pep508: "foo==1.*.1": invalid version "1.*.1" at column 6`},
		{"foo>1.0+local", `pep508: "foo>1.0+local": local version label in "1.0+local" can only be used with "==" or "!=", not ">" at column 5`},
		{"foo>=latest", `pep508: "foo>=latest": invalid version "latest" at column 6`},
		{"foo (>=1.0", `pep508: "foo (>=1.0": unclosed "(" at column 5`},
		{"foo ()", `pep508: "foo ()": expected a version specifier inside parentheses at column 6`},
		{"foo (>=1.0))", `pep508: "foo (>=1.0))": unexpected ")" after version specifier at column 12`},
		{"foo(>=1.0;python_version>'3')", `pep508: "foo(>=1.0;python_version>'3')": unexpected ";" after version specifier at column 10`},
		{"foo[bar", `pep508: "foo[bar": unclosed "[" at column 4`},
		{"foo[bar,]", `pep508: "foo[bar,]": expected an extra name, found "]" at column 9`},
		{"foo[,bar]", `pep508: "foo[,bar]": expected an extra name, found "," at column 5`},
		{"foo[bar baz]", `pep508: "foo[bar baz]": expected "," or "]" in extras, found "b" at column 9`},
		{"foo[bar-]", `pep508: "foo[bar-]": invalid extra name "bar-": names must start and end with a letter or digit at column 5`},
		{"foo[bar]x", `pep508: "foo[bar]x": unexpected "x" after extras; expected a version specifier, "@ URL", ";" or end at column 9`},
		{"foo @", `pep508: "foo @": expected a URL after "@" at column 6`},
		{"foo @ http://", `pep508: "foo @ http://": invalid URL "http://": missing host at column 7`},
		{"foo @ https:example.com/x", `pep508: "foo @ https:example.com/x": invalid URL "https:example.com/x": missing host at column 7`},
		{"foo @ file:", `pep508: "foo @ file:": invalid URL "file:": missing path at column 7`},
		{"foo @ ./local/dir", `pep508: "foo @ ./local/dir": invalid URL "./local/dir": a URL must start with a scheme, such as "https://" at column 7`},
		{`foo @ C:\x\y.whl`, `pep508: "foo @ C:\\x\\y.whl": invalid URL "C:\\x\\y.whl": character '\\' not allowed in a URL at column 7`},
		{"foo @ https://x.org/a%2.whl", `pep508: "foo @ https://x.org/a%2.whl": invalid URL "https://x.org/a%2.whl": bad percent-encoding at "%2." at column 7`},
		{"foo @ https://x.org/é.whl", `pep508: "foo @ https://x.org/é.whl": invalid URL "https://x.org/é.whl": non-ASCII characters must be percent-encoded at column 7`},
		{
			`foo @ https://x.org/a.whl;python_version<"3"`,
			`pep508: "foo @ https://x.org/a.whl;python_version<\"3\"": invalid URL "https://x.org/a.whl;python_version<\"3\"": character '<' not allowed in a URL (to add a marker after a URL, put a space before the ";") at column 7`,
		},
		{"foo @ https://x.org/a.whl extra", `pep508: "foo @ https://x.org/a.whl extra": unexpected "e" after URL; expected ";" or end at column 27`},
		{"foo>=1 @ https://x.org/a.whl", `pep508: "foo>=1 @ https://x.org/a.whl": unexpected "@" after version specifier at column 8`},
		{"foo; python_version", `pep508: "foo; python_version": expected a marker operator (one of == != < <= > >= ~= === in, not in), found end of input at column 20`},
		{"foo; python_version >", `pep508: "foo; python_version >": expected a marker variable or quoted string, found end of input at column 22`},
		{"foo; python_version > 3.8", `pep508: "foo; python_version > 3.8": marker values must be quoted, as in "3.8" at column 23`},
		{"foo; python_version = '3.8'", `pep508: "foo; python_version = '3.8'": "=" is not an operator, use "==" at column 21`},
		{"foo; python_version >= '3.x'", `pep508: "foo; python_version >= '3.x'": invalid version "3.x" in marker at column 24`},
		{"foo; python_version == '3.*.1'", `pep508: "foo; python_version == '3.*.1'": invalid version "3.*.1" in marker at column 24`},
		{"foo; python_version ~= '3'", `pep508: "foo; python_version ~= '3'": "~=" needs at least two release segments, as in "~=3.0" in marker at column 24`},
		{"foo; 'three' < python_version", `pep508: "foo; 'three' < python_version": invalid version "three" in marker at column 6`},
		{"foo; os_name ~= 'posix'", `pep508: "foo; os_name ~= 'posix'": invalid version "posix" in marker at column 17`},
		{"foo; python_version < '3.8", `pep508: "foo; python_version < '3.8": unterminated string in marker at column 23`},
		{"foo; pyhton_version < '3.8'", `pep508: "foo; pyhton_version < '3.8'": unknown marker variable "pyhton_version" at column 6`},
		{"foo; os.name == 'posix'", `pep508: "foo; os.name == 'posix'": unknown marker variable "os.name", use "os_name" at column 6`},
		{"foo; python_implementation == 'CPython'", `pep508: "foo; python_implementation == 'CPython'": unknown marker variable "python_implementation", use "platform_python_implementation" at column 6`},
		{"foo; 'a' == 'b'", `pep508: "foo; 'a' == 'b'": marker compares two quoted strings; one side must be a variable such as python_version at column 6`},
		{"foo; os_name == sys_platform", `pep508: "foo; os_name == sys_platform": marker compares two variables; one side must be a quoted string at column 6`},
		{"foo; os_name notin 'posix'", `pep508: "foo; os_name notin 'posix'": expected a marker operator (one of == != < <= > >= ~= === in, not in), found "n" at column 14`},
		{"foo; os_name not'posix'", `pep508: "foo; os_name not'posix'": expected whitespace and "in" after "not" at column 17`},
		{"foo; os_name not is 'posix'", `pep508: "foo; os_name not is 'posix'": expected "in" after "not" at column 18`},
		{"foo; os_name == 'a' and", `pep508: "foo; os_name == 'a' and": expected a marker variable or quoted string, found end of input at column 24`},
		{"foo; os_name == 'a' and or os_name == 'b'", `pep508: "foo; os_name == 'a' and or os_name == 'b'": expected a marker variable or quoted string, found "or" at column 25`},
		{"foo; os_name == 'a' && os_name == 'b'", `pep508: "foo; os_name == 'a' && os_name == 'b'": unexpected "&" in marker; expected "and", "or" or end at column 21`},
		{"foo; os_name == 'a'andos_name == 'b'", `pep508: "foo; os_name == 'a'andos_name == 'b'": unexpected "a" in marker; expected "and", "or" or end at column 20`},
		{"foo; (os_name == 'a'", `pep508: "foo; (os_name == 'a'": unclosed "(" in marker at column 6`},
		{"foo; (os_name == 'a' os_name", `pep508: "foo; (os_name == 'a' os_name": expected "and", "or" or ")" in marker, found "o" at column 22`},
		{"foo; os_name == 'a')", `pep508: "foo; os_name == 'a')": unmatched ")" in marker at column 20`},
		{"foo; ()", `pep508: "foo; ()": expected a marker variable or quoted string, found ")" at column 7`},
		{"foo; os_name == 'a';", `pep508: "foo; os_name == 'a';": unexpected ";" in marker; expected "and", "or" or end at column 20`},

		// Characters and size.
		{"foo\x00", `pep508: "foo\x00": control or invisible formatting character U+0000 not allowed at column 4`},
		{"foo\n>=1", `pep508: "foo\n>=1": control or invisible formatting character U+000A not allowed at column 4`},
		{"foo\r", `pep508: "foo\r": control or invisible formatting character U+000D not allowed at column 4`},
		{"foo\x1b[31m", `pep508: "foo\x1b[31m": control or invisible formatting character U+001B not allowed at column 4`},
		{"foo\u202e>=1", `pep508: "foo\u202e>=1": control or invisible formatting character U+202E not allowed at column 4`},
		{"foo\u200b", `pep508: "foo\u200b": control or invisible formatting character U+200B not allowed at column 4`},
		{"foo\u2028", `pep508: "foo\u2028": control or invisible formatting character U+2028 not allowed at column 4`},
		{"é\xff", `pep508: "é\xff": invalid UTF-8 at column 2`},
		{"fóo", `pep508: "fóo": unexpected "ó" after package name; expected a version specifier, "@ URL", ";" or end at column 2`},
		{"foo; os_name == 'é' and \x7f", `pep508: "foo; os_name == 'é' and \x7f": control or invisible formatting character U+007F not allowed at column 25`},
	}
	for _, tt := range tests {
		_, err := ParseRequirement(tt.in)
		if err == nil {
			t.Errorf("ParseRequirement(%q) succeeded, want error", tt.in)
			continue
		}
		if err.Error() != tt.want {
			t.Errorf("ParseRequirement(%q) error:\n got  %s\n want %s", tt.in, err, tt.want)
		}
		var se *SyntaxError
		if !errors.As(err, &se) || se.Grammar != "pep508" || se.Input != tt.in {
			t.Errorf("ParseRequirement(%q) error is %#v, want a pep508 *SyntaxError for the input", tt.in, err)
		}
	}
}

func TestParseRequirementLimits(t *testing.T) {
	// Exactly at the limit is fine.
	ok := "a" + strings.Repeat("b", MaxRequirementLength-1)
	if _, err := ParseRequirement(ok); err != nil {
		t.Errorf("ParseRequirement(%d bytes): %v", len(ok), err)
	}

	long := ok + "c"
	_, err := ParseRequirement(long)
	if err == nil {
		t.Fatalf("ParseRequirement(%d bytes) succeeded, want error", len(long))
	}
	msg := err.Error()
	if !strings.Contains(msg, "too long (1001 bytes, limit 1000)") {
		t.Errorf("error %q does not report the length", msg)
	}
	// The error repeats only the start of the input.
	if len(msg) > 300 {
		t.Errorf("error for a long input is %d bytes long", len(msg))
	}

	// Deeply nested markers are refused before they cost recursion.
	deep := "foo; " + strings.Repeat("(", 40) + "os_name == 'a'" + strings.Repeat(")", 40)
	if _, err := ParseRequirement(deep); err == nil || !strings.Contains(err.Error(), "nested too deeply") {
		t.Errorf("ParseRequirement(deep) = %v, want a nesting error", err)
	}
	shallow := "foo; " + strings.Repeat("(", 32) + "os_name == 'a'" + strings.Repeat(")", 32)
	if _, err := ParseRequirement(shallow); err != nil {
		t.Errorf("ParseRequirement(32 levels): %v", err)
	}

	// A long error message is cut at a character boundary.
	multi := strings.Repeat("é", 100) + "\x00"
	_, err = ParseRequirement(multi)
	if err == nil || !utf8.ValidString(err.Error()) || !strings.Contains(err.Error(), `..."`) && !strings.Contains(err.Error(), `"...`) {
		t.Errorf("ParseRequirement(long multibyte) error %q", err)
	}
}

func TestNormalizeName(t *testing.T) {
	for in, want := range map[string]string{
		"friendly-bard":     "friendly-bard",
		"Friendly-Bard":     "friendly-bard",
		"FRIENDLY-BARD":     "friendly-bard",
		"friendly.bard":     "friendly-bard",
		"friendly_bard":     "friendly-bard",
		"friendly--bard":    "friendly-bard",
		"FrIeNdLy-._.-bArD": "friendly-bard",
		"":                  "",
		"a-":                "a-",
		"._a":               "-a",
	} {
		if got := NormalizeName(in); got != want {
			t.Errorf("NormalizeName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestMergeRequirements(t *testing.T) {
	got, errs := MergeRequirements(
		[]string{"numpy>=1.26", " Requests[Security,socks] ", "rich", "bad>=", "pkg @ https://x.org/p.whl"},
		nil,
		[]string{
			"NumPy >= 1.26",            // same as the first
			"numpy<2",                  // same project, different constraint: kept
			"requests[socks,security]", // same extras in another order and case
			"requests [ socks , security ] ; os_name == 'nt'", // different marker: kept
			`requests[security,socks]; os_name=="nt"`,         // same marker, other quoting
			"rich ; python_version >= '3.8'",
			"==1.0",
			"Pkg @ https://x.org/p.whl",
			"pkg @ https://x.org/other.whl",
		},
	)
	want := []string{
		"numpy>=1.26",
		"Requests[Security,socks]",
		"rich",
		"pkg @ https://x.org/p.whl",
		"numpy<2",
		"requests [ socks , security ] ; os_name == 'nt'",
		"rich ; python_version >= '3.8'",
		"pkg @ https://x.org/other.whl",
	}
	if !slices.Equal(got, want) {
		t.Errorf("MergeRequirements =\n %q\nwant\n %q", got, want)
	}
	if len(errs) != 2 {
		t.Fatalf("MergeRequirements errors = %v, want 2", errs)
	}
	for i, frag := range []string{`"bad>="`, `"==1.0"`} {
		if !strings.Contains(errs[i].Error(), frag) {
			t.Errorf("error %d = %q, want it to name %s", i, errs[i], frag)
		}
	}

	if got, errs := MergeRequirements(); got != nil || errs != nil {
		t.Errorf("MergeRequirements() = %v, %v; want nil, nil", got, errs)
	}
}

func FuzzParseRequirement(f *testing.F) {
	for _, s := range []string{
		"A.B-C_D",
		"name@http://foo.com",
		"name [fred,bar] @ http://foo.com ; python_version=='2.7'",
		"name[quux, strange];python_version<'2.7' and platform_version=='2'",
		`requests [security,tests] >= 2.8.1, == 2.8.* ; python_version < "2.7"`,
		"name; (os_name=='a' or os_name=='b') and os_name=='c'",
		"numpy (>=1.26, <2)",
		"foo===weird",
		`foo; "linux" not in sys_platform`,
		"pkg @ https://x.org/a.whl;x=1 ; os_name == 'nt'",
		"numpy>=", "==1.0", "foo bar", "foo;", "foo @ notaurl", "foo~=1",
		"foo; ((os_name == 'a')", "foo\x00", "é\xff",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRequirement(s)
		if err != nil {
			var se *SyntaxError
			if !errors.As(err, &se) || se.Grammar != "pep508" || se.Input != s {
				t.Fatalf("ParseRequirement(%q) error %#v is not a pep508 *SyntaxError", s, err)
			}
			if se.Column < 0 || se.Column > utf8.RuneCountInString(s)+1 {
				t.Fatalf("ParseRequirement(%q) error column %d out of range", s, se.Column)
			}
			return
		}
		if len(s) > MaxRequirementLength {
			t.Fatalf("ParseRequirement accepted %d bytes", len(s))
		}
		if !validName(r.Name) || r.Normalized != NormalizeName(r.Name) {
			t.Fatalf("ParseRequirement(%q): bad name %q / %q", s, r.Name, r.Normalized)
		}
		if r.URL != "" && r.Specifier != "" {
			t.Fatalf("ParseRequirement(%q): both URL and specifier", s)
		}
		if _, err := ParseSpecifierSet(r.Specifier); err != nil {
			t.Fatalf("ParseRequirement(%q).Specifier %q does not parse: %v", s, r.Specifier, err)
		}
		again, err := ParseRequirement(r.String())
		if err != nil {
			t.Fatalf("ParseRequirement(%q).String() = %q does not parse: %v", s, r.String(), err)
		}
		if again.key() != r.key() || again.String() != r.String() {
			t.Fatalf("ParseRequirement(%q): canonical form %q changes meaning to %q", s, r.String(), again.String())
		}
		if merged, errs := MergeRequirements([]string{s, r.String()}); len(merged) != 1 || errs != nil {
			t.Fatalf("MergeRequirements(%q, %q) = %q, %v", s, r.String(), merged, errs)
		}
	})
}
