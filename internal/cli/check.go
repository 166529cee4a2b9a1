package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/pysandbox/pysandbox/internal/interp"
	"github.com/pysandbox/pysandbox/internal/tools"
)

// check prints the measured posture and reports whether the backend works.
func check(args []string, stdout, stderr io.Writer) (bool, error) {
	fs, o := newFlagSet("check", "check [--json] [flags]", stderr)
	asJSON := fs.Bool("json", false, "print the posture as JSON (the same data as the check_environment tool)")
	// check builds the engine serve would, so every engine flag changes
	// what it reports; the usage says why they are all listed.
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: pysandbox check [--json] [flags]\n\nBuilds the sandbox a server with these flags would (its pool, limits, dependencies and Pythons), tries it, and prints what it enforces: pass the flags you serve with.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return false, err
	}
	log, err := o.logger(stderr)
	if err != nil {
		return false, err
	}
	ctx := context.Background()
	eng, release, err := o.engine(ctx, log)
	if err != nil {
		return false, err
	}
	defer release()
	p := eng.Measure(ctx, interp.Discover(ctx))
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(p); err != nil {
			return false, err
		}
	} else {
		fmt.Fprint(stdout, tools.PostureText(p))
	}
	return p.Usable(), nil
}
