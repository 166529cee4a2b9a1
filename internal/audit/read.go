package audit

import (
	"bufio"
	"fmt"
	"os"
)

// Read calls fn with each record of the chain in paths, in order, with its
// hash; fn returns false to stop. Lines that do not parse are skipped:
// Verify is what judges the chain.
func Read(paths []string, fn func(r *Record, hash string) bool) error {
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return fmt.Errorf("audit: %w", err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 0, 64<<10), maxLineBytes+1)
		for sc.Scan() {
			r, hash, err := parseLine(sc.Bytes())
			if err != nil {
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
