package pep

import (
	"errors"
	"strings"
	"testing"
)

func TestParseSpecifierSet(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"", ""},
		{"   ", ""},
		{">=3.9", ">=3.9"},
		{">=3.9,<3.13", ">=3.9,<3.13"},
		{" >= 3.9 , < 3.13 ", ">=3.9,<3.13"},
		{"\t~=3.10", "~=3.10"},
		{"==3.11.*", "==3.11.*"},
		{"!=3.11.*", "!=3.11.*"},
		{"==3.11.2+local", "==3.11.2+local"},
		{"===3.11.2-custom", "===3.11.2-custom"},
		{">3.8,!=3.9.1,<=3.12", ">3.8,!=3.9.1,<=3.12"},
		{"~=3.10.0rc1", "~=3.10.0rc1"},
		{">=1!2.0", ">=1!2.0"},
		{">=v3.9", ">=v3.9"},
	}
	for _, tt := range tests {
		ss, err := ParseSpecifierSet(tt.in)
		if err != nil {
			t.Errorf("ParseSpecifierSet(%q): %v", tt.in, err)
			continue
		}
		if got := ss.String(); got != tt.want {
			t.Errorf("ParseSpecifierSet(%q).String() = %q, want %q", tt.in, got, tt.want)
		}
		// The canonical form must parse back to itself.
		again, err := ParseSpecifierSet(ss.String())
		if err != nil || again.String() != ss.String() {
			t.Errorf("reparsing %q: %q, %v", ss.String(), again.String(), err)
		}
	}
}

func TestParseSpecifierSetErrors(t *testing.T) {
	tests := []struct {
		in, want string // want is the whole error message
	}{
		{"3.9", `pep440: "3.9": expected a version operator (one of ~= == != <= >= < > ===), found "3" at column 1`},
		{">=", `pep440: ">=": expected a version after ">=" at column 3`},
		{">=3.9,", `pep440: ">=3.9,": expected a version specifier after "," at column 7`},
		{">=3.9 <3.13", `pep440: ">=3.9 <3.13": missing "," between version specifiers at column 7`},
		{"=3.9", `pep440: "=3.9": "=" is not a version operator, use "==" at column 1`},
		{"=>3.9", `pep440: "=>3.9": "=>" is not a version operator, use ">=" at column 1`},
		{"=<3.9", `pep440: "=<3.9": "=<" is not a version operator, use "<=" at column 1`},
		{"<>3.9", `pep440: "<>3.9": invalid version operator "<>" at column 1`},
		{"====3.9", `pep440: "====3.9": invalid version operator "====" at column 1`},
		{">=3.x", `pep440: ">=3.x": invalid version "3.x" at column 3`},
		{">=3.*", `pep440: ">=3.*": ".*" suffix can only be used with "==" or "!=", not ">=" at column 3`},
		{"~=3.*", `pep440: "~=3.*": ".*" suffix can only be used with "==" or "!=", not "~=" at column 3`},
		{"==3.*.1", `pep440: "==3.*.1": invalid version "3.*.1" at column 3`},
		{"==3.0rc1.*", `pep440: "==3.0rc1.*": invalid version "3.0rc1.*": ".*" can only follow a release segment like "1.2.*" at column 3`},
		{"~=3", `pep440: "~=3": "~=" needs at least two release segments, as in "~=3.0" at column 3`},
		{">=3.9+local", `pep440: ">=3.9+local": local version label in "3.9+local" can only be used with "==" or "!=", not ">=" at column 3`},
		{"(>=3.9)", `pep440: "(>=3.9)": expected a version operator (one of ~= == != <= >= < > ===), found "(" at column 1`},
		{">=3.9;", `pep440: ">=3.9;": unexpected ";" after version specifier at column 6`},
		{">=3.9\n", `pep440: ">=3.9\n": control or invisible formatting character U+000A not allowed at column 6`},
		{"===", `pep440: "===": expected a version after "===" at column 4`},
	}
	for _, tt := range tests {
		_, err := ParseSpecifierSet(tt.in)
		if err == nil {
			t.Errorf("ParseSpecifierSet(%q) succeeded, want error", tt.in)
			continue
		}
		if err.Error() != tt.want {
			t.Errorf("ParseSpecifierSet(%q) error:\n got  %s\n want %s", tt.in, err, tt.want)
		}
		var se *SyntaxError
		if !errors.As(err, &se) {
			t.Errorf("ParseSpecifierSet(%q) error is %T, want *SyntaxError", tt.in, err)
		}
	}

	long := ">=" + strings.Repeat("1.", MaxRequirementLength)
	if _, err := ParseSpecifierSet(long); err == nil || !strings.Contains(err.Error(), "too long") {
		t.Errorf("ParseSpecifierSet(long) = %v, want a too long error", err)
	}
}

