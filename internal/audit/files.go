package audit

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Files returns the files of the chain that ends in path, oldest first:
// the rotated siblings path.1, path.2, ... in numeric order, then path
// itself. Only files that exist are listed. Names that are not exactly
// path.<N> (path.bak, path.01, path.1.gz) are not part of the chain.
func Files(path string) ([]string, error) {
	nums, err := siblings(path)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range nums {
		out = append(out, path+"."+strconv.FormatInt(n, 10))
	}
	if st, err := os.Stat(path); err == nil && !st.IsDir() {
		out = append(out, path)
	} else if err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("audit: %w", err)
	}
	return out, nil
}

// siblings returns the N of every rotated file path.N, ascending.
func siblings(path string) ([]int64, error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	var nums []int64
	for _, e := range ents {
		suffix, ok := strings.CutPrefix(e.Name(), base+".")
		if !ok || e.IsDir() {
			continue
		}
		n, err := strconv.ParseInt(suffix, 10, 64)
		// Only the canonical spelling: path.01 would sort as path.1.
		if err != nil || n < 1 || strconv.FormatInt(n, 10) != suffix {
			continue
		}
		nums = append(nums, n)
	}
	slices.Sort(nums)
	return nums, nil
}

// readLastLines returns up to n complete lines (newline stripped, oldest
// first) that end at or before offset end of f, reading backwards so that
// the size of the file does not matter. partial counts the bytes after
// the last newline: a line whose write was cut short, or is under way.
func readLastLines(f *os.File, end int64, n int) (lines [][]byte, partial int64, err error) {
	pos := end
	var seg []byte // f[pos:...]: the part of the file not yet split into lines
	tailDone := false
	for {
		for len(lines) < n || !tailDone {
			i := bytes.LastIndexByte(seg, '\n')
			if i < 0 {
				break
			}
			if tailDone {
				lines = append(lines, bytes.Clone(seg[i+1:]))
				if len(seg)-i-1 > maxLineBytes {
					return nil, 0, fmt.Errorf("line at offset %d is longer than %d bytes", pos+int64(i)+1, maxLineBytes)
				}
			} else {
				partial, tailDone = int64(len(seg)-1-i), true
			}
			seg = seg[:i]
		}
		if len(lines) >= n && tailDone {
			break
		}
		if len(seg) > maxLineBytes {
			return nil, 0, fmt.Errorf("line at offset %d is longer than %d bytes", pos, maxLineBytes)
		}
		if pos == 0 {
			if tailDone {
				lines = append(lines, bytes.Clone(seg)) // the first line of the file
			} else {
				partial = int64(len(seg))
			}
			break
		}
		// Grow the reads with the line so a long one costs linear time.
		size := min(pos, max(64<<10, int64(len(seg))))
		chunk := make([]byte, size, size+int64(len(seg)))
		if _, err := f.ReadAt(chunk, pos-size); err != nil {
			return nil, 0, err
		}
		pos -= size
		seg = append(chunk, seg...)
	}
	slices.Reverse(lines)
	return lines, partial, nil
}
