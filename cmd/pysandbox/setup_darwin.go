//go:build darwin

package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/pysandbox/pysandbox/internal/launcher"
	"github.com/pysandbox/pysandbox/internal/setup"
)

// setupCmd is `pysandbox setup CLIENT [--write] [-- SERVE FLAGS]`: the
// entry runs this binary's serve, which here is the launcher.
func setupCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("setup", flag.ContinueOnError)
	fs.SetOutput(stderr)
	write := fs.Bool("write", false, "merge the entry into the client's config file (keeping every other entry, with a backup FILE.bak) instead of only printing it")
	name := fs.String("name", "pysandbox", "the server's name in the client")
	file := fs.String("file", "", "the config file to write (default: the client's documented user-level file)")
	binary := fs.String("binary", "", "the pysandbox binary the client runs (default: this one, by absolute path)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: pysandbox setup CLIENT [--write] [--name NAME] [--file PATH] [-- SERVE FLAGS...]\n\nCLIENT is one of: %s.\n\nFlags:\n", strings.Join(setup.IDs(), ", "))
		fs.PrintDefaults()
	}
	var serveFlags []string
	for i, a := range args {
		if a == "--" {
			args, serveFlags = args[:i], args[i+1:]
			break
		}
	}
	var client string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		client, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if client == "" && fs.NArg() > 0 {
		client = fs.Arg(0)
	}
	c, ok := setup.Clients[client]
	if !ok {
		return fmt.Errorf("setup: name a client: %s", strings.Join(setup.IDs(), ", "))
	}
	// What the launcher would refuse is refused now; file flags become
	// absolute, since the client starts the server from its own directory.
	_, _, rest, err := launcher.SplitArgs(serveFlags)
	if err != nil {
		return fmt.Errorf("setup: the serve flags after --: %w", err)
	}
	if _, _, _, err := launcher.Translate(rest, runtime.GOOS); err != nil {
		return fmt.Errorf("setup: serve would refuse the flags after --: %w", err)
	}
	abs, err := absArgs(serveFlags)
	if err != nil {
		return err
	}
	bin := *binary
	if bin == "" {
		if bin, err = os.Executable(); err != nil {
			return fmt.Errorf("setup: where is this binary: %w", err)
		}
	}
	if bin, err = filepath.Abs(bin); err != nil {
		return err
	}
	e := setup.Entry{Name: *name, Command: bin, Args: append([]string{"serve"}, abs...), ToolTimeout: toolTimeout(serveFlags)}
	path := *file
	if path == "" {
		if path, err = c.DefaultPath(); err != nil {
			return err
		}
	}
	if !*write {
		fmt.Fprintf(stdout, "%s: add this to %s\n\n%s", c.Title, path, c.Snippet(e))
		if c.Command != nil {
			fmt.Fprintf(stdout, "\nor run:\n\n  %s\n", c.Command(e))
		}
		fmt.Fprintf(stdout, "\n(pysandbox setup %s --write does it for you.)\n", c.ID)
		return nil
	}
	r, err := c.Write(path, e)
	if err != nil {
		return err
	}
	switch {
	case !r.Changed:
		fmt.Fprintf(stdout, "%s: %s already has this entry; nothing changed.\n", c.Title, r.Path)
	case r.Backup != "":
		fmt.Fprintf(stdout, "%s: wrote the %q entry into %s (the old file is %s). Restart %s to use it.\n", c.Title, e.Name, r.Path, r.Backup, c.Title)
	default:
		fmt.Fprintf(stdout, "%s: created %s with the %q entry. Restart %s to use it.\n", c.Title, r.Path, e.Name, c.Title)
	}
	return nil
}
