package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/pysandbox/pysandbox/internal/launcher"
)

// setupCmd, on Windows, prints the mcpServers entry that runs this
// binary's serve (the launcher) for the client's config file; it does not
// write it (internal/setup's safe file replacement is Unix-only so far).
func setupCmd(args []string, stdout, stderr io.Writer) error {
	var serveFlags []string
	for i, a := range args {
		if a == "--" {
			args, serveFlags = args[:i], args[i+1:]
			break
		}
	}
	for _, a := range args {
		if strings.HasPrefix(a, "-") && strings.TrimLeft(a, "-") != "name" {
			if a == "-h" || a == "--help" || a == "-help" {
				fmt.Fprint(stderr, "Usage: pysandbox setup CLIENT [-- SERVE FLAGS...]\n\nOn Windows it prints the entry to paste into the client's config file (--write is not supported here yet).\n")
				return nil
			}
			return errors.New("setup: on Windows only the entry is printed (no --write, --file, --name yet): paste it into the client's config file")
		}
	}
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
	bin, err := os.Executable()
	if err != nil {
		return err
	}
	if bin, err = filepath.Abs(bin); err != nil {
		return err
	}
	entry := map[string]any{"mcpServers": map[string]any{"pysandbox": map[string]any{"command": bin, "args": append([]string{"serve"}, abs...)}}}
	data, _ := json.MarshalIndent(entry, "", "  ")
	fmt.Fprintf(stdout, "Add this to the client's config file (Claude Desktop: %%APPDATA%%\\Claude\\claude_desktop_config.json; Cursor: %%USERPROFILE%%\\.cursor\\mcp.json):\n\n%s\n", data)
	return nil
}
