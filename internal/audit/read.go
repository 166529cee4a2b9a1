package audit

import (
	"bufio"
	"fmt"
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
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 0, 64<<10), maxLineBytes+1)
		line := 0
		for sc.Scan() {
			line++
			r, hash, err := parseLine(sc.Bytes())
			if err != nil {
				if bad != nil {
					bad(p, line, err)
				}
				continue
			}
			if !fn(r, hash) {
				f.Close()
				return nil
			}
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return fmt.Errorf("audit: %w", err)
		}
	}
	return nil
}
