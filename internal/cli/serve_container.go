package cli

import (
	"context"
	"io"
	"os"

	"github.com/pysandbox/pysandbox/internal/launcher"
)

// serveInContainer is serve --container RUNTIME: the same server, run in
// pysandbox's image under RUNTIME by the launcher (what serve is on macOS
// and Windows), with args (checked by Validate here first) passed on.
func serveInContainer(cfg *ServeConfig, args []string, stderr io.Writer) error {
	_, _, rest, err := launcher.SplitArgs(args)
	if err != nil {
		return usageError{err}
	}
	code, err := launcher.Run(context.Background(), launcher.Config{
		Runtime: cfg.Container, Image: cfg.Image, DefaultImage: "pysandbox:" + version,
		ServeArgs: rest, Stderr: stderr,
	})
	if err != nil {
		return err
	}
	if code != 0 {
		os.Exit(code)
	}
	return nil
}
