package snapshot

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/pysandbox/pysandbox/internal/workspace"
)

// Limits of a workspace saved in a snapshot. The workspace lives on the
// session's scratch tmpfs, so its size is already bounded by the sandbox;
// these bound the work of walking and restoring it.
const (
	// MaxFiles is the most entries a saved workspace may have.
	MaxFiles = 20000
	// PackagesDir is where install_package puts packages in a workspace:
	// they are installed again from the session's requirements, not
	// copied into the snapshot.
	PackagesDir = ".packages"
)

// maxSkipped is how many files PackFiles and UnpackFiles describe one by
// one in skipped; the rest are counted in one last line.
const maxSkipped = 100

// skipList collects the "path: why" lines of files left out.
type skipList struct {
	lines []string
	more  int
}

func (l *skipList) add(path, why string) {
	if len(l.lines) < maxSkipped {
		l.lines = append(l.lines, path+": "+why)
	} else {
		l.more++
	}
}

func (l *skipList) list(what string) []string {
	if l.more > 0 {
		return append(l.lines, fmt.Sprintf("%d more files %s (not listed)", l.more, what))
	}
	return l.lines
}

// PackFiles writes the regular files of ws to w as a tar, at most room
// bytes of content (-1: no limit), leaving out PackagesDir. What it leaves
// out besides (symlinks, special files, empty directories, files that
// vanished or changed type while it worked) is described in skipped, as
// are files that changed size or content while they were copied (see
// below); of a workspace over the limits (MaxFiles entries,
// workspace.MaxListDepth levels) the first entries are kept, and skipped
// says so.
//
// Files are streamed into the tar, never held in memory. A file's size
// is taken when it is opened, and exactly that many bytes are saved: a
// file that grows meanwhile is cut at that size, one that shrinks is
// padded with zero bytes; either is listed in skipped as changed. Sparse
// files are saved with their holes as zero bytes and count at their full
// size against room (UnpackFiles makes the holes again); room, and the
// store's own disk reserve, bound what that can cost.
func PackFiles(ws *workspace.Dir, w io.Writer, room int64) (files int, skipped []string, err error) {
	entries, truncated, err := ws.List(".", MaxFiles+1)
	if err != nil {
		return 0, nil, fmt.Errorf("snapshot: list the workspace: %w", err)
	}
	tw := tar.NewWriter(w)
	var skip skipList
	if truncated || len(entries) > MaxFiles {
		// What fits is kept, and the rest said: refusing the whole
		// snapshot would lose the session's variables with its files (at
		// a drain, all of it).
		entries = entries[:min(len(entries), MaxFiles)]
		skip.add(".", fmt.Sprintf("the workspace has more than %d entries (or is nested deeper than %d levels): the first %d are kept, the rest are not", MaxFiles, workspace.MaxListDepth, len(entries)))
	}
	var used int64
	for _, e := range entries {
		if e.Path == PackagesDir || strings.HasPrefix(e.Path, PackagesDir+"/") {
			continue
		}
		switch e.Type {
		case "file":
		case "dir":
			continue // made again for the files in it
		case "symlink":
			skip.add(e.Path, fmt.Sprintf("a symlink (to %s) is not kept", e.Target))
			continue
		default:
			skip.add(e.Path, "a special file is not kept")
			continue
		}
		f, info, err := ws.Open(e.Path)
		switch {
		case errors.Is(err, workspace.ErrNotFound), errors.Is(err, workspace.ErrNotRegular), errors.Is(err, workspace.ErrSymlink):
			// Changed since it was listed (a process the session left
			// running): it is as the session has it now, or gone.
			skip.add(e.Path, "changed while it was saved")
			continue
		case err != nil:
			return 0, nil, fmt.Errorf("snapshot: read %s: %w", e.Path, err)
		}
		if room >= 0 && info.Size > room-used {
			f.Close()
			return 0, nil, fmt.Errorf("%w: the workspace's files", ErrTooBig)
		}
		n, err := packFile(tw, e.Path, f, info.Size, info.ModTime)
		var st os.FileInfo
		if err == nil {
			st, err = f.Stat()
		}
		f.Close()
		if err != nil {
			return 0, nil, err
		}
		switch {
		case n < info.Size:
			skip.add(e.Path, fmt.Sprintf("it shrank from %d to %d bytes while it was saved; the copy saved is padded with zero bytes", info.Size, n))
		case st.Size() != info.Size || !st.ModTime().Equal(info.ModTime):
			skip.add(e.Path, fmt.Sprintf("it changed while it was saved (%d bytes when saving began, %d after); the copy saved may be incomplete", info.Size, st.Size()))
		}
		used += info.Size
		files++
	}
	return files, skip.list("not saved"), tw.Close()
}

