package cli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/pysandbox/pysandbox/internal/audit"
	"github.com/pysandbox/pysandbox/internal/sharedstate"
)

const auditUsage = "usage: pysandbox audit verify [--from-seq N] [--head HASH] [--store URL --replica-token-file FILE] FILE... | pysandbox audit tail [-n N] [-f] [--json] FILE"

// auditCmd verifies or shows an audit log.
func auditCmd(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError{fmt.Errorf("%s", auditUsage)}
	}
	if isHelp(args[0]) {
		fmt.Fprintf(stderr, "Usage: pysandbox audit verify [flags] FILE...   check an audit log's hash chain\n"+
			"       pysandbox audit tail [flags] FILE        show its last records\n\n"+
			"Run 'pysandbox audit verify -h' or 'pysandbox audit tail -h' for the flags.\n")
		return flag.ErrHelp
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

const auditVerifySynopsis = `audit verify [--from-seq N] [--head HASH] FILE...
       pysandbox audit verify --store URL --replica-token-file FILE [--from-seq N] CHAIN...

Checks every record's hash and the chain between them; with one FILE,
its rotated predecessors FILE.1, FILE.2, ... too. The chain must start
at seq 1 (or, with --from-seq, where its older files were removed on
purpose) and, with --head, hold the head kept elsewhere (the server logs
it when it stops). With --store (several replicas), each CHAIN is one
replica's chain, checked against the head that replica anchored, signed,
in the store; a chain cut short, rewritten or missing, or an anchor
forged or deleted, fails.`

// auditVerify checks the hash chain. One FILE means the whole chain that
// ends in it, rotated files included; several mean exactly those, in order.
// With --store, each FILE is the chain of one replica, checked against the
// anchor its replica wrote in the shared store, and every anchored
// replica's chain must be among them.
func auditVerify(args []string, stdout, stderr io.Writer) error {
	fs := auditFlagSet("audit verify", auditVerifySynopsis, stderr)
	storeURL := fs.String("store", "", "the replicas' shared store (redis://...; or $PYSANDBOX_STORE_URL): check each FILE's chain against its replica's anchor")
	namespace := fs.String("store-namespace", "pysandbox", "with --store: the deployment's namespace in it")
	tokenFile := fs.String("replica-token-file", "", "with --store: the replicas' token (serve's --replica-token-file), which signs the anchors")
	fromSeq := fs.Int64("from-seq", 0, "let the chain start at this seq (or before) instead of seq 1: the records before it were removed on purpose (rotated files past their retention)")
	head := fs.String("head", "", "the SHA-256 head kept elsewhere (the server logs head_sha256 when it stops): the chain must hold that record")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	paths := fs.Args()
	if len(paths) == 0 {
		return usageError{fmt.Errorf("audit verify takes at least one FILE\n%s", shortUsage("audit verify"))}
	}
	if *fromSeq < 0 {
		return usageError{fmt.Errorf("audit verify: --from-seq %d: want a seq, 1 or more", *fromSeq)}
	}
	exp := audit.Expect{FromSeq: *fromSeq, Head: strings.ToLower(*head)}
	if exp.Head != "" && !isSHA256Hex(exp.Head) {
		return usageError{fmt.Errorf("audit verify: --head %q: want the 64 hex digits of a SHA-256 (head_sha256 in the server's log)", *head)}
	}
	url := *storeURL
	if url == "" {
		url = os.Getenv("PYSANDBOX_STORE_URL")
	}
	if url != "" {
		if exp.Head != "" {
			return usageError{errors.New("audit verify: --head checks one chain; with --store each chain is checked against its replica's anchor")}
		}
		if *tokenFile == "" {
			return usageError{errors.New("audit verify: --store needs --replica-token-file: the anchors are signed with the replicas' token, and an anchor that cannot be checked proves nothing")}
		}
		token, err := readSecretFile(*tokenFile, "--replica-token-file")
		if err != nil {
			return err
		}
		return auditVerifyAnchored(url, *namespace, []byte(token), exp.FromSeq, paths, stdout)
	}
	if *tokenFile != "" {
		return usageError{errors.New("audit verify: --replica-token-file goes with --store")}
	}
	if len(paths) == 1 {
		files, err := chainFiles(paths[0])
		if err != nil {
			return err
		}
		paths = files
	}
	rep, err := audit.Check(paths, exp)
	if err != nil {
		return fmt.Errorf("audit verify: %w%s", err, fromSeqHint(err))
	}
	printReport(stdout, "", rep)
	if exp.Head != "" {
		printExpected(stdout, "", rep, "the expected head")
	}
	return nil
}

func isSHA256Hex(s string) bool {
	b, err := hex.DecodeString(s)
	return err == nil && len(b) == sha256.Size
}

// fromSeqHint tells how to pass a chain whose first records were removed
// on purpose: the only cut the user can allow.
func fromSeqHint(err error) string {
	var ve *audit.VerifyError
	if !errors.Is(err, audit.ErrFrontCut) || !errors.As(err, &ve) || ve.Seq < 2 {
		return ""
	}
	return fmt.Sprintf("; if the records before seq %d were removed on purpose (rotated files past their retention), pass --from-seq %d", ve.Seq, ve.Seq)
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
		fmt.Fprintf(stdout, "%snote: the chain starts at seq %d, as --from-seq allows; the records before it were not checked\n", prefix, rep.FirstSeq)
	}
}

