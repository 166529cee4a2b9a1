package pep

import (
	"strings"
	"testing"
)

func TestParseVersion(t *testing.T) {
	// Inputs and their PEP 440 normal forms, mostly from the
	// normalisation section of the PEP.
	tests := []struct {
		in, want string
	}{
		{"3.11.2", "3.11.2"},
		{"1", "1"},
		{"  1.0 ", "1.0"},
		{"v1.0", "1.0"},
		{"V1.0", "1.0"},
		{"01.002", "1.2"},
		{"1!2.0", "1!2.0"},
		{"0!2.0", "2.0"},
		{"1.0a1", "1.0a1"},
		{"1.0alpha1", "1.0a1"},
		{"1.0-alpha-1", "1.0a1"},
		{"1.0.a.1", "1.0a1"},
		{"1.0a", "1.0a0"},
		{"1.0beta2", "1.0b2"},
		{"1.0c1", "1.0rc1"},
		{"1.0pre1", "1.0rc1"},
		{"1.0preview1", "1.0rc1"},
		{"1.0RC1", "1.0rc1"},
		{"1.0.post1", "1.0.post1"},
		{"1.0post", "1.0.post0"},
		{"1.0-1", "1.0.post1"},
		{"1.0_rev_2", "1.0.post2"},
		{"1.0r3", "1.0.post3"},
		{"1.0.dev", "1.0.dev0"},
		{"1.0-dev-4", "1.0.dev4"},
		{"1.0a1.post2.dev3", "1.0a1.post2.dev3"},
		{"1.0+ubuntu-1", "1.0+ubuntu.1"},
		{"1.0+Local_Ver.2", "1.0+local.ver.2"},
		{"1.99999999999999999999999999", "1.99999999999999999999999999"},
	}
	for _, tt := range tests {
		v, err := ParseVersion(tt.in)
		if err != nil {
			t.Errorf("ParseVersion(%q): %v", tt.in, err)
			continue
		}
		if got := v.String(); got != tt.want {
			t.Errorf("ParseVersion(%q).String() = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestParseVersionErrors(t *testing.T) {
	for _, in := range []string{
		"", " ", "x", "1.", ".1", "1..0", "1.0.*", "1.0+", "1.0+a..b", "1.0-", "1.0 a1",
		"3.12.0+", "1.0\x00", "1,0", "1.0_", "1.0a1a2", "1!", "!1", "1.0+ä",
		strings.Repeat("1.", 600) + "1",
	} {
		if v, err := ParseVersion(in); err == nil {
			t.Errorf("ParseVersion(%q) = %v, want error", in, v)
		} else if !strings.HasPrefix(err.Error(), "pep440: ") {
			t.Errorf("ParseVersion(%q) error %q lacks the pep440 prefix", in, err)
		}
	}
}

func TestVersionCompare(t *testing.T) {
	// Strictly increasing, from the PEP 440 examples and packaging's tests.
	ordered := []string{
		"0.9", "1.0.dev456", "1.0a1", "1.0a2.dev456", "1.0a12.dev456", "1.0a12",
		"1.0b1.dev456", "1.0b2", "1.0b2.post345.dev456", "1.0b2.post345",
		"1.0c1.dev456", "1.0c1", "1.0rc2", "1.0c3", "1.0", "1.0+abc.5",
		"1.0+abc.7", "1.0+5", "1.0+5.abc", "1.0.post456.dev34", "1.0.post456",
		"1.0.1", "1.1.dev1", "3.9", "3.10", "3.11.2", "3.13.0rc1", "3.13",
		"99999999999999999999", "1!0.1",
	}
	parsed := make([]Version, len(ordered))
	for i, s := range ordered {
		v, err := ParseVersion(s)
		if err != nil {
			t.Fatalf("ParseVersion(%q): %v", s, err)
		}
		parsed[i] = v
	}
	for i := range parsed {
		for j := range parsed {
			want := 0
			switch {
			case i < j:
				want = -1
			case i > j:
				want = 1
			}
			if got := parsed[i].Compare(parsed[j]); got != want {
				t.Errorf("Compare(%q, %q) = %d, want %d", ordered[i], ordered[j], got, want)
			}
		}
	}

	// Spellings of one version compare equal.
	for _, pair := range [][2]string{
		{"1.0", "1.0.0"}, {"1.0", "1"}, {"1.0", "v1.0.0.0"}, {"1.0c1", "1.0rc1"},
		{"1.0-1", "1.0.post1"}, {"0!1.0", "1.0"}, {"1.0+ABC", "1.0+abc"},
		{"1.0+1-a", "1.0+1.a"}, {"1.0+01", "1.0+1"},
	} {
		a, _ := ParseVersion(pair[0])
		b, _ := ParseVersion(pair[1])
		if c := a.Compare(b); c != 0 {
			t.Errorf("Compare(%q, %q) = %d, want 0", pair[0], pair[1], c)
		}
	}
}

func TestVersionIsPrerelease(t *testing.T) {
	for in, want := range map[string]bool{
		"3.11.2": false, "3.13.0rc1": true, "1.0.dev0": true, "1.0a1.post1": true,
		"1.0.post1": false, "1.0.post1.dev1": true, "1.0+local": false,
	} {
		v, err := ParseVersion(in)
		if err != nil {
			t.Fatal(err)
		}
		if got := v.IsPrerelease(); got != want {
			t.Errorf("ParseVersion(%q).IsPrerelease() = %v, want %v", in, got, want)
		}
	}
}