// packFile writes one file of size bytes to tw, streaming its content
// from r: exactly size bytes, whatever r has (the tar header promises
// them). It returns how many came from r; when r had fewer, the rest are
// zero bytes. An error reading r is one of its own: the tar is then
// unusable.
func packFile(tw *tar.Writer, name string, r io.Reader, size int64, mod time.Time) (int64, error) {
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Size: size, Mode: 0o644, ModTime: mod.Truncate(time.Second), Format: tar.FormatPAX}
	if err := tw.WriteHeader(hdr); err != nil {
		return 0, err
	}
	src := &readErr{r: r}
	n, err := io.CopyN(tw, src, size)
	if src.err != nil {
		return n, fmt.Errorf("snapshot: read %s: %w", name, src.err)
	}
	if err != nil && err != io.EOF {
		return n, err // from tw: ErrTooBig, or the disk
	}
	if n < size {
		if _, err := io.CopyN(tw, zeros{}, size-n); err != nil {
			return n, err
		}
	}
	return n, nil
}

// readErr is r, remembering its first error other than io.EOF: so an
// error of the source can be told from one of the destination.
type readErr struct {
	r   io.Reader
	err error
}

func (e *readErr) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF && e.err == nil {
		e.err = err
	}
	return n, err
}

// zeros reads as endless zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// UnpackFiles writes the files of a tar PackFiles made into ws, each at
// most maxFile bytes, streaming each (workspace.Dir.WriteFrom): no file is
// held in memory, and runs of zero bytes become holes again. The tar
// comes from a verified snapshot, but it is treated as hostile all the
// same: every path is cleaned and written beneath the workspace without
// following a link.
//
// A file that cannot be restored (the workspace is full, it is larger
// than maxFile, its name is refused, a link is in its way, an entry is
// not a regular file) is left out and described in skipped as "path:
// why", and the others are restored all the same; a tar of more than
// MaxFiles entries is restored up to there. Only a tar stream that cannot
// be read to its end is an error (restored and skipped then say how far
// it got).
func UnpackFiles(ws *workspace.Dir, r io.Reader, maxFile int64) (restored int, skipped []string, err error) {
	tr := tar.NewReader(r)
	var skip skipList
	for n := 0; ; n++ {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return restored, skip.list("not restored"), nil
		}
		if errors.Is(err, tar.ErrInsecurePath) && hdr != nil {
			// (With GODEBUG=tarinsecurepath=0.) The header is valid; the
			// name is refused below like any other bad name.
			err = nil
		}
		if err != nil {
			return restored, skip.list("not restored"), fmt.Errorf("snapshot: the saved files: %w", err)
		}
		name := fmt.Sprintf("%.200q", hdr.Name)
		if c, err := workspace.CleanPath(hdr.Name); err == nil {
			name = c
		}
		switch {
		case n >= MaxFiles:
			skip.add(name, fmt.Sprintf("the snapshot has more than %d files; this one and those after it were not restored", MaxFiles))
			return restored, skip.list("not restored"), nil
		case hdr.Typeflag != tar.TypeReg:
			skip.add(name, "not a regular file")
			continue
		case hdr.Size < 0 || hdr.Size > maxFile:
			skip.add(name, fmt.Sprintf("it is %d bytes, more than the workspace holds (%d)", hdr.Size, maxFile))
			continue
		}
		// What WriteFrom does not read of the entry, Next skips.
		src := &readErr{r: tr}
		_, werr := ws.WriteFrom(hdr.Name, src, maxFile)
		switch {
		case src.err != nil:
			return restored, skip.list("not restored"), fmt.Errorf("snapshot: the saved files: %s: %w", name, src.err)
		case werr != nil:
			skip.add(name, why(werr, name, hdr.Name))
		default:
			restored++
		}
	}
}

// why is a workspace error without its "workspace: write path: " prefix,
// which the skipped line has already.
func why(err error, clean, raw string) string {
	msg := err.Error()
	for _, p := range []string{clean, strconv.Quote(raw)} {
		if s, ok := strings.CutPrefix(msg, "workspace: write "+p+": "); ok {
			return s
		}
	}
	return msg
}
