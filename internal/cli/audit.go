package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/pysandbox/pysandbox/internal/audit"
	"github.com/pysandbox/pysandbox/internal/sharedstate"
)

const auditUsage = "usage: pysandbox audit verify [--store URL] FILE... | pysandbox audit tail [-n N] [-f] [--json] FILE"

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
// With --store, each FILE is the chain of one replica, checked against the
// anchor its replica wrote in the shared store, and every anchored
// replica's chain must be among them.
func auditVerify(args []string, stdout, stderr io.Writer) error {
	fs := auditFlagSet("audit verify", "audit verify [--store URL] FILE...\n\nChecks every record's hash and the chain between them; with one FILE,\nits rotated predecessors FILE.1, FILE.2, ... too. With --store (several\nreplicas), each FILE is one replica's chain, checked against the head\nthat replica anchored in the store; a chain cut short, rewritten or\nmissing fails.", stderr)
	storeURL := fs.String("store", "", "the replicas' shared store (redis://...; or $PYSANDBOX_STORE_URL): check each FILE's chain against its replica's anchor")
	namespace := fs.String("store-namespace", "pysandbox", "with --store: the deployment's namespace in it")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	paths := fs.Args()
	if len(paths) == 0 {
		fs.Usage()
		return usageError{fmt.Errorf("audit verify takes at least one FILE")}
	}
	url := *storeURL
	if url == "" {
		url = os.Getenv("PYSANDBOX_STORE_URL")
	}
	if url != "" {
		return auditVerifyAnchored(url, *namespace, paths, stdout)
	}
	if len(paths) == 1 {
		files, err := chainFiles(paths[0])
		if err != nil {
			return err
		}
		paths = files
	}
	rep, err := audit.Verify(paths)
	if err != nil {
		return fmt.Errorf("audit verify: %w", err)
	}
	printReport(stdout, "", rep)
	return nil
}

func chainFiles(path string) ([]string, error) {
	files, err := audit.Files(path)
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("audit verify: %s: no such file, and no rotated files %s.N", path, path)
	}
	return files, nil
}

func printReport(stdout io.Writer, prefix string, rep *audit.Report) {
	files := "files"
	if rep.Files == 1 {
		files = "file"
	}
	if rep.Records == 0 {
		fmt.Fprintf(stdout, "%sok: 0 records in %d %s\n", prefix, rep.Files, files)
		return
	}
	fmt.Fprintf(stdout, "%sok: %d records (seq %d..%d) in %d %s, head sha256 %s\n", prefix, rep.Records, rep.FirstSeq, rep.LastSeq, rep.Files, files, rep.Head)
	if rep.FirstSeq > 1 {
		fmt.Fprintf(stdout, "%snote: the chain starts at seq %d; the records before it are in files not checked (removed, or not given)\n", prefix, rep.FirstSeq)
	}
}

// auditVerifyAnchored checks each replica's chain against its anchor.
func auditVerifyAnchored(url, namespace string, chains []string, stdout io.Writer) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := sharedstate.Open(ctx, url, sharedstate.Options{Namespace: namespace})
	if err != nil {
		return fmt.Errorf("audit verify: %w", err)
	}
	defer st.Close()
	anchors, err := st.Anchors(ctx)
	if err != nil {
		return fmt.Errorf("audit verify: read the anchors: %w", err)
	}
	seen := map[string]bool{}
	for _, chain := range chains {
		files, err := chainFiles(chain)
		if err != nil {
			return err
		}
		rep, err := audit.Verify(files)
		if err != nil {
			return fmt.Errorf("audit verify: %w", err)
		}
		if len(rep.Replicas) != 1 {
			return fmt.Errorf("audit verify: %s: want the chain of one replica, and its start records name %d (%v)", chain, len(rep.Replicas), rep.Replicas)
		}
		name := rep.Replicas[0]
		if seen[name] {
			return fmt.Errorf("audit verify: %s: a second chain of replica %s", chain, name)
		}
		seen[name] = true
		a, ok := anchors[name]
		if !ok {
			return fmt.Errorf("audit verify: %s: replica %s anchored no head in the store", chain, name)
		}
		if err := audit.CheckAnchor(files, rep, a); err != nil {
			return fmt.Errorf("audit verify: %s (replica %s): %w", chain, name, err)
		}
		printReport(stdout, name+": ", rep)
		fmt.Fprintf(stdout, "%s: anchored seq %d matches\n", name, a.Seq)
	}
	var missing []string
	for name, a := range anchors {
		if !seen[name] {
			missing = append(missing, fmt.Sprintf("%s (anchored at seq %d)", name, a.Seq))
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return fmt.Errorf("audit verify: no chain was given for %s", strings.Join(missing, ", "))
	}
	fmt.Fprintf(stdout, "ok: %d chains match their anchors\n", len(chains))
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
