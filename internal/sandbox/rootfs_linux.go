package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// stageDir is where the new root is assembled before pivot_root. Mounting
// over it is harmless: we are in a private mount namespace, and every bind
// source is a descriptor, not a path that the mount could shadow.
const stageDir = "/tmp"

// buildRoot assembles a fresh root filesystem and pivots into it:
//
//	/                 tmpfs, read-only once built
//	/usr, /lib*, ...  read-only binds of the host's (or symlinks, as on the host)
//	/etc              a few generated files plus read-only binds of what Python needs
//	/proc             a new procfs for the new pid namespace
//	/dev              tmpfs with null, zero, full, random, urandom and shm
//	/tmp, /work       one size-capped tmpfs, shared with /dev/shm
//	/.pysandbox       the worker program, read-only
func buildRoot(cfg *initConfig) error {
	// Nothing we mount may propagate back to the host.
	if err := mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return err
	}
	// Open every source before the first mount of ours, in this namespace
	// (a descriptor from the parent's namespace cannot be bind-mounted).
	srcs := make([]int, len(cfg.Binds))
	for i, b := range cfg.Binds {
		srcs[i] = -1
		if b.FD != 0 || b.Empty {
			continue // a detached mount from the server, or no source at all
		}
		fd, err := unix.Open(b.Source, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("sandbox init: open %s: %w", b.Source, os.NewSyscallError("open", err))
		}
		srcs[i] = fd
	}
	defer func() {
		for _, fd := range srcs {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
	}()
	root := stageDir
	if err := mount("tmpfs", root, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=16m,nr_inodes=4096,mode=0755"); err != nil {
		return err
	}
	// .pysandbox/scratch stays an empty mountpoint: a warm-pool child mounts
	// its own scratch tmpfs there (see the worker's zygote mode).
	for _, d := range []string{"proc", "dev", "tmp", "work", "etc", ".pysandbox", ".pysandbox/scratch", ".scratch"} {
		if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
			return fmt.Errorf("sandbox init: %w", err)
		}
	}
	if err := mount("tmpfs", filepath.Join(root, "dev"), "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "size=64k,nr_inodes=64,mode=0755"); err != nil {
		return err
	}
	var empties []string
	for i, b := range cfg.Binds {
		if b.Empty {
			if err := emptyDir(root, b.Target); err != nil {
				return err
			}
			empties = append(empties, filepath.Join(root, b.Target))
			continue
		}
		if err := bind(root, b, srcs[i]); err != nil {
			return err
		}
	}
	for _, dir := range empties {
		if err := setReadOnly(dir, false); err != nil {
			return err
		}
	}
	for _, l := range cfg.Symlinks {
		if err := mkdirParents(root, l[1]); err != nil {
			return err
		}
		if err := os.Symlink(l[0], filepath.Join(root, l[1])); err != nil {
			return fmt.Errorf("sandbox init: %w", err)
		}
	}
	for _, l := range [][2]string{{"/proc/self/fd", "fd"}, {"/proc/self/fd/0", "stdin"}, {"/proc/self/fd/1", "stdout"}, {"/proc/self/fd/2", "stderr"}} {
		if err := os.Symlink(l[0], filepath.Join(root, "dev", l[1])); err != nil {
			return fmt.Errorf("sandbox init: %w", err)
		}
	}
	if err := scratch(root, cfg.TmpBytes); err != nil {
		return err
	}
	// The init made /dev as the sandbox user, who would otherwise own it:
	// nothing may be created there.
	if err := setReadOnly(filepath.Join(root, "dev"), false); err != nil {
		return err
	}
	if err := mount("proc", filepath.Join(root, "proc"), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return err
	}
	if cfg.MaskProc {
		if err := maskProc(root); err != nil {
			return err
		}
	}
	for _, f := range append(append([]File(nil), cfg.Etc...), cfg.Files...) {
		if err := mkdirParents(root, f.Path); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(root, f.Path), f.Content, 0o444); err != nil {
			return fmt.Errorf("sandbox init: write %s: %w", f.Path, err)
		}
	}
	if err := os.Chdir(root); err != nil {
		return fmt.Errorf("sandbox init: %w", err)
	}
	// pivot_root(".", ".") stacks the old root on top of the new one; the
	// detach below then removes every trace of the host's tree.
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("sandbox init: %w", os.NewSyscallError("pivot_root", err))
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("sandbox init: detach old root: %w", os.NewSyscallError("umount2", err))
	}
	if err := os.Chdir("/"); err != nil {
		return fmt.Errorf("sandbox init: %w", err)
	}
	return setReadOnly("/", false)
}

