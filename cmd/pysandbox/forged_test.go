package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// forge is code that writes line to the worker's control channel (fd 3)
// as if it were the worker's reply, then exits.
func forge(line string) string {
	return "import os\nline = " + line + "\nv = memoryview(line.encode() if isinstance(line, str) else line)\n" +
		"while v:\n    v = v[os.write(3, v):]\nos._exit(0)\n"
}

// vmHWM is a process's peak resident memory, in bytes.
func vmHWM(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

// TestServeForgedReplies: user code writes replies of its own on the
// worker's control channel: oversized fields, an oversized line, a reply
// for another request, an unknown op, deep nesting. Over a real MCP
// client, each call gets a small, clear result, the server's peak memory
// stays far below what the forged sizes would cost decoded and escaped
// (the issue measured 1.4 GiB for one 16 MiB line), and the next call
// works. A forged "success" cannot hide a run that then ran into its
// timeout.
func TestServeForgedReplies(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.Command(binary(t), "serve", "--log-level", "error", "--pool-size", "1")
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	head := `'{"op":"result","id":"1","status":"success","exit_code":0,`
	for _, tc := range []struct {
		name, code, status, message string
	}{
		{"return_value of 20 MiB", forge(head + `"return_value":[' + '0,' * (10 << 20) + '0]}\n'`), "error", "control channel"},
		{"return_text of 1 MiB of '<'", forge(head + `"return_value":null,"return_text":"' + '<' * (1 << 20) + '"}\n'`), "error", "control channel"},
		{"error message of 2 MiB", forge(`'{"op":"result","id":"1","status":"error","exit_code":1,"error":{"type":"E","message":"' + '<' * (2 << 20) + '","traceback":""}}\n'`), "error", "control channel"},
		{"a 40 MiB line", forge(`b'x' * (40 << 20) + b'\n'`), "error", "control channel"},
		{"a reply for another request", forge(`'{"op":"result","id":"99","status":"success","exit_code":0,"return_value":1}\n'`), "error", "control channel"},
		{"an unknown op", forge(`'{"op":"explode","id":"1"}\n'`), "error", "control channel"},
		{"not JSON", forge(`b'\xff\xfe{{{\n'`), "error", "control channel"},
		{"deep nesting", forge(head + `"return_value":' + '[' * 20000 + ']' * 20000 + '}\n'`), "error", "control channel"},
		{"success, then past the deadline", "import os, time\nos.write(3, b'{\"op\":\"result\",\"id\":\"1\",\"status\":\"success\",\"exit_code\":0,\"return_value\":1}\\n')\ntime.sleep(60)", "timeout", "timeout"},
	} {
		args := map[string]any{"code": tc.code}
		if strings.Contains(tc.name, "deadline") {
			args["timeout_seconds"] = 2
		}
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: args})
		if err != nil {
			t.Fatalf("%s: protocol error: %v", tc.name, err)
		}
		raw, _ := json.Marshal(res)
		out, _ := res.StructuredContent.(map[string]any)
		msg, _ := out["message"].(string)
		if out["status"] != tc.status || !strings.Contains(msg, tc.message) {
			t.Errorf("%s: status %v, message %q; want %s mentioning %q", tc.name, out["status"], msg, tc.status, tc.message)
		}
		if len(raw) > 256<<10 {
			t.Errorf("%s: a reply of %d bytes", tc.name, len(raw))
		}
		// The server keeps serving.
		next, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "40 + 2"}})
		if err != nil || next.IsError || fmt.Sprint(next.StructuredContent.(map[string]any)["return_value"]) != "42" {
			t.Fatalf("%s: the next call: %v %v", tc.name, err, next)
		}
	}
	if hwm := vmHWM(t, cmd.Process.Pid); hwm > 400<<20 {
		t.Errorf("server peak memory %d MiB after the forged replies", hwm>>20)
	} else {
		t.Logf("server peak memory after the forged replies: %d MiB", hwm>>20)
	}
}
