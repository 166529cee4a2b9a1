package engine

import (
	"bytes"
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
	if !trunc || !utf8.ValidString(s) || !strings.Contains(s, "\uFFFD") {
		t.Errorf("truncated %v, valid %v: %q", trunc, utf8.ValidString(s), s)
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
