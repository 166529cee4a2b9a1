package deps

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// What an environment costs is what the host's disk spends on it, not the
// apparent sizes of its files: a sparse file of 255 MiB with no data in it
// takes no block, a file of one byte takes a whole block and an inode, and
// a file with ten names is stored once. So the cache charges every
// distinct inode of an environment (its directory, meta.json, site/ and
// everything below)
//
//	charge = InodeCost + st_blocks × 512
//
// st_blocks being what the file system allocated to it (data, and the
// extent or indirect blocks that map it), as du(1) counts. InodeCost stands
// for the inode itself: its table entry is only 256 bytes on ext4, but
// inodes are a pool fixed when the file system is made (one per 16 KiB by
// default), so a tree of empty files must not be free; one block is what
// the smallest file costs anyway. A hard-linked inode is charged once,
// however many names it has. Env.SizeBytes is this figure, and so are the
// cap (Config.MaxBytes), `pysandbox cache ls` and prune.
const InodeCost = 4096

// diskAccounting marks an Env whose SizeBytes is the charge above; an env
// written before it has its apparent size there, and is measured instead.
const diskAccounting = "disk/1"

// blockSize is the unit of the estimates made before copying: what ext4,
// xfs and tmpfs allocate in.
const blockSize = 4096

// inodeCharge is one inode's charge.
func inodeCharge(st *unix.Stat_t) int64 { return InodeCost + st.Blocks*512 }

// devIno identifies an inode, to charge (and copy) a hard-linked one once.
type devIno struct{ dev, ino uint64 }

// diskUsage returns the charge of the tree at root, following no symlink.
// Only inodes with several names are remembered, so its memory grows with
// the hard links in the tree, not with the tree.
func diskUsage(root string) (int64, error) {
	var total int64
	linked := map[devIno]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("no stat for %s", path)
		}
		if st.Nlink > 1 && !info.IsDir() {
			k := devIno{st.Dev, st.Ino}
			if linked[k] {
				return nil
			}
			linked[k] = true
		}
		total += InodeCost + st.Blocks*512
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("deps: measure %s: %w", root, err)
	}
	return total, nil
}

// roundBlock rounds n up to whole blocks.
func roundBlock(n int64) int64 { return (n + blockSize - 1) / blockSize * blockSize }

// mib renders a byte count for messages.
func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
