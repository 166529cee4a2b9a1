package audit

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
)

// Read calls fn with each record of the chain in paths, in order, with its
// hash; fn returns false to stop. Lines that do not parse, or whose hash
// does not match, are skipped: Verify is what judges the chain.
func Read(paths []string, fn func(r *Record, hash string) bool) error {
	return ReadChecked(paths, fn, nil)
}

// ReadChecked is Read that also tells bad (when not nil) of each line it
// skips: its file, its line number (from 1), and why (a record edited
// after it was written, or a malformed line). A reader that shows records
// to people uses it so that a tampered record is flagged, not silently
// missing.
func ReadChecked(paths []string, fn func(r *Record, hash string) bool, bad func(path string, line int, err error)) error {
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return fmt.Errorf("audit: %w", err)
		}
		stop, err := scanLines(f, p, fn, bad)
		f.Close()
		if err != nil {
			return fmt.Errorf("audit: %w", err)
		}
		if stop {
			return nil
		}
	}
	return nil
}

// errTooLong is a line over maxLineBytes: no writer makes one.
var errTooLong = fmt.Errorf("line longer than %d bytes", maxLineBytes)

// scanLines reads one file's lines; one too long to be a record is
// skipped (and reported) without being held, and reading goes on.
func scanLines(f *os.File, path string, fn func(r *Record, hash string) bool, bad func(path string, line int, err error)) (stop bool, err error) {
	br := bufio.NewReaderSize(f, 64<<10)
	var buf []byte
	line := 0
	tooLong := false
	for {
		chunk, err := br.ReadSlice('\n')
		switch {
		case err == bufio.ErrBufferFull:
			if !tooLong {
				buf = append(buf, chunk...)
				if len(buf) > maxLineBytes {
					tooLong, buf = true, nil
				}
			}
			continue
		case err != nil && err != io.EOF:
			return false, err
		}
		if len(chunk) == 0 && err == io.EOF && len(buf) == 0 && !tooLong {
			return false, nil
		}
		line++
		if tooLong {
			if bad != nil {
				bad(path, line, errTooLong)
			}
		} else {
			buf = append(buf, chunk...)
			text := bytes.TrimSuffix(buf, []byte("\n"))
			if len(text) > maxLineBytes {
				if bad != nil {
					bad(path, line, errTooLong)
				}
			} else if len(text) > 0 {
				r, hash, perr := parseLine(text)
				if perr != nil {
					if bad != nil {
						bad(path, line, perr)
					}
				} else if !fn(r, hash) {
					return true, nil
				}
			}
		}
		buf, tooLong = buf[:0], false
		if err == io.EOF {
			return false, nil
		}
	}
}