func TestSpecifierSetContains(t *testing.T) {
	tests := []struct {
		spec string
		in   []string
		out  []string
	}{
		{"", []string{"3.11.2", "2.7", "3.13.0rc1"}, []string{"not a version"}},
		{">=3.9,<3.13", []string{"3.9", "3.9.0", "3.11.2", "3.12.99", "3.12.0rc1"}, []string{"3.8.18", "3.13", "3.13.0", "3.13.0rc1", "3.13.0a1", "3.13.0.dev0", "4.0"}},
		{"~=3.10", []string{"3.10", "3.10.4", "3.11.2", "3.99"}, []string{"3.9.18", "4.0", "3.10rc1", "2.10"}},
		{"~=3.10.2", []string{"3.10.2", "3.10.12"}, []string{"3.10.1", "3.11.0"}},
		{"~=3.10.0rc1", []string{"3.10.0rc1", "3.10.0", "3.10.9"}, []string{"3.10.0b1", "3.11"}},
		{"==3.11.*", []string{"3.11", "3.11.0", "3.11.2", "3.11.0rc1", "3.11.4+local", "3.11.2.post1"}, []string{"3.1", "3.10.11", "3.12.0", "3.110"}},
		{"==3.11.0.*", []string{"3.11", "3.11.0.5"}, []string{"3.11.1"}},
		{"!=3.11.*", []string{"3.10.12", "3.12.1"}, []string{"3.11.2"}},
		{"==3.11", []string{"3.11", "3.11.0", "3.11.0+local"}, []string{"3.11.2", "3.11.0rc1", "3.11.0.post1"}},
		{"==3.11+local", []string{"3.11+local", "3.11.0+LOCAL"}, []string{"3.11", "3.11+other"}},
		{"!=3.11.2", []string{"3.11.1", "3.11.3"}, []string{"3.11.2", "3.11.2+local"}},
		{"<3.13", []string{"3.12.9", "3.12.0.dev0"}, []string{"3.13", "3.13.0rc1", "3.13.0.dev0"}},
		{"<3.13rc1", []string{"3.13.0b4", "3.12"}, []string{"3.13rc1", "3.13"}},
		{"<=3.12", []string{"3.12", "3.12.0+local", "3.12rc1"}, []string{"3.12.1", "3.12.0.post1"}},
		{">3.11", []string{"3.12", "3.11.1", "3.12.0a1"}, []string{"3.11", "3.11.0.post1", "3.11+local", "3.10"}},
		{">3.11.post1", []string{"3.11.post2", "3.12"}, []string{"3.11.post1"}},
		{">=3.11", []string{"3.11", "3.11.0+local", "3.12"}, []string{"3.11rc1", "3.10.99"}},
		// "3.11.02" matches through its normal form, as in packaging.
		{"===3.11.2", []string{"3.11.2", " 3.11.2 ", "3.11.02"}, []string{"3.11.2.0", "3.11"}},
		{"===foobar", []string{"foobar", "FOOBAR"}, []string{"foo"}},
		{">=1!1.0", []string{"1!1.0", "2!0.1"}, []string{"9.9"}},
		{"==1!3.*", []string{"1!3.11"}, []string{"3.11", "2!3.11"}},
	}
	for _, tt := range tests {
		ss, err := ParseSpecifierSet(tt.spec)
		if err != nil {
			t.Errorf("ParseSpecifierSet(%q): %v", tt.spec, err)
			continue
		}
		for _, v := range tt.in {
			if !ss.Contains(v) {
				t.Errorf("%q.Contains(%q) = false, want true", tt.spec, v)
			}
		}
		for _, v := range tt.out {
			if ss.Contains(v) {
				t.Errorf("%q.Contains(%q) = true, want false", tt.spec, v)
			}
		}
	}
}

func FuzzParseSpecifierSet(f *testing.F) {
	for _, s := range []string{
		"", ">=3.9", ">=3.9,<3.13", "~=3.10", "==3.11.*", "===foo", "!=1.0+local",
		">= 1.0a1.post2.dev3 , < 2", ">=3.9,", "~=3", ">=3.*", "=>1",
	} {
		f.Add(s, "3.11.2")
	}
	f.Fuzz(func(t *testing.T, spec, version string) {
		ss, err := ParseSpecifierSet(spec)
		if err != nil {
			var se *SyntaxError
			if !errors.As(err, &se) || se.Grammar != "pep440" {
				t.Fatalf("ParseSpecifierSet(%q) error %v is not a pep440 *SyntaxError", spec, err)
			}
			return
		}
		again, err := ParseSpecifierSet(ss.String())
		if err != nil || again.String() != ss.String() {
			t.Fatalf("ParseSpecifierSet(%q).String() = %q does not round-trip: %q, %v", spec, ss.String(), again.String(), err)
		}
		if ss.Contains(version) != again.Contains(version) {
			t.Fatalf("%q and its canonical form %q disagree on %q", spec, ss.String(), version)
		}
	})
}
