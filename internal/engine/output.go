package engine

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"unicode/utf8"
)

// capture keeps the head and the tail of a stream within a fixed budget,
// however much is written, so an output flood never grows the server's
// memory. It may also pass everything through to a live writer (the
// terminal, for `pysandbox run`).
type capture struct {
	mu    sync.Mutex
	head  []byte // the first headMax bytes
	tail  []byte // ring buffer of the last tailMax bytes
	start int    // index of the oldest byte in tail once it is full
	total int64
	max   int
	live  io.Writer
	// onOverflow is called once, outside the lock, when total first exceeds
	// limit (0: never).
	limit      int64
	onOverflow func()
	overflowed bool
}

func newCapture(max int, live io.Writer) *capture {
	if max < 2 {
		max = 2
	}
	return &capture{max: max, live: live}
}

func (c *capture) Write(p []byte) (int, error) {
	c.mu.Lock()
	n, orig := len(p), p
	c.total += int64(n)
	headMax := c.max / 2
	if room := headMax - len(c.head); room > 0 {
		k := min(room, len(p))
		c.head = append(c.head, p[:k]...)
		p = p[k:]
	}
	if len(p) > 0 {
		c.appendTail(p, c.max-headMax)
	}
	fire := c.limit > 0 && c.total > c.limit && !c.overflowed
	if fire {
		c.overflowed = true
	}
	live := c.live
	c.mu.Unlock()
	if live != nil {
		// A slow or failing terminal must not fail the run.
		live.Write(orig)
	}
	if fire && c.onOverflow != nil {
		c.onOverflow()
	}
	return n, nil
}

func (c *capture) appendTail(p []byte, tailMax int) {
	if len(p) >= tailMax {
		c.tail = append(c.tail[:0], p[len(p)-tailMax:]...)
		c.start = 0
		return
	}
	if len(c.tail) < tailMax {
		k := min(tailMax-len(c.tail), len(p))
		c.tail = append(c.tail, p[:k]...)
		p = p[k:]
	}
	for len(p) > 0 {
		k := copy(c.tail[c.start:], p)
		p = p[k:]
		c.start = (c.start + k) % tailMax
	}
}

// String returns what was kept and whether anything was dropped. A dropped
// middle is marked in the text, so a reader cannot mistake it for the
// whole output.
func (c *capture) String() (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	tail := append(append([]byte(nil), c.tail[c.start:]...), c.tail[:c.start]...)
	kept := int64(len(c.head) + len(tail))
	if kept == c.total {
		return strings.ToValidUTF8(string(c.head)+string(tail), "\uFFFD"), false
	}
	// The cuts fall at byte offsets: move them to character boundaries, so
	// that text (CJK, emoji) keeps whole characters on both sides. The bytes
	// of a character cut in two count as truncated.
	head, tail := wholeHead(c.head), wholeTail(tail)
	dropped := c.total - int64(len(head)+len(tail))
	return strings.ToValidUTF8(string(head), "\uFFFD") +
		fmt.Sprintf("\n[... %d bytes of output truncated ...]\n", dropped) +
		strings.ToValidUTF8(string(tail), "\uFFFD"), true
}

// Head is the longest start of s of at most n bytes that does not end in
// the middle of a character: the one place text is cut to a size (what is
// cut, and how it is marked, is the caller's).
func Head(s string, n int) string {
	return string(wholeHead([]byte(s[:min(max(n, 0), len(s))])))
}

// Ends returns about n bytes of s, n/2 from each end, both cut at
// character boundaries (as a capture cuts a stream), for a caller that
// shortens text further and marks the middle itself.
func Ends(s string, n int) (head, tail string) {
	half := min(n/2, len(s))
	return string(wholeHead([]byte(s[:half]))), string(wholeTail([]byte(s[len(s)-half:])))
}

// wholeHead drops an incomplete UTF-8 sequence from the end of b.
func wholeHead(b []byte) []byte {
	for i := 1; i <= utf8.UTFMax && i <= len(b); i++ {
		if utf8.RuneStart(b[len(b)-i]) {
			if !utf8.FullRune(b[len(b)-i:]) {
				return b[:len(b)-i]
			}
			return b
		}
	}
	return b
}

// wholeTail drops the continuation bytes of a character cut in two from
// the start of b (all of b when it is only such bytes).
func wholeTail(b []byte) []byte {
	for i := 0; i < utf8.UTFMax && i < len(b); i++ {
		if utf8.RuneStart(b[i]) {
			return b[i:]
		}
	}
	if len(b) < utf8.UTFMax {
		return b[len(b):]
	}
	return b // not UTF-8 at all: ToValidUTF8 marks it
}

// Total is the number of bytes written so far.
func (c *capture) Total() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total
}

// JoinMessage is two parts of a result's message as one ("; " between
// them), either of which may be empty.
func JoinMessage(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}
