// Package hostbuild makes a python-build-standalone style install_only
// archive out of an interpreter this machine has, and serves archives from
// a mirror on loopback, with download metadata in uv's format naming them.
// Tests and `pysandbox bench --python` use it to exercise managed
// interpreters for real (download, digest, unpack, sandboxed runs) where
// the real download host cannot be reached.
//
// Debian's /usr/bin/python3.X is a good source: libpython is linked into
// the executable, and the interpreter finds its standard library relative
// to itself (the lib/python3.X/os.py landmark), so arranged as
// python/bin/python3.X and python/lib/python3.X it runs from wherever it
// is unpacked, as a real install_only build does.
package hostbuild

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"

	"github.com/pysandbox/pysandbox/internal/interp"
)

// Archive is a built archive.
type Archive struct {
	Path                string // the .tar.gz
	SHA256              string
	Major, Minor, Patch int
	Size                int64
}

// Version is "3.11.2".
func (a *Archive) Version() string { return fmt.Sprintf("%d.%d.%d", a.Major, a.Minor, a.Patch) }

// Name is the archive's file name, as python-build-standalone names them.
func (a *Archive) Name() string {
	return fmt.Sprintf("cpython-%s+hostbuild-%s-unknown-linux-gnu-install_only.tar.gz", a.Version(), interp.Arch())
}

// skip are standard library directories a run never needs: the static
// library and build files, the test suite, IDLE and the demos.
var skip = regexp.MustCompile(`^(config-3\.[0-9]+-.*|test|idlelib|turtledemo|tkinter|pydoc_data|dist-packages|site-packages)$`)

var once struct {
	sync.Mutex
	built map[string]*Archive
}

// System builds (once per process and directory) an archive of the
// system's python3 (/usr/bin/python3) into dir, with pip (Debian's, from
// /usr/lib/python3/dist-packages) when the host has it, so that
// dependencies can be installed with it.
func System(dir string) (*Archive, error) {
	once.Lock()
	defer once.Unlock()
	if a := once.built[dir]; a != nil {
		return a, nil
	}
	it, err := interp.Inspect(context.Background(), "/usr/bin/python3")
	if err != nil {
		return nil, fmt.Errorf("hostbuild: %w", err)
	}
	exe, minor, patch := it.Path, it.Minor, 0
	fmt.Sscanf(it.Version, "3.%d.%d", &minor, &patch)
	stdlib := filepath.Join(it.Prefix, "lib", fmt.Sprintf("python3.%d", minor))
	if fi, err := os.Stat(filepath.Join(stdlib, "os.py")); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("hostbuild: no standard library in %s", stdlib)
	}
	if err := static(exe); err != nil {
		return nil, err
	}
	a := &Archive{Major: 3, Minor: minor, Patch: patch}
	a.Path = filepath.Join(dir, a.Name())
	f, err := os.Create(a.Path)
	if err != nil {
		return nil, fmt.Errorf("hostbuild: %w", err)
	}
	h := sha256.New()
	zw, _ := gzip.NewWriterLevel(io.MultiWriter(f, h), gzip.BestSpeed)
	tw := tar.NewWriter(zw)
	w := &writer{tw: tw}
	w.dir("python")
	w.dir("python/bin")
	w.file(exe, fmt.Sprintf("python/bin/python3.%d", minor), 0o755)
	w.link(fmt.Sprintf("python3.%d", minor), "python/bin/python3")
	w.link("python3", "python/bin/python")
	w.dir("python/lib")
	w.tree(stdlib, fmt.Sprintf("python/lib/python3.%d", minor), true)
	// Debian's site module looks for packages in lib/python3/dist-packages
	// beside the interpreter's lib/python3.X.
	if fi, err := os.Stat("/usr/lib/python3/dist-packages/pip"); err == nil && fi.IsDir() {
		w.dir("python/lib/python3")
		w.dir("python/lib/python3/dist-packages")
		w.tree("/usr/lib/python3/dist-packages/pip", "python/lib/python3/dist-packages/pip", false)
	}
	if w.err == nil {
		w.err = tw.Close()
	}
	if w.err == nil {
		w.err = zw.Close()
	}
	if err := errors.Join(w.err, f.Close()); err != nil {
		os.Remove(a.Path)
		return nil, fmt.Errorf("hostbuild: %w", err)
	}
	a.SHA256 = hex.EncodeToString(h.Sum(nil))
	if fi, err := os.Stat(a.Path); err == nil {
		a.Size = fi.Size()
	}
	if once.built == nil {
		once.built = map[string]*Archive{}
	}
	once.built[dir] = a
	return a, nil
}

