package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/pysandbox/pysandbox/internal/deps"
	"github.com/pysandbox/pysandbox/internal/egress"
	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/tools"
)

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	fs, o := newFlagSet("run", "run [flags] FILE|- [ARG...]", stderr)
	// The run's own stderr comes through ours: the server's notes stay
	// out of it unless asked for.
	fs.Lookup("log-level").DefValue = "warn"
	o.logLevel = "warn"
	// One run gains nothing from a pool (see below): the usage says what
	// run does without the flag, not what serve does.
	pf := fs.Lookup("pool-size")
	pf.DefValue = "0"
	pf.Usage += "; run starts none unless this is given"
	if err := parseFlags(fs, args); err != nil {
		return 0, err
	}
	if fs.NArg() < 1 {
		return 0, usageError{fmt.Errorf("run takes a FILE (or - for stdin)\n%s", shortUsage("run"))}
	}
	name := fs.Arg(0)
	for i, a := range fs.Args()[1:] {
		// Go's flag package stops at FILE, so a flag of run's written
		// after it goes to the script: say so, in case it was meant for
		// run.
		f := strings.TrimLeft(a, "-")
		fl := fs.Lookup(strings.SplitN(f, "=", 2)[0])
		if a == f || fl == nil {
			continue
		}
		given := a
		if b, ok := fl.Value.(interface{ IsBoolFlag() bool }); !strings.Contains(f, "=") && !(ok && b.IsBoolFlag()) && i+2 < fs.NArg() {
			given += " " + fs.Arg(i+2) // its value
		}
		fmt.Fprintf(stderr, "pysandbox: %s follows FILE, so it is the script's (in sys.argv), not run's; run's flags go before FILE: pysandbox run %s %s\n", given, given, name)
		break
	}
	var src io.Reader = stdin
	filename := "<stdin>"
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return 0, err
		}
		defer f.Close()
		src, filename = f, filepath.Base(name)
	}
	code, err := io.ReadAll(io.LimitReader(src, tools.MaxCodeBytes+1))
	if err != nil {
		return 0, err
	}
	if len(code) > tools.MaxCodeBytes {
		return 0, fmt.Errorf("%s is larger than %d bytes", name, tools.MaxCodeBytes)
	}
	// One run gains nothing from a warm pool (its zygote costs more than a
	// cold sandbox), so run starts without one unless asked.
	poolSet := false
	fs.Visit(func(f *flag.Flag) { poolSet = poolSet || f.Name == "pool-size" })
	if !poolSet {
		o.poolSize = 0
	}
	log, err := o.logger(stderr)
	if err != nil {
		return 0, err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	eng, release, err := o.engine(ctx, log)
	if err != nil {
		return 0, err
	}
	defer release()
	if o.sandbox == "none" {
		fmt.Fprintln(stderr, "pysandbox: WARNING: --sandbox none: running UNSANDBOXED on this machine")
	}
	// What follows FILE is the script's, in its sys.argv, as with python
	// itself: flags for run go before FILE.
	req := engine.RunRequest{Code: string(code), Filename: filename, Args: fs.Args()[1:], Stdout: stdout, Stderr: stderr}
	if eng.Config().Network {
		req.Network = func(l net.Listener) func() {
			g := o.proxy.NewGrant(egress.GrantConfig{Info: egress.Info{Identity: "cli", Tool: "run"}})
			g.Serve(l)
			return g.Close
		}
	}
	res, err := eng.Run(ctx, req)
	if err != nil {
		return 0, err
	}
	// The output went to the terminal whole, as it came: a run that
	// completed is not cut short by what the server keeps of it.
	if res.Completed() || res.Status == engine.StatusError {
		return res.ExitCode, nil
	}
	fmt.Fprintf(stderr, "pysandbox: %s: %s\n", res.Status, o.runMessage(res))
	switch res.Status {
	case engine.StatusTimeout:
		return 124, nil // as timeout(1)
	case engine.StatusCancelled:
		return 130, nil
	}
	if res.ExitCode > 0 {
		return res.ExitCode, nil
	}
	return 1, nil
}

// runMessage is how a run ended, told in the command line's terms: the
// engine's messages name the MCP arguments (timeout_seconds), which a
// user of run sets with flags.
func (o *options) runMessage(res *engine.Result) string {
	switch res.Status {
	case engine.StatusTimeout:
		hint := fmt.Sprintf("pass a larger --timeout (at most --max-timeout, %s)", o.maxTimeout.String())
		if o.timeout >= o.maxTimeout {
			hint = "pass a larger --timeout, and --max-timeout with it"
		}
		return fmt.Sprintf("the run exceeded its %s timeout (--timeout) and every process it started was killed; make the code faster or %s", o.timeout.String(), hint)
	case engine.StatusMemoryLimit:
		return fmt.Sprintf("the run exceeded the %s memory limit (--memory); use less memory (process data in chunks), or pass a larger --memory", o.memory.String())
	case engine.StatusInstallError:
		// The user of run is the operator the agent's advice sends to.
		return strings.ReplaceAll(res.Message, deps.UnreachableAdvice, "This machine cannot reach the package index. Give run one it can reach: --index-url, or --find-links with a wheel directory (--no-index to work offline); or use packages the host's Python already has, which need no install.")
	}
	return strings.ReplaceAll(res.Message, "timeout_seconds", "--timeout")
}
