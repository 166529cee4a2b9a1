package tools

import (
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/engine"
)

// DefaultMaxReply bounds a run's reply as it goes on the wire. Clients
// give up on far less than servers can send: the TypeScript SDK drops a
// connection at 10 MiB (which ends a stdio server), so the default stays
// well under that after JSON escaping.
const DefaultMaxReply = 4 << 20

// replyOverhead is room for what the reply holds besides what we measure:
// the JSON-RPC envelope, content wrappers, _meta.
const replyOverhead = 16 << 10

// boundReply builds a run's content (the text summary and its figures)
// so that the whole reply, structured content included, fits s.maxReply
// as the SDK encodes it. In order, until it fits: figures that do not fit
// become resource links (the largest first kept inline as long as they
// fit); then stdout, stderr and return_text are cut further, head and
// tail kept, and the message says so. Sizes are measured as encoded JSON,
// where one '<' of output takes six bytes.
func (s *server) boundReply(res *RunPythonOutput, sessionID, owner string) []mcp.Content {
	budget := s.maxReply - replyOverhead
	size := func() int64 { return encodedLen(res) + encodedLen(summary(res)) }
	cut := false
	for n := 0; size() > budget/2 && n < 40; n++ {
		// Text takes at most half the budget, so that figures are not
		// crowded out by output the agent can ask for again.
		if !shrinkLargest(res) {
			break
		}
		cut = true
	}
	if cut {
		res.Message = joinMessage(res.Message, fmt.Sprintf("the reply was cut to fit the server's %d-byte reply limit (--max-reply): output was shortened, its head and tail kept; write large output to a file", s.maxReply))
	}
	room := budget - size()
	figs := s.figureContent(res, sessionID, s.runNumber(sessionID), owner, room)
	for _, f := range figs {
		room -= encodedLen(f)
	}
	out := append([]mcp.Content{&mcp.TextContent{Text: summary(res)}}, figs...)
	return append(out, displayContent(res, room)...)
}

// shrinkLargest halves the largest text field of res (stdout, stderr,
// return_text), keeping its head and tail; false when nothing is left to
// cut.
func shrinkLargest(res *RunPythonOutput) bool {
	fields := []struct {
		s    *string
		flag *bool
	}{{&res.Stdout, &res.StdoutTruncated}, {&res.Stderr, &res.StderrTruncated}, {&res.ReturnText, nil}}
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
	return true
}

// keepEnds keeps about n bytes of s, half from each end, cut at character
// boundaries, with a mark where the middle was.
func keepEnds(s string, n int) string {
	head, tail := engine.Ends(s, n)
	return head + fmt.Sprintf("\n[... %d bytes cut to fit the reply limit ...]\n", len(s)-len(head)-len(tail)) + tail
}

func joinMessage(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}
