package tools

import (
	"context"
	"encoding/json"
	"testing"
)

// TestInputsExact: numbers in inputs reach the code as they were sent, in
// a one-shot run and in a session: integers beyond float64's 2^53 exact
// 2.0 a float, -0.0 with
// its sign, nested ones too; the input schema still takes any JSON value
// per key.
func TestInputsExact(t *testing.T) {
	cs := connect(t, nil)
	inputs := json.RawMessage(`{"a": 9007199254740993, "b": 12345678901234567890, "c": 2.0, "d": -0.0, "e": [1.5e300, -7, {"f": 18446744073709551617}]}`)
	code := "import math\n" +
		"assert a == 9007199254740993 and type(a) is int, a\n" +
		"assert b == 12345678901234567890 and type(b) is int, b\n" +
		"assert type(c) is float and c == 2.0, c\n" +
		"assert type(d) is float and math.copysign(1, d) == -1, d\n" +
		"assert e == [1.5e300, -7, {'f': 18446744073709551617}], e\n" +
		"repr((a, b, c, d))"
	for _, session := range []bool{false, true} {
		args := map[string]any{"code": code, "inputs": inputs}
		if session {
			_, out := call(t, cs, "create_session", nil)
			args["session_id"] = out["session_id"]
		}
		res, out := call(t, cs, "run_python", args)
		if res.IsError {
			t.Fatalf("session %v: %s", session, text(res))
		}
		if got, want := out["return_value"], "(9007199254740993, 12345678901234567890, 2.0, -0.0)"; got != want {
			t.Errorf("session %v: %v, want %s", session, got, want)
		}
	}
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tl := range tools.Tools {
		if tl.Name != "run_python" {
			continue
		}
		b, _ := json.Marshal(tl.InputSchema)
		var s struct {
			Properties map[string]map[string]any `json:"properties"`
		}
		json.Unmarshal(b, &s)
		in := s.Properties["inputs"]
		delete(in, "description")
		if b, _ := json.Marshal(in); string(b) != `{"additionalProperties":true,"type":"object"}` {
			t.Errorf("inputs' schema: %s", b)
		}
	}
}
