package snapshot

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
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

// PackFiles writes the regular files of ws to w as a tar, at most room
// bytes of content (-1: no limit), leaving out PackagesDir. What it leaves
// out besides (symlinks, special files, empty directories) is described
// in skipped; a workspace over the limits is an error.
func PackFiles(ws *workspace.Dir, w io.Writer, room int64) (files int, skipped []string, err error) {
	entries, truncated, err := ws.List(".", MaxFiles+1)
	if err != nil {
		return 0, nil, fmt.Errorf("snapshot: list the workspace: %w", err)
	}
	if truncated || len(entries) > MaxFiles {
		return 0, nil, fmt.Errorf("snapshot: the workspace has more than %d entries (or is nested deeper than %d levels), more than a snapshot keeps", MaxFiles, workspace.MaxListDepth)
	}
	tw := tar.NewWriter(w)
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
			skipped = append(skipped, fmt.Sprintf("%s: a symlink (to %s) is not kept", e.Path, e.Target))
			continue
		default:
			skipped = append(skipped, fmt.Sprintf("%s: a special file is not kept", e.Path))
			continue
		}
		limit := int64(1) << 40
		if room >= 0 {
			limit = room - used
		}
		data, info, err := ws.Read(e.Path, max(limit, 0))
		switch {
		case errors.Is(err, workspace.ErrTooLarge):
			return 0, nil, fmt.Errorf("%w: the workspace's files", ErrTooBig)
		case errors.Is(err, workspace.ErrNotFound), errors.Is(err, workspace.ErrNotRegular), errors.Is(err, workspace.ErrSymlink):
			// Changed since it was listed (a process the session left
			// running): it is as the session has it now, or gone.
			skipped = append(skipped, fmt.Sprintf("%s: changed while it was saved", e.Path))
			continue
		case err != nil:
			return 0, nil, fmt.Errorf("snapshot: read %s: %w", e.Path, err)
		}
		used += int64(len(data))
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: e.Path, Size: int64(len(data)), Mode: 0o644, ModTime: info.ModTime.Truncate(time.Second), Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return 0, nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return 0, nil, err
		}
		files++
	}
	return files, skipped, tw.Close()
}

// UnpackFiles writes the files of a tar PackFiles made into ws, each at
// most maxFile bytes. The tar comes from a verified snapshot, but it is
// treated as hostile all the same: every path is cleaned and written
// beneath the workspace without following a link (workspace.Dir.Write).
func UnpackFiles(ws *workspace.Dir, r io.Reader, maxFile int64) (int, error) {
	tr := tar.NewReader(r)
	n := 0
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, fmt.Errorf("snapshot: the saved files: %w", err)
		}
		if n++; n > MaxFiles {
			return n, fmt.Errorf("snapshot: the saved files: more than %d", MaxFiles)
		}
		if hdr.Typeflag != tar.TypeReg {
			return n, fmt.Errorf("snapshot: the saved files: %q is not a regular file", hdr.Name)
		}
		if hdr.Size < 0 || hdr.Size > maxFile {
			return n, fmt.Errorf("snapshot: the saved files: %s is %d bytes, more than the workspace holds", hdr.Name, hdr.Size)
		}
		data, err := io.ReadAll(io.LimitReader(tr, hdr.Size))
		if err != nil {
			return n, fmt.Errorf("snapshot: the saved files: %w", err)
		}
		if err := ws.Write(hdr.Name, data, maxFile); err != nil {
			return n, fmt.Errorf("snapshot: restore %s: %w", hdr.Name, err)
		}
	}
}
