package workspace

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

const (
	// DefaultListMax is the entry limit List uses when asked for max <= 0.
	DefaultListMax = 1000
	// MaxListDepth is how many directory levels below its start List
	// descends.
	MaxListDepth = 32
	// maxListScan bounds the names one List reads from directories in
	// all, so a directory with millions of entries costs bounded time and
	// memory. Names must all be read before sorting, so this is separate
	// from the entry limit.
	maxListScan = 1 << 17
)

// List walks the directory at path ("" or "." for the workspace root)
// depth first, each directory's entries in byte order of their names, and
// returns up to max entries (DefaultListMax when max <= 0), not including
// the start directory itself. Paths in the entries are relative to the
// workspace root.
//
// Symlinks met during the walk are never followed: they are listed with
// Type "symlink" and their target text, so a link to "/" or a loop costs
// nothing. Directories that are mount points or that we cannot open are
// listed but not entered. truncated is true when entries were left out:
// the max was reached, the walk stopped MaxListDepth levels down, or a
// huge directory was not read to its end (then the order of what was
// listed from it is only sorted among the names that were read).
//
// The start path follows symlinks that stay inside the workspace, like
// Read. If it is not a directory, List returns just its Stat.
func (d *Dir) List(path string, max int) (entries []FileInfo, truncated bool, err error) {
	entries, _, truncated, err = d.list(path, max, false)
	return entries, truncated, err
}

// ListVisible is List without hidden entries: those whose name begins
// with a dot (.cache, .config, .env), which are neither listed nor
// entered. hidden counts the ones met and left out (not what they hold).
// The start path may itself be hidden.
func (d *Dir) ListVisible(path string, max int) (entries []FileInfo, hidden int, truncated bool, err error) {
	return d.list(path, max, true)
}

func (d *Dir) list(path string, max int, skipHidden bool) (entries []FileInfo, hidden int, truncated bool, err error) {
	c, err := cleanDir(path)
	if err != nil {
		return nil, 0, false, fmt.Errorf("workspace: list %q: %w", path, err)
	}
	if max <= 0 {
		max = DefaultListMax
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.fd < 0 {
		return nil, 0, false, closed("list")
	}
	fd, err := openat2(d.fd, c, unix.O_RDONLY|unix.O_DIRECTORY, 0, resolveBeneath)
	if errors.Is(err, unix.ENOTDIR) {
		// Either the path names a non-directory, or one of its parents
		// is not a directory; stat tells both apart.
		info, err := d.stat(c)
		if err != nil {
			return nil, 0, false, err
		}
		return []FileInfo{info}, 0, false, nil
	}
	if err != nil {
		return nil, 0, false, lookupError("list", c, os.NewSyscallError("openat2", err))
	}
	w := walker{max: max, budget: maxListScan, out: []FileInfo{}, skipHidden: skipHidden}
	prefix := ""
	if c != "." {
		prefix = c + "/"
	}
	if err := w.walk(fd, prefix, 1); err != nil {
		return nil, 0, false, lookupError("list", c, err)
	}
	return w.out, w.hidden, w.truncated, nil
}

type walker struct {
	max        int
	budget     int // names still allowed to be read
	out        []FileInfo
	truncated  bool
	skipHidden bool // leave out names beginning with a dot
	hidden     int  // how many were left out
}

// walk lists the directory open at fd, which it closes, and descends into
// its subdirectories. Only errors reading the start directory itself are
// returned: trouble further down (an entry vanishing or being swapped
// under us, a directory we may not read) just leaves that part out.
func (w *walker) walk(fd int, prefix string, depth int) error {
	f := os.NewFile(uintptr(fd), prefix)
	defer f.Close()
	names, err := w.names(f)
	if err != nil && depth == 1 {
		return err
	}
	slices.Sort(names)
	for _, name := range names {
		if w.skipHidden && strings.HasPrefix(name, ".") {
			w.hidden++
			continue
		}
		if len(w.out) >= w.max {
			w.truncated = true
			return nil
		}
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue // gone since we read the directory
		}
		target := ""
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			target = readlink(fd, name)
		}
		w.out = append(w.out, newFileInfo(prefix+name, &st, target))
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		if depth >= MaxListDepth {
			w.truncated = true
			continue
		}
		// The entry was a directory when we looked; it may be a symlink
		// by now. RESOLVE_NO_SYMLINKS and O_NOFOLLOW refuse that, and
		// RESOLVE_NO_XDEV refuses mount points.
		sub, err := openat2(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0, resolveNoLinks)
		if err != nil {
			continue
		}
		w.walk(sub, prefix+name+"/", depth+1)
		if len(w.out) >= w.max && w.truncated {
			return nil
		}
	}
	return nil
}

// names reads the names in f, at most w.budget of them.
func (w *walker) names(f *os.File) ([]string, error) {
	var names []string
	for {
		if w.budget <= 0 {
			w.truncated = true
			return names, nil
		}
		batch, err := f.Readdirnames(min(w.budget, 1024))
		w.budget -= len(batch)
		names = append(names, batch...)
		if err == io.EOF {
			return names, nil
		}
		if err != nil {
			return names, err
		}
	}
}

// DisplayPath renders a path for a text listing, one entry per line. A
// name is whatever code in the session chose, so a newline in it would
// plant a row of its own, a carriage return or an ANSI escape would
// overwrite what a terminal shows, and a bidi override would make a name
// ending in "gnp.exe" read as one ending in "exe.png". A path of printable
// characters is shown as it is; any other is quoted Go style, with each
// control, non-printing, invisible (format, bidi, default-ignorable) rune
// and each byte that is not UTF-8 escaped (\n, \x1b, \u202e, \xff), and
// quotes and backslashes escaped too, so that the quoted form reads back
// (strconv.Unquote) as exactly the path. A path that begins or ends with
// a space, or begins with a quote, is quoted as well, where its edges
// would otherwise be invisible or ambiguous.
func DisplayPath(p string) string {
	if plainPath(p) {
		return p
	}
	var b strings.Builder
	b.Grow(len(p) + 16)
	b.WriteByte('"')
	for i := 0; i < len(p); {
		r, size := utf8.DecodeRuneInString(p[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, p[i])
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case !visible(r):
			if r > 0xffff {
				fmt.Fprintf(&b, `\U%08x`, r)
			} else {
				fmt.Fprintf(&b, `\u%04x`, r)
			}
		default:
			b.WriteRune(r)
		}
		i += size
	}
	b.WriteByte('"')
	return b.String()
}

// plainPath reports whether p can be shown without quotes.
func plainPath(p string) bool {
	if p == "" || p[0] == ' ' || p[0] == '"' || p[len(p)-1] == ' ' || !utf8.ValidString(p) {
		return false
	}
	for _, r := range p {
		if r == '\\' || !visible(r) {
			return false
		}
	}
	return true
}

// visible: a rune that prints as itself. strconv.IsPrint leaves out the
// controls, the separators other than the ASCII space and the format
// characters (bidi overrides and isolates, zero-width joiners, the BOM);
// Unicode's other default-ignorable code points (variation selectors,
// the combining grapheme joiner, the Hangul fillers) print as nothing
// although IsPrint takes them, so they are left out too.
func visible(r rune) bool {
	return strconv.IsPrint(r) && r != utf8.RuneError &&
		!unicode.In(r, unicode.Variation_Selector, unicode.Other_Default_Ignorable_Code_Point)
}
