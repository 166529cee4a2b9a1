package main

import (
	"strings"
	"testing"
)

// TestReplyTypeScriptClient: through the official TypeScript SDK client,
// against serve's defaults, a 5 MB print comes back as a reply of at most
// 100 000 bytes (head and tail, with stdout_uri; serve stops the flood), and the whole output as
// the server captured it (--max-output, 1 MiB) reads back from that URI.
func TestReplyTypeScriptClient(t *testing.T) {
	addr := freePort(t)
	url := "http://" + addr
	startServe(t, addr, url, nil, "--pool-size", "0")
	ts := tsClient(t, url, "", tool("run_python", map[string]any{"code": "print('head'); print('x' * 5_000_000); print('tail')"}),
		map[string]any{"readField": []any{0, "stdout_uri"}})
	run, read := ts[0], ts[1]
	t.Logf("5 MB print through the TypeScript SDK: a reply of %d bytes", run.Size)
	stdout, _ := run.Structured["stdout"].(string)
	// serve stops a run that floods its output (status output_limit).
	if run.Size > 100_000 || !strings.HasPrefix(stdout, "head\n") || !strings.Contains(run.Text, "head\n") || !strings.Contains(run.Text, "--max-output") {
		t.Fatalf("a reply of %d bytes: %.500s", run.Size, run.Text)
	}
	if len(read.Contents) != 1 {
		t.Fatalf("reading %v: %s", run.Structured["stdout_uri"], read.Error)
	}
	c, _ := read.Contents[0].(map[string]any)
	whole, _ := c["text"].(string)
	if len(whole) < 1<<20 || !strings.HasPrefix(whole, "head\n") || !strings.Contains(whole, "bytes of output truncated") {
		t.Errorf("the whole output: %d bytes, %.60q", len(whole), whole)
	}
}

// TestReplyCasesTypeScriptClient: through the TypeScript SDK client, a
// 200 000-line print stays within the budget and its whole output reads
// back; IPython.display works; text shows <, > and & as they are.
func TestReplyCasesTypeScriptClient(t *testing.T) {
	addr := freePort(t)
	url := "http://" + addr
	startServe(t, addr, url, nil, "--pool-size", "0", "--max-output", "4MiB")
	ts := tsClient(t, url, "",
		tool("run_python", map[string]any{"code": "for i in range(200_000):\n    print(i)"}),
		map[string]any{"readField": []any{0, "stdout_uri"}},
		tool("run_python", map[string]any{"code": "from IPython.display import display, HTML, Markdown\ndisplay(HTML('<b>bold</b>'), Markdown('*it*'))\n'a<b>&c'"}))
	lines, read, disp := ts[0], ts[1], ts[2]
	t.Logf("200 000-line print: a reply of %d bytes; IPython display and a<b>&c: %d bytes", lines.Size, disp.Size)
	if lines.Size > 100_000 || lines.IsError {
		t.Errorf("200 000 lines: a reply of %d bytes (error %v)", lines.Size, lines.IsError)
	}
	if len(read.Contents) != 1 {
		t.Fatalf("reading %v: %s", lines.Structured["stdout_uri"], read.Error)
	}
	c, _ := read.Contents[0].(map[string]any)
	if whole, _ := c["text"].(string); strings.Count(whole, "\n") != 200_000 || !strings.HasSuffix(whole, "199999\n") {
		t.Errorf("the whole output: %d lines, ending %q", strings.Count(whole, "\n"), whole[max(0, len(whole)-20):])
	}
	if disp.IsError || !strings.Contains(disp.Text, "a<b>&c") || strings.Contains(disp.Text, `\u003c`) {
		t.Errorf("IPython display and text: %v %.600s", disp.IsError, disp.Text)
	}
	if ds, _ := disp.Structured["displays"].([]any); len(ds) != 2 {
		t.Errorf("displays: %v", disp.Structured["displays"])
	}
}
