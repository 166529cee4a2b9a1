package tools

import (
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/govern"
)

// DefaultMaxReply bounds a run's reply as it goes on the wire, images
// included. Clients give up on far less than servers can send: the
// TypeScript SDK drops a connection at 10 MiB (which ends a stdio server),
// so the default stays well under that after JSON escaping.
const DefaultMaxReply = 4 << 20

// DefaultMaxStreamReply is how much of each of a run's stdout, stderr and
// return value its reply shows by default (--max-reply-output), head and
// tail; the whole is kept where the reply says. A reply's text, content
// and structured content together, stays within five times it: 100 000
// bytes, about 25 000 tokens, whatever the run printed.
const DefaultMaxStreamReply = 20_000

// replyOverhead is room for what the reply holds besides what we measure:
// the JSON-RPC envelope, content wrappers, _meta.
const replyOverhead = 16 << 10

// What reaches the model. A run's reply carries its output twice: in the
// text content and in the structured content. Which one a client gives
// its model differs, so both must carry it, and both must be bounded:
//
//   - Claude Code (since 2.0.21) and Codex give the model
//     JSON.stringify(structuredContent) and drop the text content when
//     structured content is there (anthropics/claude-code#9962, #55677,
//     #79944; openai/codex#2594, #38287), as does GitHub Copilot CLI
//     (github/copilot-cli#3258).
//   - Claude Desktop gives the model the content blocks and not the
//     structured content (blockscout/mcp-server#324, prebid/salesagent#2140);
//     so do the OpenAI Agents SDK by default (openai/openai-agents-python#1236)
//     and many hosts built on the Python SDK.
//   - Some give it both (github/copilot-cli#4515, Copilot for JetBrains:
//     microsoft/copilot-intellij-feedback#2058); VS Code reads structured
//     content when there is some (microsoft/vscode#290063, as reported).
//     Cursor's documentation says nothing; it checks that structured
//     content matches the output schema (WordPress/mcp-adapter#37).
//   - The TypeScript and Python SDK clients hand an application both.
//
// So neither channel can point at the other: the text is a human summary
// with the output's head and tail, the structured content the same data
// as fields, each stream cut to the same --max-reply-output; the whole is
// a resource or a session file both name. The spec's SHOULD (the
// structured content serialized into a text block, 2025-06-18, "Structured
// Content") would cost more than the summary (every newline and quote of
// the output escaped twice) and tell a text-only model less; the summary
// is what the text block holds instead. A client that shows both pays for
// both: at most the text budget, 5 x --max-reply-output.

// textBudget is what a reply's text may take on the wire: the text
// content, the structured content and the displays' text.
func (s *server) textBudget() int64 {
	return min(5*s.maxStream-2048, (s.maxReply-replyOverhead)/2)
}

// boundReply builds a run's content (the text summary, its figures and
// displays) so that the reply fits: its text (both channels) within the
// text budget, and all of it, images included, within s.maxReply, as the
// SDK encodes it. Each stream longer than s.maxStream is cut to its head
// and tail, the whole kept (keepOutput) and named; if the text is still
// over budget (output of '<', six bytes each as JSON), the largest field
// is cut further. Figures that do not fit become resource links.
func (s *server) boundReply(res *RunPythonOutput, sessionID, owner string) []mcp.Content {
	run := s.runNumber(sessionID)
	ret := returnDisplay(res)
	origOut, origErr := res.Stdout, res.Stderr
	s.cutStreams(res, sessionID, run, owner)
	budget := s.textBudget()
	target := budget
	if len(res.Displays) > 0 {
		target = budget / 2 // the rest for the displays' text
	}
	// The budget is what the client decodes (what a model reads): '<' is
	// one byte of it, though the SDK's encoder sends six.
	size := func() int64 { return plainLen(res) + plainLen(replyText(res)) }
	cut := false
	for n := 0; size() > target && n < 40; n++ {
		if !shrinkLargest(res) {
			break
		}
		cut = true
	}
	if cut {
		// A stream this cut, shorter than --max-reply-output, still has
		// its whole kept, as any cut stream has.
		for _, f := range []struct {
			name, orig string
			text, uri  *string
		}{{"stdout", origOut, &res.Stdout, &res.StdoutURI}, {"stderr", origErr, &res.Stderr, &res.StderrURI}} {
			if *f.uri == "" && *f.text != f.orig {
				if uri, _ := s.keepOutput(f.orig, f.name, sessionID, run, owner); uri != "" {
					*f.uri = uri
					res.Message = engine.JoinMessage(res.Message, fmt.Sprintf("%s: all %d bytes: %s", f.name, len(f.orig), uri))
				}
			}
		}
		res.Message = engine.JoinMessage(res.Message, fmt.Sprintf("the reply was cut further to fit its %d-byte text budget (5 x --max-reply-output, within --max-reply): output was shortened, its head and tail kept", budget))
	}
	textRoom := budget - size()
	// Images get what the text leaves of --max-reply on the wire.
	imageRoom := s.maxReply - replyOverhead - max(budget, encodedLen(res)+encodedLen(replyText(res)))
	figs := s.figureContent(res, sessionID, run, owner, imageRoom)
	for _, f := range figs {
		imageRoom -= encodedLen(f)
	}
	disp := s.displayContent(res, ret, owner, textRoom, imageRoom)
	out := append([]mcp.Content{&mcp.TextContent{Text: replyText(res)}}, figs...)
	return append(out, disp...)
}

