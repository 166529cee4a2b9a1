package cli

import (
	"errors"
	"io"
	"strings"
	"testing"
)

// TestIndexFlags: the dependency flags a server cannot use are refused
// with what to give instead, as a usage error (exit 2).
func TestIndexFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--find-links", "wheels"}, "give an absolute directory or a URL"},
		{[]string{"--no-index"}, "--no-index needs at least one --find-links"},
		{[]string{"--no-index", "--find-links", "/srv/wheels"}, ""},
		{[]string{"--find-links", "https://example.com/wheels/"}, ""},
	} {
		fs, o := newFlagSet("t", "t", io.Discard)
		if err := parseFlags(fs, tc.args); err != nil {
			t.Fatal(err)
		}
		err := o.checkIndex()
		var ue usageError
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case tc.want != "" && (!errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%v: %v, want a usage error saying %q", tc.args, err, tc.want)
		}
	}
}
