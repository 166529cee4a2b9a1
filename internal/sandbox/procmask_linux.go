package sandbox

import (
	"errors"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// maskProc applies DefaultProcMasks to the /proc just mounted under root.
// Paths this kernel does not have are skipped; anything else that fails
// stops the sandbox from starting.
func maskProc(root string) error {
	null := filepath.Join(root, "dev", "null")
	for _, p := range procMaskedFiles {
		target := filepath.Join(root, p)
		if !exists(target) {
			continue
		}
		if err := mount(null, target, "", unix.MS_BIND, ""); err != nil {
			return err
		}
	}
	for _, p := range procMaskedDirs {
		target := filepath.Join(root, p)
		if !exists(target) {
			continue
		}
		if err := mount("tmpfs", target, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=4k,nr_inodes=1,mode=0555"); err != nil {
			return err
		}
	}
	for _, p := range procReadOnly {
		target := filepath.Join(root, p)
		if !exists(target) {
			continue
		}
		if err := mount(target, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return err
		}
		if err := setReadOnly(target, true); err != nil {
			return err
		}
	}
	return nil
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil || !errors.Is(err, os.ErrNotExist)
}
