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
// that no server holds (their servers stopped) but st's own: what a
// second window's server paused is resumed by the next server on the
// directory, as its own are. Any server on dir adopts as it starts, the
// holder and an instance's alike, so a window that comes back on another
// instance finds its sessions. It holds each instance's lock while it
// moves, so that a server starting on it takes another. Only snapshots
// that verify under st's key move (a directory with a key of its own was
// a state directory of its own, not an instance, and is left alone); a
// snapshot whose id st has already stays where it is. It returns how many
// snapshots it moved.
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
		if filepath.Join(sub, "sessions") == st.dir {
			continue
		}
		if _, err := os.Lstat(filepath.Join(sub, KeyFile)); err == nil {
			continue
		}
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
	var errs []error
	for _, e := range ents {
		name := filepath.Join(from, e.Name())
		if strings.HasPrefix(e.Name(), tmpPrefix) {
			os.Remove(name) // a write its server was killed in
			continue
		}
		id, ok := strings.CutSuffix(e.Name(), suffix)
		if !ok || !ValidID(id) || !e.Type().IsRegular() {
			continue
		}
		if _, err := os.Lstat(st.path(id)); err == nil {
			continue
		}
		if err := st.verifyAt(name, id); err != nil {
			errs = append(errs, fmt.Errorf("snapshot: not adopted: %s: %w", name, err))
			continue
		}
		if err := os.Rename(name, st.path(id)); err != nil {
			return moved, fmt.Errorf("snapshot: adopt %s: %w", id, err)
		}
		moved++
	}
	syncDir(st.dir)
	return moved, errors.Join(errs...)
}

// verifyAt checks the snapshot at path, id's, whole under st's key, as
// Open would in st.
func (st *Store) verifyAt(path, id string) error {
	f, err := openSnapshot(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, _, _, _, err = st.verify(f, id)
	return err
}