// printExpected says where the expected head (what) was found.
func printExpected(stdout io.Writer, prefix string, rep *audit.Report, what string) {
	switch {
	case rep.ExpectedAt == 0:
		fmt.Fprintf(stdout, "%snote: %s is in the records before seq %d, which were not checked\n", prefix, what, rep.FirstSeq)
	case rep.ExpectedAt == rep.LastSeq:
		fmt.Fprintf(stdout, "%s%s matches (seq %d, the last record)\n", prefix, what, rep.ExpectedAt)
	default:
		fmt.Fprintf(stdout, "%s%s matches (seq %d; %d records were written after it)\n", prefix, what, rep.ExpectedAt, rep.LastSeq-rep.ExpectedAt)
	}
}

// auditVerifyAnchored checks each replica's chain against its anchor, and
// that the anchors themselves hold: signed with the replicas' token, none
// deleted (the others name it), none without its chain.
func auditVerifyAnchored(url, namespace string, key []byte, fromSeq int64, chains []string, stdout io.Writer) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := sharedstate.Open(ctx, url, sharedstate.Options{Namespace: namespace})
	if err != nil {
		return fmt.Errorf("audit verify: %w", err)
	}
	defer st.Close()
	st.UseReplicaKey(key)
	anchors, bad, err := st.Anchors(ctx)
	if err != nil {
		return fmt.Errorf("audit verify: read the anchors: %w", err)
	}
	var problems []string
	// expected are the replicas whose chain must be given: every one
	// with an entry, good or bad, and every one a good anchor names.
	expected := map[string]string{}
	for _, b := range bad {
		problems = append(problems, b.Error()+"; it cannot be relied on")
		expected[b.Replica] = "its entry is not a valid anchor"
	}
	for name, a := range anchors {
		expected[name] = fmt.Sprintf("anchored at seq %d", a.Seq)
	}
	namedBy := map[string][]string{}
	for name, a := range anchors {
		for _, n := range a.Replicas {
			if _, ok := expected[n]; !ok {
				namedBy[n] = append(namedBy[n], name)
			}
		}
	}
	for _, n := range slices.Sorted(maps.Keys(namedBy)) {
		by := namedBy[n]
		slices.Sort(by)
		problems = append(problems, fmt.Sprintf("replica %s has no anchor in the store, but the anchors of %s name it: its anchor was deleted", n, strings.Join(by, ", ")))
		expected[n] = "its anchor deleted"
	}
	seen := map[string]bool{}
	passed := 0
	for _, chain := range chains {
		name, problem := verifyReplicaChain(chain, anchors, fromSeq, seen, stdout)
		if name != "" {
			seen[name] = true
		}
		if problem != "" {
			problems = append(problems, problem)
		} else {
			passed++
		}
	}
	for _, name := range slices.Sorted(maps.Keys(expected)) {
		if !seen[name] {
			problems = append(problems, fmt.Sprintf("no chain was given for %s (%s)", name, expected[name]))
		}
	}
	switch len(problems) {
	case 0:
		fmt.Fprintf(stdout, "ok: %d chains match their anchors\n", passed)
		return nil
	case 1:
		return fmt.Errorf("audit verify: %s", problems[0])
	}
	return fmt.Errorf("audit verify: %d problems:\n  %s", len(problems), strings.Join(problems, "\n  "))
}

// verifyReplicaChain checks one replica's chain against its anchor,
// printing what passed; it returns the replica's name (once known) and
// what is wrong, if anything.
func verifyReplicaChain(chain string, anchors map[string]audit.Anchor, fromSeq int64, seen map[string]bool, stdout io.Writer) (name, problem string) {
	files, err := chainFiles(chain)
	if err != nil {
		return "", err.Error()
	}
	// The replica is the one the first start record names; the anchor
	// to check against depends on it.
	err = audit.Read(files, func(r *audit.Record, _ string) bool {
		if r.Event == audit.EventStart && r.Detail["replica"] != "" {
			name = r.Detail["replica"]
		}
		return name == ""
	})
	if err != nil {
		return "", err.Error()
	}
	if name == "" {
		// Its start records cut away, perhaps: say so rather than only
		// that its replica is unknown.
		if _, err := audit.Check(files, audit.Expect{FromSeq: fromSeq}); err != nil {
			return "", fmt.Sprintf("%v%s", err, fromSeqHint(err))
		}
		return "", fmt.Sprintf("%s: no start record names the replica whose chain it is", chain)
	}
	if seen[name] {
		return name, fmt.Sprintf("%s: a second chain of replica %s", chain, name)
	}
	a, ok := anchors[name]
	if !ok {
		return name, fmt.Sprintf("%s: replica %s has no valid anchor in the store, so its chain cannot be checked against one", chain, name)
	}
	exp := a.Expect()
	exp.FromSeq = fromSeq
	rep, err := audit.Check(files, exp)
	if err != nil {
		return name, fmt.Sprintf("%s (replica %s, anchored at seq %d): %v%s", chain, name, a.Seq, err, fromSeqHint(err))
	}
	if len(rep.Replicas) != 1 {
		return name, fmt.Sprintf("%s: want the chain of one replica, and its start records name %d (%v)", chain, len(rep.Replicas), rep.Replicas)
	}
	printReport(stdout, name+": ", rep)
	printExpected(stdout, name+": ", rep, "the anchored head")
	return name, ""
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
		return usageError{fmt.Errorf("audit tail takes one FILE\n%s", shortUsage("audit tail"))}
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