// cutStreams cuts stdout, stderr, the return value and its text to
// s.maxStream each, head and tail kept, and keeps the whole of each cut
// one where the reply says.
func (s *server) cutStreams(res *RunPythonOutput, sessionID string, run int, owner string) {
	n := int(s.maxStream)
	var notes []string
	for _, f := range []struct {
		name    string
		text    *string
		flag    *bool
		uri     *string
		printed int64
	}{{"stdout", &res.Stdout, &res.StdoutTruncated, &res.StdoutURI, res.printed[0]}, {"stderr", &res.Stderr, &res.StderrTruncated, &res.StderrURI, res.printed[1]}} {
		if len(*f.text) <= n {
			continue
		}
		whole, captureCut := *f.text, *f.flag
		uri, why := s.keepOutput(whole, f.name, sessionID, run, owner)
		*f.uri, *f.flag = uri, true
		where := uri
		if captureCut && uri != "" {
			where = uri + " (as captured: see the message)"
		}
		*f.text = keepEndsNoting(whole, n, where)
		note := fmt.Sprintf("%s: this reply shows the first and last %d of its %d bytes (--max-reply-output)", f.name, n/2, len(whole))
		if captureCut {
			printed := "what the run printed"
			if f.printed > 0 {
				printed = fmt.Sprintf("the %d bytes the run printed", f.printed)
			}
			note += "; the server captured only the head and tail of " + printed + " (--max-output): the middle is gone"
		}
		if uri != "" {
			note += fmt.Sprintf("; all %d captured bytes: %s (resources/read", len(whole), uri)
			if sessionID != "" {
				note += fmt.Sprintf(", or /work/%s/run-%d-%s.txt in the session", OutputDir, run, f.name)
			}
			note += ")"
		} else {
			note += "; the whole could not be kept: " + why
		}
		notes = append(notes, note)
	}
	if len(res.ReturnText) > n {
		res.ReturnText = keepEndsNoting(res.ReturnText, n, "")
	}
	if res.ReturnValue != nil {
		text, isString := res.ReturnValue.(string)
		if !isString {
			b, _ := govern.PlainJSON(res.ReturnValue, "")
			text = string(b)
		}
		// A value over the worker's return limit comes as the start of its
		// repr, ending in the worker's mark: nothing here has the rest, and
		// the note must not say otherwise.
		capped := isString && strings.HasSuffix(text, returnCutMark)
		switch {
		case len(text) > n:
			uri, why := s.keepOutput(text, "return", sessionID, run, owner)
			res.ReturnValue, res.ReturnTruncated, res.ReturnURI = keepEndsNoting(text, n, uri), true, uri
			note := fmt.Sprintf("return_value: this reply shows the first and last %d of its %d bytes, as text", n/2, len(text))
			if capped {
				note = fmt.Sprintf("return_value: the value is larger than a run returns, so the sandbox sent the start of its repr (%d bytes); this reply shows the first and last %d of those. For the whole, write it to a file (a session's /work) or return a summary", len(text), n/2)
			}
			switch {
			case uri != "" && capped:
				note += "; what was returned: " + uri
			case uri != "":
				note += "; all of it: " + uri
			default:
				note += "; the whole could not be kept: " + why
			}
			notes = append(notes, note)
		case capped:
			notes = append(notes, fmt.Sprintf("return_value: the value is larger than a run returns, so the sandbox sent the start of its repr (%d bytes). For the whole, write it to a file (a session's /work) or return a summary", len(text)))
		}
	}
	if len(notes) > 0 {
		res.Message = engine.JoinMessage(res.Message, strings.Join(notes, "; "))
	}
}

