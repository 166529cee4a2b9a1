package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/testutil/refservers"
	"github.com/pysandbox/pysandbox/internal/tools"
)

// stdioStep is one line testdata/tsstdio.mjs printed.
type stdioStep struct {
	IsError    bool           `json:"isError"`
	Structured map[string]any `json:"structured"`
	Text       string         `json:"text"`
	Error      string         `json:"error"`
	Code       int            `json:"code"`
	Progress   int            `json:"progress"`
}

// tsSteps runs the TypeScript SDK's client through steps (see
// testdata/tsstdio.mjs) against target: a URL, or the binary's serve on
// stdio when it is "".
func tsSteps(t *testing.T, target string, steps ...map[string]any) []stdioStep {
	t.Helper()
	data, _ := json.Marshal(steps)
	script, _ := filepath.Abs("testdata/tsstdio.mjs")
	// Ten times what the steps take (a 45 s run among them): only a hang
	// ends here.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	args := []string{script, refservers.TypeScriptSDK(t), string(data)}
	if target == "" {
		args = append(args, binary(t), "serve", "--log-level", "error")
	} else {
		args = append(args, target)
	}
	cmd := exec.CommandContext(ctx, refservers.Node(t), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the TypeScript client: %v\n%s\n%s", err, out, stderr.String())
	}
	var got []stdioStep
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var s stdioStep
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			t.Fatalf("the TypeScript client printed %q: %v", sc.Text(), err)
		}
		got = append(got, s)
	}
	if len(got) != len(steps) {
		t.Fatalf("the TypeScript client: %d lines for %d steps: %s\n%s", len(got), len(steps), out, stderr.String())
	}
	return got
}

func upload(n int, base64 bool) map[string]any {
	arg := "content"
	if base64 {
		arg = "content_base64"
	}
	return map[string]any{"tool": "upload_file", "args": map[string]any{"session_id": "$session", "path": fmt.Sprintf("f%d.bin", n)},
		"fill": map[string]any{"arg": arg, "bytes": n, "base64": base64}}
}

// sessionAlive is a call on the session made first: it must work after each
// message that could have ended the server.
var sessionAlive = map[string]any{"tool": "run_python", "args": map[string]any{"session_id": "$session", "code": "import os\nsorted(os.listdir('.'))"}}

// TestStdioOneMessage (issue 26, item 4): through the TypeScript SDK's
// client on stdio, one message too large for the server is refused with a
// JSON-RPC error naming the limit, and the server (with the session made
// before it) goes on: a 17 MiB upload_file in base64, the same in text,
// and a 40 MiB line. The largest upload the server takes goes through on
// stdio, as over HTTP, and the 17 MiB ones are refused over HTTP too.
func TestStdioOneMessage(t *testing.T) {
	limit := fmt.Sprint(tools.MaxRequestBytes(16 << 20)) // serve's default --max-upload
	got := tsSteps(t, "",
		tool("create_session", nil),
		upload(16<<20, true),
		sessionAlive,
		upload(17<<20, true),
		sessionAlive,
		upload(17<<20, false),
		sessionAlive,
		map[string]any{"tool": "run_python", "args": map[string]any{}, "fill": map[string]any{"arg": "code", "bytes": 40 << 20}},
		sessionAlive,
	)
	if got[0].IsError || got[0].Error != "" {
		t.Fatalf("create_session: %+v", got[0])
	}
	if got[1].IsError || got[1].Error != "" {
		t.Fatalf("the largest upload (16 MiB): %+v", got[1])
	}
	for i, want := range map[int]string{3: "at most " + limit + " bytes", 5: "", 7: "at most " + limit + " bytes"} {
		switch {
		case want != "" && (got[i].Code != -32600 || !strings.Contains(got[i].Error, "message too large") || !strings.Contains(got[i].Error, want)):
			t.Errorf("step %d: want a JSON-RPC error naming the limit (%s), got %+v", i, limit, got[i])
		case want == "" && (!got[i].IsError || !strings.Contains(got[i].Text, "upload limit")):
			t.Errorf("step %d: want upload_file's refusal, got %+v", i, got[i])
		}
	}
	for _, i := range []int{2, 4, 6, 8} {
		if got[i].IsError || got[i].Error != "" || !strings.Contains(got[i].Text, "f16777216.bin") {
			t.Errorf("step %d: the session after a refused message: %+v", i, got[i])
		}
	}

	// Over HTTP: the same three uploads, the same outcomes (the SDK
	// refuses the body with HTTP 413, before it is parsed).
	addr := freePort(t)
	startServe(t, addr, "http://"+addr, nil)
	got = tsSteps(t, "http://"+addr+"/mcp", tool("create_session", nil), upload(16<<20, true), upload(17<<20, true), upload(17<<20, false))
	if got[1].IsError || got[1].Error != "" {
		t.Errorf("HTTP, the largest upload: %+v", got[1])
	}
	if got[2].Code != 413 || !strings.Contains(got[2].Error, "exceeds "+limit+" bytes") {
		t.Errorf("HTTP, 17 MiB in base64: %+v", got[2])
	}
	if !got[3].IsError || !strings.Contains(got[3].Text, "upload limit") {
		t.Errorf("HTTP, 17 MiB of text: %+v", got[3])
	}
}

// TestStdioSilentRun (issue 26, item 5): a run silent for 45 s completes
// for a client that gives up on a request after 20 s of silence but
// resets that on progress: the server's heartbeat keeps it waiting.
func TestStdioSilentRun(t *testing.T) {
	got := tsSteps(t, "", map[string]any{"tool": "run_python", "args": map[string]any{"code": "import time\ntime.sleep(45)\nprint('done')", "timeout_seconds": 90},
		"timeout": 20000, "reset": true})
	if got[0].Error != "" || got[0].IsError || !strings.Contains(got[0].Text, "done") {
		t.Fatalf("the silent run: %+v", got[0])
	}
	t.Logf("%d progress notifications in 45 s", got[0].Progress)
}
