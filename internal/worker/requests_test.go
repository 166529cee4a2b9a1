package worker

import (
	"context"
	"strings"
	"testing"
	"time"
)

// User code shares the worker's process and can write to the control socket,
// so everything read from it is hostile input: the Conn must fail cleanly.
func TestHostileReplies(t *testing.T) {
	for _, c := range []struct {
		name, payload, wantErr string
	}{
		{"not json", `b"\xff not json\n"`, "bad reply"},
		{"wrong id", `b'{"op":"result","id":"999","status":"success"}\n'`, "does not match"},
		{"wrong op", `b'{"op":"probed","id":"1"}\n'`, "want \"result\""},
		{"bad status", `b'{"op":"result","id":"1","status":"pwned"}\n'`, "bad result status"},
		{"bad exit code", `b'{"op":"result","id":"1","status":"error","exit_code":-5}\n'`, "bad exit code"},
		{"bad field type", `b'{"op":"result","id":"1","status":1}\n'`, "bad result reply"},
		{"figure not base64", `b'{"op":"result","id":"1","status":"success","figures":[{"png":"!!"}]}\n'`, "bad result reply"},
		{"negative figure size", `b'{"op":"result","id":"1","status":"success","figures":[{"png":"","width":-1,"height":1,"dpi":1}]}\n'`, "bad figure 0"},
		{"too many figures", `b'{"op":"result","id":"1","status":"success","figures":[' + b','.join([b'{"png":""}'] * 17) + b']}\n'`, "bad figure count"},
		{"negative figures omitted", `b'{"op":"result","id":"1","status":"success","figures_omitted":-1}\n'`, "bad figure count"},
		{"deep nesting", `b'{"op":"result","id":"1","status":"success","return_value":' + b'[' * 100000 + b'\n'`, "bad reply"},
		{"too long", `b'{"op":"result","id":"1","x":"' + b'x' * (2 << 20)`, "message too long"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			w := startPython(t, systemPython, false)
			w.conn.maxLine = 1 << 20
			code := "import os\ndata = " + c.payload + "\nwhile data:\n    data = data[os.write(3, data):]\nimport time\ntime.sleep(30)"
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := w.conn.Run(ctx, Request{Code: code})
			if err == nil || !strings.Contains(err.Error(), c.wantErr) || !strings.HasPrefix(err.Error(), "worker: ") {
				t.Fatalf("error = %v, want %q", err, c.wantErr)
			}
			if _, err2 := w.conn.Probe(ctx, nil, nil); err2 == nil {
				t.Error("Conn usable after a hostile reply")
			}
		})
	}
}

func TestValidMarker(t *testing.T) {
	for m, want := range map[string]bool{
		"0123456789abcdef":       true,
		strings.Repeat("A", 128): true,
		"A-B_C-D_0123456789-z":   true,
		"0123456789abcde":        false,
		strings.Repeat("A", 129): false,
		"0123456789abcdef\n":     false,
		"0123456789 abcdef":      false,
		"0123456789abcdef.":      false,
		"0123456789abcdéf":       false,
		"":                       false,
	} {
		if got := ValidMarker(m); got != want {
			t.Errorf("ValidMarker(%q) = %v, want %v", m, got, want)
		}
	}
}
