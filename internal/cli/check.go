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
	// serve's flag set, so that a server's command line can be passed as
	// it is; only the engine's flags (the ones listed) change the check.
	fs, cfg := newServeFlags(stderr)
	fs.Init("check", fs.ErrorHandling()) // its errors name check
	o := cfg.options
	const about = "print the posture as JSON (the same data as the check_environment tool)"
	asJSON := fs.Bool("json", false, about)
	fs.Usage = func() {
		shown, _ := newFlagSet("check", "", stderr)
		shown.Bool("json", false, about)
		fmt.Fprint(stderr, "Usage: pysandbox check [--json] [flags]\n\nBuilds the sandbox a server with these flags would (its pool, limits, dependencies and Pythons), tries it, and prints what it enforces.\n\nFlags:\n")
		shown.PrintDefaults()
		fmt.Fprint(stderr, "\nThe other flags of 'pysandbox serve -h' are accepted too, so a server's flags can be passed as they are; only --policy changes the check: it is read as serve reads it, and its network, package and Python rules are what the sandbox is built with.\n")
	}
	if err := parseFlags(fs, args); err != nil {
		return false, err
	}
	log, err := o.logger(stderr)
	if err != nil {
		return false, err
	}
	// A policy's network, package and Python rules change what the
	// sandbox enforces: read it as serve does (a policy serve would
	// refuse fails the check), and build the engine with its rules.
	if cfg.Policy != "" {
		s := &server{cfg: cfg, o: *o, stderr: stderr, log: log}
		for _, load := range []func() error{s.loadProfiles, s.loadUpstreams, s.loadPolicy} {
			if err := load(); err != nil {
				return false, err
			}
		}
		logPolicy(log, s.pol, s.toolNames)
		o = &s.o
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
