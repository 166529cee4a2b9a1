package cli

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/pysandbox/pysandbox/internal/deps"
	"github.com/pysandbox/pysandbox/internal/sandbox"
)

const cacheUsage = `Usage: pysandbox cache ls [flags]          list the cached dependency environments and managed Pythons
       pysandbox cache prune [flags]       remove the least recently used ones (--all: every one not in use)

Run 'pysandbox cache ls -h' or 'pysandbox cache prune -h' for the flags.
`

// cacheCmd lists or prunes the cached dependency environments. Sizes are
// what the environments take on disk as the cache charges them against
// --cache-size: 4 KiB (deps.InodeCost) for each inode plus its allocated
// blocks, a hard-linked file once (see internal/deps/diskuse.go).
func cacheCmd(args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && isHelp(args[0]) {
		fmt.Fprint(stderr, cacheUsage)
		return flag.ErrHelp
	}
	if len(args) == 0 || (args[0] != "ls" && args[0] != "prune") {
		return usageError{fmt.Errorf("usage: pysandbox cache ls|prune [--all] [--max-size SIZE] [--cache-dir DIR]; pysandbox cache ls -h lists the flags")}
	}
	sub := args[0]
	synopsis := "cache " + sub + " [flags]"
	fs, o := newFlagSet("cache "+sub, synopsis, stderr)
	all := new(bool)
	var maxSize size
	if sub == "prune" {
		synopsis = "cache prune [--all] [--max-size SIZE] [flags]"
		fs.BoolVar(all, "all", false, "remove every environment not in use")
		fs.Var(&maxSize, "max-size", "remove the least recently used environments until the cache is at most this size (default --cache-size)")
		showOnly(fs, stderr, synopsis, "all", "max-size", "cache-dir", "cache-size")
	} else {
		showOnly(fs, stderr, synopsis, "cache-dir", "cache-size")
	}
	if err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	// ls and prune never install; the backend is only there to satisfy the
	// cache's configuration.
	cache, err := o.depsCache(sandbox.NewNative(), slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	if sub == "prune" {
		limit := int64(o.cacheSize)
		if maxSize > 0 {
			limit = int64(maxSize)
		}
		if *all {
			limit = 0
		}
		removed, err := cache.Prune(limit)
		if err != nil {
			return err
		}
		var freed int64
		for _, e := range removed {
			freed += e.SizeBytes
		}
		fmt.Fprintf(stdout, "removed %d environments (%.1f MiB on disk)\n", len(removed), float64(freed)/(1<<20))
		return nil
	}
	envs, err := cache.List()
	if err != nil {
		return err
	}
	var total int64
	fmt.Fprintf(stdout, "%-32s %-8s %9s  %-20s %s\n", "KEY", "PYTHON", "DISK", "LAST USED", "REQUIREMENTS")
	for _, e := range envs {
		total += e.SizeBytes
		what := strings.Join(e.Requirements, " ")
		if e.Kind == deps.KindPython {
			what = "Python " + e.Python + " (managed interpreter)"
		}
		fmt.Fprintf(stdout, "%-32s %-8s %8.1fM  %-20s %s\n", e.Key, e.Python, float64(e.SizeBytes)/(1<<20), e.LastUsed.Local().Format(time.DateTime), what)
	}
	fmt.Fprintf(stdout, "%d environments, %.1f MiB on disk (cap %.1f MiB) in %s\n", len(envs), float64(total)/(1<<20), float64(o.cacheSize)/(1<<20), o.cacheDir)
	return nil
}