// returnCutMark ends a return value the worker cut to its return limit
// (worker.py's TRUNCATED).
const returnCutMark = "\u2026 (truncated)"

// keepEndsNoting keeps about n bytes of s, head and tail, with a mark
// where the middle was that says where the whole is.
func keepEndsNoting(s string, n int, uri string) string {
	head, tail := engine.Ends(s, n)
	where := ""
	if uri != "" {
		where = "; the rest is at " + uri
	}
	return head + fmt.Sprintf("\n[... %d bytes not shown%s ...]\n", len(s)-len(head)-len(tail), where) + tail
}

// returnDisplay is the index of the display that is the return value's
// rich form (the last one, with the return value's repr as its text), or
// -1: its text is not repeated.
func returnDisplay(res *RunPythonOutput) int {
	v, ok := res.ReturnValue.(string)
	if i := len(res.Displays) - 1; ok && i >= 0 && res.Displays[i].Text == v {
		return i
	}
	return -1
}

// replyText is the text form of a result, for clients that give their
// model the content blocks. It shows <, > and & as they are.
func replyText(r *RunPythonOutput) string {
	var b strings.Builder
	fmt.Fprintf(&b, "status: %s (exit code %d, %d ms", r.Status, r.ExitCode, r.DurationMS)
	if r.Sandbox == "none" {
		b.WriteString(", UNSANDBOXED")
	}
	b.WriteString(")\n")
	if r.Message != "" {
		b.WriteString(r.Message + "\n")
	}
	section := func(name, text string, truncated bool) {
		if text == "" {
			return
		}
		fmt.Fprintf(&b, "--- %s", name)
		if truncated {
			b.WriteString(" (truncated)")
		}
		b.WriteString(" ---\n" + text)
		if !strings.HasSuffix(text, "\n") {
			b.WriteString("\n")
		}
	}
	section("stdout", r.Stdout, r.StdoutTruncated)
	section("stderr", r.Stderr, r.StderrTruncated)
	switch v := r.ReturnValue.(type) {
	case nil:
	case string:
		// A repr, or a string: shown as it is, once (a DataFrame as its
		// text table).
		if r.ReturnText != "" {
			v = r.ReturnText
		}
		section("return_value", v, r.ReturnTruncated)
	default:
		j, _ := govern.PlainJSON(v, "")
		section("return_value", string(j), false)
	}
	return b.String()
}

// shrinkLargest halves the largest text field of res (stdout, stderr,
// return_text, a return value cut to text), keeping its head and tail;
// false when nothing is left to cut.
func shrinkLargest(res *RunPythonOutput) bool {
	rv, _ := res.ReturnValue.(string)
	fields := []struct {
		s    *string
		flag *bool
	}{{&res.Stdout, &res.StdoutTruncated}, {&res.Stderr, &res.StderrTruncated}, {&res.ReturnText, nil}, {&rv, &res.ReturnTruncated}}
	if res.Error != nil {
		// The worker bounds an error's text in characters, and code in
		// the run can change its bounds: escaped on the wire, it can be
		// far larger than the budget, so it is cut like the rest.
		e := *res.Error
		res.Error = &e
		fields = append(fields, struct {
			s    *string
			flag *bool
		}{&res.Error.Message, nil}, struct {
			s    *string
			flag *bool
		}{&res.Error.Traceback, nil})
	}
	best := -1
	for i, f := range fields {
		if len(*f.s) > 256 && (best < 0 || len(*f.s) > len(*fields[best].s)) {
			best = i
		}
	}
	if best < 0 {
		return false
	}
	f := fields[best]
	*f.s = keepEnds(*f.s, len(*f.s)/2)
	if f.flag != nil {
		*f.flag = true
	}
	if best == 3 {
		res.ReturnValue = rv
	}
	return true
}

// keepEnds keeps about n bytes of s, half from each end, cut at character
// boundaries, with a mark where the middle was.
func keepEnds(s string, n int) string {
	head, tail := engine.Ends(s, n)
	return head + fmt.Sprintf("\n[... %d bytes cut to fit the reply limit ...]\n", len(s)-len(head)-len(tail)) + tail
}

// plainLen is v's size as JSON once decoded by a client: without the
// HTML escapes the SDK's encoder adds (<, > and & as six bytes each).
func plainLen(v any) int64 {
	b, err := govern.PlainJSON(v, "")
	if err != nil {
		return encodedLen(v)
	}
	return int64(len(b))
}
