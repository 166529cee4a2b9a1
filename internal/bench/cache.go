package bench

import (
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	"github.com/pysandbox/pysandbox/internal/deps"
)

// treeFiles are the files of an environment-like tree: count files of
// size bytes each, named by name(i).
type treeFiles struct {
	count, size int
	name        func(i int) string
}

// envTree is a 200 MB environment: 3 000 files of 8 KiB, 600 of 64 KiB,
// 10 of 14 MiB, in 60 directories.
var envTree = []treeFiles{
	{3000, 8 << 10, func(i int) string { return fmt.Sprintf("pkg%02d/mod%04d.py", i%60, i) }},
	{600, 64 << 10, func(i int) string { return fmt.Sprintf("pkg%02d/data/blob%03d.bin", i%60, i) }},
	{10, 14 << 20, func(i int) string { return fmt.Sprintf("pkg%02d/_ext%d.so", i, i) }},
}

// writeTree writes spec's files of random bytes under dir and returns
// their total size.
func writeTree(dir string, spec []treeFiles) (int64, error) {
	rng := rand.New(rand.NewPCG(1, 2))
	var total int64
	for _, fs := range spec {
		for i := range fs.count {
			data := make([]byte, fs.size)
			for j := range data {
				data[j] = byte(rng.Uint32())
			}
			p := filepath.Join(dir, fs.name(i))
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return 0, err
			}
			total += int64(fs.size)
			if err := os.WriteFile(p, data, 0o644); err != nil {
				return 0, err
			}
		}
	}
	return total, nil
}

// cacheCopy times copying a 200 MB environment-like tree (envTree) out of
// a tmpfs, where installs are built, into the cache's file system, as an
// install is copied (deps.CopyTree: by descriptor, sparse-aware, constant
// memory), beside `cp -a` of the same tree in the same run; each copy is
// timed to the end of a sync of the file system, so that the data is on
// the disk.
func cacheCopy(cacheDir string, n int, out io.Writer) error {
	root := "/dev/shm"
	if fi, err := os.Stat(root); err != nil || !fi.IsDir() {
		root = ""
	}
	src, err := os.MkdirTemp(root, "pysandbox-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(src)
	total, err := writeTree(src, envTree)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(cacheDir, 0o700); err != nil {
		return err
	}
	dstRoot, err := os.MkdirTemp(cacheDir, "bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dstRoot)
	ours := func(dst string) error { return deps.CopyTree(src, dst) }
	cpA := func(dst string) error { return exec.Command("cp", "-a", src, dst).Run() }
	var a, b []time.Duration
	for i := range max(n/10, 3) {
		// Alternate which goes first.
		first, second := ours, cpA
		if i%2 == 1 {
			first, second = cpA, ours
		}
		d1, err := timedCopy(dstRoot, first)
		if err != nil {
			return err
		}
		d2, err := timedCopy(dstRoot, second)
		if err != nil {
			return err
		}
		if i%2 == 1 {
			d1, d2 = d2, d1
		}
		a, b = append(a, d1), append(b, d2)
	}
	// Sorted, as pct wants them (their p50 and p99 were taken unsorted).
	slices.Sort(a)
	slices.Sort(b)
	writeCache(out, total, a, b)
	return nil
}

// timedCopy times copyFn into dstRoot/site, to the end of a sync, then
// removes the copy (and syncs again).
func timedCopy(dstRoot string, copyFn func(dst string) error) (time.Duration, error) {
	sync := func() error { return exec.Command("sync", "-f", dstRoot).Run() }
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

// writeCache is the copy's table: an install's copy (ours) beside cp -a
// of total bytes.
func writeCache(w io.Writer, total int64, ours, cpA []time.Duration) {
	fmt.Fprintf(w, "%-56s %9s %9s %10s\n", fmt.Sprintf("copying a %d MB environment into the cache", total/1_000_000), "p50", "p99", "ratio p50")
	fmt.Fprintf(w, "%-56s %9s %9s %10s\n", "cp -a (then sync)", ms(pct(cpA, 50)), ms(pct(cpA, 99)), "")
	fmt.Fprintf(w, "%-56s %9s %9s %9.2fx of cp -a\n", "an install's copy (by descriptor, sparse-aware; then sync)", ms(pct(ours, 50)), ms(pct(ours, 99)), ratio(pct(ours, 50), pct(cpA, 50)))
}