// scratch mounts the one writable, size-capped tmpfs and shares it between
// /tmp, /work and /dev/shm, so the cap covers all three together.
func scratch(root string, size int64) error {
	dir := filepath.Join(root, ".scratch")
	opts := "size=" + strconv.FormatInt(size, 10) + ",nr_inodes=65536,mode=0755"
	if err := mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return err
	}
	if err := os.Mkdir(filepath.Join(root, "dev", "shm"), 0o755); err != nil {
		return fmt.Errorf("sandbox init: %w", err)
	}
	for _, d := range []struct {
		name, target string
		mode         os.FileMode
	}{{"tmp", "tmp", 0o1777}, {"work", "work", 0o755}, {"shm", "dev/shm", 0o1777}} {
		src := filepath.Join(dir, d.name)
		if err := os.Mkdir(src, 0o755); err != nil {
			return fmt.Errorf("sandbox init: %w", err)
		}
		if err := os.Chmod(src, d.mode); err != nil {
			return fmt.Errorf("sandbox init: %w", err)
		}
		// The init may be root of the namespace; the worker is not.
		if err := os.Lchown(src, sandboxUID, sandboxGID); err != nil {
			return fmt.Errorf("sandbox init: %w", err)
		}
		if err := mount(src, filepath.Join(root, d.target), "", unix.MS_BIND, ""); err != nil {
			return err
		}
	}
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("sandbox init: %w", os.NewSyscallError("umount2", err))
	}
	return os.Remove(dir)
}

func bind(root string, b bindMount, fd int) error {
	target := filepath.Join(root, b.Target)
	if err := mkdirParents(root, b.Target); err != nil {
		return err
	}
	if b.Dir {
		if err := os.MkdirAll(target, 0o755); err != nil {
			return fmt.Errorf("sandbox init: %w", err)
		}
	} else {
		f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY, 0o444)
		if err != nil {
			return fmt.Errorf("sandbox init: %w", err)
		}
		f.Close()
	}
	if b.FD != 0 {
		// A detached tree the server opened for us (see openBindTrees).
		if err := unix.MoveMount(b.FD, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("sandbox init: attach %s on %s: %w", b.Source, b.Target, os.NewSyscallError("move_mount", err))
		}
		unix.Close(b.FD)
	} else {
		src := "/proc/self/fd/" + strconv.Itoa(fd)
		if err := mount(src, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return err
		}
	}
	switch {
	case b.Device:
		return nil
	case b.Writable:
		return setAttrs(target, true, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	}
	return setReadOnly(target, true)
}

// setAttrs adds mount attributes to a mount (and, when recursive, to every
// mount below it).
func setAttrs(path string, recursive bool, attrs uint64) error {
	var flags uint
	if recursive {
		flags = unix.AT_RECURSIVE
	}
	attr := unix.MountAttr{Attr_set: attrs}
	if err := unix.MountSetattr(unix.AT_FDCWD, path, flags, &attr); err != nil && err != unix.ENOSYS {
		return fmt.Errorf("sandbox init: attributes of %s: %w", path, os.NewSyscallError("mount_setattr", err))
	}
	return nil
}

// setReadOnly makes a mount (and, when recursive, every mount below it)
// read-only, nosuid and nodev. mount_setattr only adds flags, so flags the
// host locked on the source (e.g. noexec) stay as they were.
func setReadOnly(path string, recursive bool) error {
	var flags uint
	if recursive {
		flags = unix.AT_RECURSIVE
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	err := unix.MountSetattr(unix.AT_FDCWD, path, flags, &attr)
	if err == unix.ENOSYS {
		// Kernels before 5.12: a plain remount, which covers the top mount only.
		return mount("", path, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, "")
	}
	if err != nil {
		return fmt.Errorf("sandbox init: read-only %s: %w", path, os.NewSyscallError("mount_setattr", err))
	}
	return nil
}

// emptyDir mounts an empty tmpfs at target (made read-only once the binds
// inside it, if any, are in place).
func emptyDir(root, target string) error {
	dir := filepath.Join(root, target)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("sandbox init: %w", err)
	}
	return mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=64k,nr_inodes=256,mode=0755")
}

func mkdirParents(root, p string) error {
	if err := os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755); err != nil {
		return fmt.Errorf("sandbox init: %w", err)
	}
	return nil
}

func mount(src, target, fstype string, flags uintptr, data string) error {
	if err := unix.Mount(src, target, fstype, flags, data); err != nil {
		return fmt.Errorf("sandbox init: mount %s on %s: %w", src, target, os.NewSyscallError("mount", err))
	}
	return nil
}
