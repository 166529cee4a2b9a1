//go:build !linux

// Command pysandbox, on macOS and Windows: the sandbox needs Linux, so
// `serve` runs the Linux server in pysandbox's OCI image under a
// container runtime (Podman or Docker: internal/launcher), with stdio
// passed through. `setup` writes the client entry that runs it, and
// `version` says what this is.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/pysandbox/pysandbox/internal/launcher"
)

// version, commit and buildDate are set by scripts/release.sh with
// -ldflags -X, as internal/cli's are on Linux.
var (
	version   = "0.1.0"
	commit    = ""
	buildDate = ""
)

const usage = `pysandbox: run Python from AI agents in a fresh, layered Linux sandbox.

On this system (%s) the sandbox runs in a Linux container: serve starts
pysandbox's OCI image under Podman or Docker (whichever is on PATH, podman
first), loading the image archive next to this binary (%s) the first time.

Usage:
  pysandbox serve [--container RUNTIME] [--image IMAGE] [SERVE FLAGS]
                                          MCP server over stdio, in the container
  pysandbox setup CLIENT [--write] [-- SERVE FLAGS]
                                          print (or merge) the config entry for claude-code, claude-desktop,
                                          cursor, vscode, codex or gemini
  pysandbox version                       version, commit and build date

The serve flags are the Linux server's (see docs/commands.md); the files they
name are mounted into the container. Run 'pysandbox COMMAND -h' for more.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintf(stderr, usage, runtime.GOOS, launcher.ArchiveName)
		return 2
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "serve":
		return serve(rest, stderr)
	case "setup":
		if err := setupCmd(rest, stdout, stderr); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			fmt.Fprintf(stderr, "pysandbox: %v\n", err)
			return 2
		}
		return 0
	case "version", "--version":
		fmt.Fprint(stdout, versionText())
		return 0
	case "help", "-h", "-help", "--help":
		fmt.Fprintf(stdout, usage, runtime.GOOS, launcher.ArchiveName)
		return 0
	case "run", "check", "bench", "cache", "audit":
		fmt.Fprintf(stderr, "pysandbox: %s needs Linux; on %s, serve runs the server in a container (or run the image: docs/commands.md)\n", cmd, runtime.GOOS)
		return 2
	}
	fmt.Fprintf(stderr, "pysandbox: unknown command %q\n\n"+usage, cmd, runtime.GOOS, launcher.ArchiveName)
	return 2
}

func serve(args []string, stderr io.Writer) int {
	rt, image, rest, err := launcher.SplitArgs(args)
	if err != nil {
		fmt.Fprintf(stderr, "pysandbox serve: %v\n", err)
		return 2
	}
	for _, a := range rest {
		if a == "-h" || a == "-help" || a == "--help" {
			fmt.Fprintf(stderr, "Usage: pysandbox serve [--container RUNTIME] [--image IMAGE] [SERVE FLAGS]\n\n"+
				"Runs the Linux server in a container: --container podman|docker|PATH (default: podman, else docker, on PATH),\n"+
				"--image (default pysandbox:%s, loaded from %s next to this binary when missing).\n"+
				"The serve flags are the Linux server's (docs/commands.md); files they name are mounted into the container.\n", version, launcher.ArchiveName)
			return 0
		}
	}
	code, err := launcher.Run(context.Background(), launcher.Config{Runtime: rt, Image: image, DefaultImage: "pysandbox:" + version, ServeArgs: rest})
	if err != nil {
		fmt.Fprintf(stderr, "pysandbox serve: %v\n", err)
		return 2
	}
	return code
}

// absArgs is args with the value of every file flag absolute.
func absArgs(args []string) ([]string, error) {
	out := append([]string(nil), args...)
	for i := 0; i < len(out); i++ {
		a := out[i]
		if a == "--" || len(a) < 2 || a[0] != '-' {
			break
		}
		dashes := "-"
		if strings.HasPrefix(a, "--") {
			dashes = "--"
		}
		name, value, inline := strings.Cut(a[len(dashes):], "=")
		if launcher.BoolFlags[name] {
			continue
		}
		at := i
		if !inline {
			if i+1 >= len(out) {
				break
			}
			i++
			at, value = i, out[i]
		}
		_, ok := launcher.FileFlags[name]
		if !ok || value == "" || filepath.IsAbs(value) || strings.Contains(value, "://") || (name == "python" || name == "python-version") {
			continue
		}
		abs, err := filepath.Abs(value)
		if err != nil {
			return nil, fmt.Errorf("setup: %s %s: %w", dashes+name, value, err)
		}
		if inline {
			out[at] = dashes + name + "=" + abs
		} else {
			out[at] = abs
		}
	}
	return out, nil
}

// toolTimeout is the client's tool-call timeout: --max-timeout plus
// --install-timeout (5m each by default) plus 30s, as on Linux.
func toolTimeout(args []string) time.Duration {
	d := map[string]time.Duration{"max-timeout": 5 * time.Minute, "install-timeout": 5 * time.Minute}
	for i := 0; i < len(args); i++ {
		name, value, inline := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		if _, ok := d[name]; !ok {
			continue
		}
		if !inline && i+1 < len(args) {
			i++
			value = args[i]
		}
		if n, err := strconv.ParseFloat(value, 64); err == nil {
			d[name] = time.Duration(n * float64(time.Second))
		} else if v, err := time.ParseDuration(value); err == nil {
			d[name] = v
		}
	}
	return d["max-timeout"] + d["install-timeout"] + 30*time.Second
}

// versionText is `pysandbox version`, as internal/cli's on Linux.
func versionText() string {
	c, date, dirty := commit, buildDate, false
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if c == "" {
					c = s.Value
				}
			case "vcs.time":
				if date == "" {
					date = s.Value + " (commit time)"
				}
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	if c == "" {
		c = "unknown"
	} else if dirty && !strings.HasSuffix(c, "+dirty") {
		c += "+dirty"
	}
	if date == "" {
		date = "unknown"
	}
	return fmt.Sprintf("pysandbox %s (the Linux server runs in a container here)\ncommit: %s\nbuilt: %s\ngo: %s %s/%s\n", version, c, date, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
