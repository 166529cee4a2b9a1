package engine

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
)

// TestRunRequestValidate: a request that cannot run is refused with a
// RequestError saying what to change, before any sandbox starts.
func TestRunRequestValidate(t *testing.T) {
	deep := strings.Repeat("[", maxInputDepth+1) + strings.Repeat("]", maxInputDepth+1)
	for _, tc := range []struct {
		name string
		req  RunRequest
		want string
	}{
		{"ok", RunRequest{Code: "1", Inputs: map[string]json.RawMessage{"x": json.RawMessage(`{"a":"[[["}`)}}, ""},
		{"empty code", RunRequest{Code: " \n"}, "code is required"},
		{"large code", RunRequest{Code: strings.Repeat("#", MaxCodeBytes+1)}, "code is too large"},
		{"NUL", RunRequest{Code: "1\x00"}, "NUL byte"},
		{"dependencies", RunRequest{Code: "1", Dependencies: make([]string, 257)}, "too many dependencies"},
		{"input name", RunRequest{Code: "1", Inputs: map[string]json.RawMessage{"not valid": json.RawMessage("1")}}, "not a valid Python variable name"},
		{"keyword", RunRequest{Code: "1", Inputs: map[string]json.RawMessage{"class": json.RawMessage("1")}}, "not a valid Python variable name"},
		{"deep input", RunRequest{Code: "1", Inputs: map[string]json.RawMessage{"x": json.RawMessage(deep)}}, "nested more than"},
		{"args", RunRequest{Code: "1", Args: []string{"-v", "a b", ""}}, ""},
		{"NUL arg", RunRequest{Code: "1", Args: []string{"a\x00b"}}, "argument 1 contains a NUL byte"},
		{"many args", RunRequest{Code: "1", Args: make([]string, maxArgs+1)}, "too many arguments"},
		{"long arg", RunRequest{Code: "1", Args: []string{strings.Repeat("a", maxArg+1)}}, "argument 1 is 131073 bytes"},
		{"long args", RunRequest{Code: "1", Args: slices.Repeat([]string{strings.Repeat("a", maxArg)}, maxArgBytes/maxArg+1)}, "too many arguments"},
		{"not UTF-8", RunRequest{Code: "1", Args: []string{"ok", "caf\xe9"}}, "argument 2 is not valid UTF-8"},
		{"large inputs", RunRequest{Code: "1", Inputs: map[string]json.RawMessage{"x": json.RawMessage(`"` + strings.Repeat("a", MaxInputBytes) + `"`)}}, "inputs are too large"},
	} {
		err := tc.req.Validate()
		var re *RequestError
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (!errors.As(err, &re) || !strings.Contains(err.Error(), tc.want) || strings.HasSuffix(err.Error(), ".")):
			t.Errorf("%s: %v; want a RequestError mentioning %q, without a full stop (the tools add it)", tc.name, err, tc.want)
		}
	}
}
