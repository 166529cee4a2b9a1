package engine

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestCaptureKeepsEverythingUnderTheCap(t *testing.T) {
	var live bytes.Buffer
	c := newCapture(100, &live)
	c.Write([]byte("hello "))
	c.Write([]byte("world"))
	s, trunc := c.String()
	if s != "hello world" || trunc || live.String() != "hello world" {
		t.Fatalf("%q %v %q", s, trunc, live.String())
	}
}

func TestCaptureHeadAndTail(t *testing.T) {
	c := newCapture(20, nil)
	var all strings.Builder
	for i := range 1000 {
		w := strings.Repeat(string(rune('a'+i%26)), i%7+1)
		all.WriteString(w)
		c.Write([]byte(w))
	}
	s, trunc := c.String()
	full := all.String()
	if !trunc {
		t.Fatal("not marked truncated")
	}
	if !strings.HasPrefix(s, full[:10]) || !strings.HasSuffix(s, full[len(full)-10:]) {
		t.Errorf("head/tail wrong: %q", s)
	}
	if !strings.Contains(s, "bytes of output truncated") {
		t.Errorf("no truncation marker: %q", s)
	}
	if c.Total() != int64(len(full)) {
		t.Errorf("total %d, want %d", c.Total(), len(full))
	}
	// One write far larger than the whole budget.
	c2 := newCapture(20, nil)
	c2.Write([]byte(strings.Repeat("x", 10) + strings.Repeat("y", 1000) + "0123456789"))
	s2, _ := c2.String()
	if !strings.HasPrefix(s2, "xxxxxxxxxx") || !strings.HasSuffix(s2, "0123456789") {
		t.Errorf("large write: %q", s2)
	}
}

func TestCaptureOverflowFiresOnce(t *testing.T) {
	c := newCapture(10, nil)
	n := 0
	c.limit, c.onOverflow = 50, func() { n++ }
	for range 100 {
		c.Write([]byte("0123456789"))
	}
	if n != 1 {
		t.Errorf("onOverflow called %d times", n)
	}
}

func TestCaptureInvalidUTF8AtCut(t *testing.T) {
	c := newCapture(9, nil)
	c.Write([]byte(strings.Repeat("é", 50))) // 2-byte runes; 9/2 cuts one in half
	s, trunc := c.String()
	// The cut moves to a character boundary: no half character, no U+FFFD.
	if !trunc || !utf8.ValidString(s) || strings.Contains(s, "\uFFFD") || !strings.HasPrefix(s, "éé\n") {
		t.Errorf("truncated %v, valid %v: %q", trunc, utf8.ValidString(s), s)
	}
	// Output that is not UTF-8 at all still comes out valid.
	c = newCapture(9, nil)
	c.Write(bytes.Repeat([]byte{0xff, 0xfe}, 50))
	if s, _ := c.String(); !utf8.ValidString(s) || !strings.Contains(s, "\uFFFD") {
		t.Errorf("binary output: %q", s)
	}
}

func TestImportsOf(t *testing.T) {
	code := "import os, sys as system\nfrom pandas.core import frame\n  import numpy as np\nx = 'import nothere'\n# import commented\nfrom . import rel\nimport os.path\n"
	got := strings.Join(ImportsOf(code), ",")
	// "# import commented" does not start with import; a string never does.
	if got != "os,sys,pandas,numpy" {
		t.Errorf("ImportsOf = %s", got)
	}
}

// TestCaptureKeepsWholeCharacters: a cut through CJK text (3 bytes a
// character) leaves whole characters on both sides, never U+FFFD.
func TestCaptureKeepsWholeCharacters(t *testing.T) {
	for max := 10; max < 40; max++ {
		c := newCapture(max, nil)
		c.Write([]byte(strings.Repeat("世界", 50)))
		got, truncated := c.String()
		if !truncated {
			t.Fatalf("max %d: not truncated", max)
		}
		if strings.ContainsRune(got, utf8.RuneError) || !utf8.ValidString(got) {
			t.Errorf("max %d: %q", max, got)
		}
		head, _, _ := strings.Cut(got, "\n[...")
		if strings.Trim(head, "世界") != "" {
			t.Errorf("max %d: head %q is not whole characters", max, head)
		}
	}
	// Emoji (4 bytes) too, written a byte at a time.
	c := newCapture(21, nil)
	for _, b := range []byte(strings.Repeat("😀", 20)) {
		c.Write([]byte{b})
	}
	if got, _ := c.String(); strings.ContainsRune(got, utf8.RuneError) {
		t.Errorf("emoji: %q", got)
	}
}

// TestSafeNumbers: numbers a float64 decoder would round or reject come
// back as their digits.
func TestSafeNumbers(t *testing.T) {
	got := decodeReturn([]byte(`{"a":[1,2.5,9007199254740993,1e400,-18446744073709551616],"b":42}`))
	b, _ := json.Marshal(got)
	want := `{"a":[1,2.5,"9007199254740993","1e400","-18446744073709551616"],"b":42}`
	if string(b) != want {
		t.Errorf("got %s, want %s", b, want)
	}
}

// TestEnds: the ends kept are whole characters, about n/2 bytes each.
func TestEnds(t *testing.T) {
	s := strings.Repeat("世", 100) // 300 bytes
	for n := 0; n < 40; n++ {
		h, tl := Ends(s, n)
		if !utf8.ValidString(h) || !utf8.ValidString(tl) || len(h) > n/2 || len(tl) > n/2 || n/2-len(h) > 2 || n/2-len(tl) > 2 {
			t.Errorf("n %d: %q %q", n, h, tl)
		}
	}
	if h, tl := Ends("abc", 100); h != "abc" || tl != "abc" {
		t.Errorf("short: %q %q", h, tl)
	}
}

// TestHead: text cut to a size keeps whole characters, and never more than
// the size.
func TestHead(t *testing.T) {
	for _, tc := range []struct {
		s    string
		n    int
		want string
	}{
		{"hello", 10, "hello"}, {"hello", 3, "hel"}, {"héllo", 2, "h"}, {"héllo", 3, "hé"},
		{"日本", 4, "日"}, {"🐍x", 3, ""}, {"abc", 0, ""}, {"abc", -1, ""}, {"ab\xc3", 3, "ab"},
	} {
		if got := Head(tc.s, tc.n); got != tc.want {
			t.Errorf("Head(%q, %d) = %q, want %q", tc.s, tc.n, got, tc.want)
		}
	}
}

func TestJoinMessage(t *testing.T) {
	for _, c := range [][3]string{{"", "b", "b"}, {"a", "b", "a; b"}, {"a", "", "a; "}} {
		if got := JoinMessage(c[0], c[1]); got != c[2] {
			t.Errorf("JoinMessage(%q, %q) = %q", c[0], c[1], got)
		}
	}
}