// static refuses an interpreter that needs a shared libpython: it would
// look for it where it was built, not beside itself.
func static(exe string) error {
	f, err := elf.Open(exe)
	if err != nil {
		return fmt.Errorf("hostbuild: %w", err)
	}
	defer f.Close()
	libs, err := f.ImportedLibraries()
	if err != nil {
		return fmt.Errorf("hostbuild: %w", err)
	}
	for _, l := range libs {
		if strings.HasPrefix(l, "libpython") {
			return fmt.Errorf("hostbuild: %s needs %s: it is not relocatable", exe, l)
		}
	}
	return nil
}

type writer struct {
	tw  *tar.Writer
	err error
}

func (w *writer) dir(name string) {
	if w.err == nil {
		w.err = w.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: 0o755})
	}
}

func (w *writer) link(target, name string) {
	if w.err == nil {
		w.err = w.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777})
	}
}

func (w *writer) file(src, name string, mode int64) {
	if w.err != nil {
		return
	}
	f, err := os.Open(src)
	if err != nil {
		w.err = err
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		w.err = err
		return
	}
	if w.err = w.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: fi.Size(), ModTime: fi.ModTime()}); w.err != nil {
		return
	}
	_, w.err = io.Copy(w.tw, f)
}

// tree adds src as name: directories, regular files and symlinks that
// stay inside it.
func (w *writer) tree(src, name string, top bool) {
	if w.err != nil {
		return
	}
	w.err = filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if top && d.IsDir() && rel != "." && !strings.Contains(rel, "/") && skip.MatchString(rel) {
			return filepath.SkipDir
		}
		dst := name
		if rel != "." {
			dst = name + "/" + filepath.ToSlash(rel)
		}
		switch {
		case d.IsDir():
			w.dir(dst)
		case d.Type()&fs.ModeSymlink != 0:
			t, err := os.Readlink(p)
			if err == nil && !filepath.IsAbs(t) && !strings.Contains(t, "..") {
				w.link(t, dst)
			}
		case d.Type().IsRegular():
			info, err := d.Info()
			if err != nil {
				return err
			}
			mode := int64(0o644)
			if info.Mode()&0o111 != 0 {
				mode = 0o755
			}
			w.file(p, dst, mode)
		}
		return w.err
	})
}

// Entry is one download of Metadata.
type Entry struct {
	Major, Minor, Patch int
	Prerelease          string
	URL, SHA256         string
}

// EntryOf is the metadata entry of a at url.
func EntryOf(a *Archive, url string) Entry {
	return Entry{Major: a.Major, Minor: a.Minor, Patch: a.Patch, URL: url, SHA256: a.SHA256}
}

// Metadata writes download metadata in uv's format.
func Metadata(entries ...Entry) []byte {
	doc := map[string]any{}
	for _, e := range entries {
		key := fmt.Sprintf("cpython-%d.%d.%d%s-linux-%s-gnu", e.Major, e.Minor, e.Patch, e.Prerelease, interp.Arch())
		doc[key] = map[string]any{
			"name": "cpython", "arch": map[string]any{"family": interp.Arch(), "variant": nil},
			"os": "linux", "libc": "gnu", "major": e.Major, "minor": e.Minor, "patch": e.Patch,
			"prerelease": e.Prerelease, "url": e.URL, "sha256": e.SHA256, "variant": nil, "build": "hostbuild",
		}
	}
	data, _ := json.MarshalIndent(doc, "", "  ")
	return data
}

// MajorMinor is "3.11".
func (a *Archive) MajorMinor() string { return fmt.Sprintf("%d.%d", a.Major, a.Minor) }
