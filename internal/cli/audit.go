package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/pysandbox/pysandbox/internal/audit"
)

const auditUsage = "usage: pysandbox audit verify FILE... | pysandbox audit tail [-n N] [-f] [--json] FILE"

// auditCmd verifies or shows an audit log.
func auditCmd(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError{fmt.Errorf("%s", auditUsage)}
	}
	switch args[0] {
	case "verify":
		return auditVerify(args[1:], stdout, stderr)
	case "tail":
		return auditTail(args[1:], stdout, stderr)
	}
	return usageError{fmt.Errorf("audit: unknown subcommand %q; %s", args[0], auditUsage)}
}

// auditFlagSet is a plain flag set: the sandbox flags of newFlagSet mean
// nothing to a log reader.
func auditFlagSet(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: pysandbox %s\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// auditVerify checks the hash chain. One FILE means the whole chain that
// ends in it, rotated files included; several mean exactly those, in order.
func auditVerify(args []string, stdout, stderr io.Writer) error {
	fs := auditFlagSet("audit verify", "audit verify FILE...\n\nChecks every record's hash and the chain between them; with one FILE,\nits rotated predecessors FILE.1, FILE.2, ... too.", stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	paths := fs.Args()
	if len(paths) == 0 {
		fs.Usage()
		return usageError{fmt.Errorf("audit verify takes at least one FILE")}
	}
	if len(paths) == 1 {
		files, err := audit.Files(paths[0])
		if err != nil {
			return err
		}
		if len(files) == 0 {
			return fmt.Errorf("audit verify: %s: no such file, and no rotated files %s.N", paths[0], paths[0])
		}
		paths = files
	}
	rep, err := audit.Verify(paths)
	if err != nil {
		return fmt.Errorf("audit verify: %w", err)
	}
	files := "files"
	if rep.Files == 1 {
		files = "file"
	}
	if rep.Records == 0 {
		fmt.Fprintf(stdout, "ok: 0 records in %d %s\n", rep.Files, files)
		return nil
	}
	fmt.Fprintf(stdout, "ok: %d records (seq %d..%d) in %d %s, head sha256 %s\n", rep.Records, rep.FirstSeq, rep.LastSeq, rep.Files, files, rep.Head)
	if rep.FirstSeq > 1 {
		fmt.Fprintf(stdout, "note: the chain starts at seq %d; the records before it are in files not checked (removed, or not given)\n", rep.FirstSeq)
	}
	return nil
}

// auditTail shows the last records, and with -f the ones that follow.
func auditTail(args []string, stdout, stderr io.Writer) error {
	fs := auditFlagSet("audit tail", "audit tail [-n N] [-f] [--json] FILE", stderr)
	n := fs.Int("n", 20, "number of records to show")
	follow := fs.Bool("f", false, "keep showing records as they are appended, across rotations, until interrupted")
	asJSON := fs.Bool("json", false, "print the JSON lines instead of a summary (non-printing characters \\u-escaped: verify the file, not this output)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return usageError{fmt.Errorf("audit tail takes one FILE")}
	}
	if *n < 0 {
		return usageError{fmt.Errorf("audit tail: -n %d: want 0 or more", *n)}
	}
	path := fs.Arg(0)
	show := func(line []byte) error {
		var err error
		if *asJSON {
			_, err = fmt.Fprintln(stdout, audit.FormatJSON(line))
		} else {
			_, err = fmt.Fprintln(stdout, audit.Format(line))
		}
		return err
	}
	if *follow {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		return audit.Follow(ctx, path, *n, show)
	}
	files, err := audit.Files(path)
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return fmt.Errorf("audit tail: %s: no such file", path)
	}
	lines, err := audit.Last(files, *n)
	if err != nil {
		return err
	}
	for _, l := range lines {
		if err := show(l); err != nil {
			return err
		}
	}
	return nil
}
