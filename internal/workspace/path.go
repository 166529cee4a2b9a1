package workspace

import (
	"fmt"
	"strings"
)

// Limits on client-supplied paths. They are far below what Linux allows
// (PATH_MAX 4096, NAME_MAX 255, no depth limit); the point is that a hostile
// argument cannot make us do unbounded work or hit a kernel limit with a
// confusing error.
const (
	MaxPathLen       = 4096 // bytes in the whole path
	MaxComponentLen  = 255  // bytes in one name (NAME_MAX)
	MaxPathComponent = 64   // names in a path
)

// CleanPath validates a client-supplied path relative to the workspace root
// and returns it in canonical form: no leading "./", no empty or "."
// elements, no trailing slash, e.g. "./a//b/" becomes "a/b".
//
// It rejects the empty path and "." (they name the workspace root, not a
// file), absolute paths, any ".." element (even one that would stay inside,
// like "a/../b": there is no legitimate need and it keeps the rule simple),
// NUL and other control characters, names over 255 bytes, paths over 4096
// bytes and paths of more than 64 names. Backslashes, spaces and any other
// printable characters are allowed: they are ordinary file name bytes on
// Linux.
//
// CleanPath is purely lexical: it does not look at the file system, so it
// does not protect against symlinks; the Dir methods do that. The errors
// wrap ErrInvalidPath and are written for the person or model that sent
// the path.
func CleanPath(p string) (string, error) {
	c, err := cleanDir(p)
	if err != nil {
		return "", err
	}
	if c == "." {
		return "", fmt.Errorf("%w: the path is empty; name a file relative to the workspace, e.g. data/input.csv", ErrInvalidPath)
	}
	return c, nil
}

// cleanDir is CleanPath for arguments that may name the workspace root
// (List, Stat): "" and "." are allowed and come back as ".".
func cleanDir(p string) (string, error) {
	if len(p) > MaxPathLen {
		return "", fmt.Errorf("%w: the path is %d bytes long; the limit is %d", ErrInvalidPath, len(p), MaxPathLen)
	}
	if strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("%w: %q is absolute; paths must be relative to the workspace, e.g. data/input.csv", ErrInvalidPath, p)
	}
	for i, r := range p {
		// Control characters are never needed in a name we are asked for,
		// and NUL would truncate the path at the system call.
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return "", fmt.Errorf("%w: the path contains the control character %U at byte %d; remove it", ErrInvalidPath, r, i)
		}
	}
	var parts []string
	for _, e := range strings.Split(p, "/") {
		switch e {
		case "", ".":
			continue
		case "..":
			return "", fmt.Errorf("%w: %q contains \"..\"; paths must stay inside the workspace, e.g. data/input.csv", ErrInvalidPath, p)
		}
		if len(e) > MaxComponentLen {
			return "", fmt.Errorf("%w: the name %.40q... is %d bytes long; the limit is %d", ErrInvalidPath, e, len(e), MaxComponentLen)
		}
		parts = append(parts, e)
		if len(parts) > MaxPathComponent {
			return "", fmt.Errorf("%w: the path has more than %d directory levels", ErrInvalidPath, MaxPathComponent)
		}
	}
	if len(parts) == 0 {
		return ".", nil
	}
	return strings.Join(parts, "/"), nil
}
