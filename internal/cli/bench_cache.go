package cli

import (
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/pysandbox/pysandbox/internal/deps"
)

// benchCache times copying a 200 MB environment-like tree (3 000 files of
// 8 KiB, 600 of 64 KiB, 10 of 14 MiB in 60 directories) out of a tmpfs,
// where installs are built, into the cache's file system, as an install
// is copied (deps.CopyTree: by descriptor, sparse-aware, constant memory),
// beside `cp -a` of the same tree in the same run; each copy is timed to
// the end of a sync of the file system, so that the data is on the disk.
func benchCache(cacheDir string, n int, stdout io.Writer) error {
	root := "/dev/shm"
	if fi, err := os.Stat(root); err != nil || !fi.IsDir() {
		root = ""
	}
	src, err := os.MkdirTemp(root, "pysandbox-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(src)
	rng := rand.New(rand.NewPCG(1, 2))
	var total int64
	write := func(name string, size int) error {
		data := make([]byte, size)
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		total += int64(size)
		return os.WriteFile(p, data, 0o644)
	}
	for i := range 3000 {
		if err := write(fmt.Sprintf("pkg%02d/mod%04d.py", i%60, i), 8<<10); err != nil {
			return err
		}
	}
	for i := range 600 {
		if err := write(fmt.Sprintf("pkg%02d/data/blob%03d.bin", i%60, i), 64<<10); err != nil {
			return err
		}
	}
	for i := range 10 {
		if err := write(fmt.Sprintf("pkg%02d/_ext%d.so", i, i), 14<<20); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(cacheDir, 0o700); err != nil {
		return err
	}
	dstRoot, err := os.MkdirTemp(cacheDir, "bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dstRoot)
	sync := func() error { return exec.Command("sync", "-f", dstRoot).Run() }
	timed := func(copyFn func(dst string) error) (time.Duration, error) {
		dst := filepath.Join(dstRoot, "site")
		start := time.Now()
		if err := copyFn(dst); err != nil {
			return 0, err
		}
		if err := sync(); err != nil {
			return 0, err
		}
		d := time.Since(start)
		if err := os.RemoveAll(dst); err != nil {
			return 0, err
		}
		return d, sync()
	}
	ours := func(dst string) error { return deps.CopyTree(src, dst) }
	cpA := func(dst string) error { return exec.Command("cp", "-a", src, dst).Run() }
	var a, b []time.Duration
	for i := range max(n/10, 3) {
		// Alternate which goes first.
		first, second := ours, cpA
		if i%2 == 1 {
			first, second = cpA, ours
		}
		d1, err := timed(first)
		if err != nil {
			return err
		}
		d2, err := timed(second)
		if err != nil {
			return err
		}
		if i%2 == 1 {
			d1, d2 = d2, d1
		}
		a, b = append(a, d1), append(b, d2)
	}
	fmt.Fprintf(stdout, "%-56s %9s %9s %10s\n", fmt.Sprintf("copying a %d MB environment into the cache", total/1_000_000), "p50", "p99", "ratio p50")
	fmt.Fprintf(stdout, "%-56s %9s %9s %10s\n", "cp -a (then sync)", ms(pct(b, 50)), ms(pct(b, 99)), "")
	fmt.Fprintf(stdout, "%-56s %9s %9s %9.2fx of cp -a\n", "an install's copy (by descriptor, sparse-aware; then sync)", ms(pct(a, 50)), ms(pct(a, 99)), ratio(pct(a, 50), pct(b, 50)))
	return nil
}
