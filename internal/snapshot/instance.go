package snapshot

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// maxInstances bounds the servers that can share one state directory.
const maxInstances = 8

// instancesDir holds, below a state directory, one directory for each
// further server started on it while the first holds it: two windows of
// one client, each starting its own server with the same --state-dir.
const instancesDir = "instances"

// LockInstance takes, for a server that found dir held (ErrLocked), the
// first free instance directory below it, dir/instances/2 to /9, and
// returns its path and release. Its snapshots are written with dir's key,
// so that whichever server next holds dir can adopt them (Adopt) once no
// server holds the instance. ErrLocked when every one is held.
func LockInstance(dir string) (string, func(), error) {
	for n := 2; n < 2+maxInstances; n++ {
		sub := filepath.Join(dir, instancesDir, strconv.Itoa(n))
		unlock, _, err := Lock(sub)
		if errors.Is(err, ErrLocked) {
			continue
		}
		if err != nil {
			return "", nil, err
		}
		return sub, unlock, nil
	}
	return "", nil, ErrLocked
}

// Adopt moves into st the snapshots of every instance directory below dir
// that no server holds (their servers stopped), and removes those
// directories' sessions: what a second window's server paused is resumed
// by the next server on the directory, as its own are. It holds each
// instance's lock while it moves, so that a server starting on it then
// waits for another. A snapshot whose id st has already is left where it
// is. It returns how many snapshots it moved.
func (st *Store) Adopt(dir string) (int, error) {
	ents, err := os.ReadDir(filepath.Join(dir, instancesDir))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("snapshot: instances: %w", err)
	}
	moved := 0
	var errs []error
	for _, e := range ents {
		if n, err := strconv.Atoi(e.Name()); err != nil || n < 2 || n >= 2+maxInstances || !e.IsDir() {
			continue
		}
		sub := filepath.Join(dir, instancesDir, e.Name())
		unlock, _, err := Lock(sub)
		if err != nil {
			if !errors.Is(err, ErrLocked) {
				errs = append(errs, err)
			}
			continue // a live server's, or not ours: left alone
		}
		n, err := st.adoptFrom(filepath.Join(sub, "sessions"))
		unlock()
		moved += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	return moved, errors.Join(errs...)
}

// adoptFrom renames each snapshot of from into st's directory (the same
// filesystem, both the server's own). A snapshot is checked when it is
// opened, as every one is: one planted or damaged is refused then.
func (st *Store) adoptFrom(from string) (int, error) {
	d, err := openDir(from, "instance's snapshot directory")
	if err != nil {
		return 0, err
	}
	d.Close()
	ents, err := os.ReadDir(from)
	if err != nil {
		return 0, fmt.Errorf("snapshot: %w", err)
	}
	moved := 0
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), suffix)
		if !ok || !ValidID(id) || !e.Type().IsRegular() {
			continue
		}
		if _, err := os.Lstat(st.path(id)); err == nil {
			continue
		}
		if err := os.Rename(filepath.Join(from, e.Name()), st.path(id)); err != nil {
			return moved, fmt.Errorf("snapshot: adopt %s: %w", id, err)
		}
		moved++
	}
	syncDir(st.dir)
	return moved, nil
}
