// Package cli is the pysandbox command line: flag parsing and the
// subcommands, each a thin layer over the engine and the MCP tools.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/pysandbox/pysandbox/internal/egress"
	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/policy"
	"github.com/pysandbox/pysandbox/internal/pool"
	"github.com/pysandbox/pysandbox/internal/pydist"
	"github.com/pysandbox/pysandbox/internal/sandbox"
)

const usage = `pysandbox: run Python from AI agents in a fresh, layered Linux sandbox.

Usage:
  pysandbox serve [flags]                 MCP server over stdio
  pysandbox serve --http 127.0.0.1:8080   MCP over streamable HTTP at /mcp, /healthz, /metrics
  pysandbox serve --policy policy.json --audit-log audit.log
                                          govern the tools (allow, deny, approve, rate limits, packages)
                                          and record every call
  pysandbox run [flags] FILE|- [ARG...]   run a script in the sandbox (ARGs in its sys.argv), streaming its output
  pysandbox check [flags]                 print the sandbox posture; exit 1 if the backend cannot work here
  pysandbox bench [flags]                 measure latency against spawning python3 directly
  pysandbox cache ls|prune [flags]        list or prune the cached dependency environments and Pythons
  pysandbox python list|install|remove    the Python versions runs can use; download one (as uv does) or delete it
  pysandbox audit verify [--from-seq N] [--head HASH] [--store URL --replica-token-file F] FILE...
                                          check an audit log's hash chain, whole from seq 1; exit 1 naming the first bad line
  pysandbox audit tail [-n N] [-f] FILE   pretty-print the last records of an audit log
  pysandbox serve --tools mcp-run-python  serve another Python MCP server's tools (see docs/profiles.md)
  pysandbox setup CLIENT [--write] [-- SERVE FLAGS]
                                          print (or merge) the config entry for claude-code, claude-desktop,
                                          cursor, vscode, codex or gemini
  pysandbox version                       version, commit and build date

Run 'pysandbox COMMAND -h' for the flags of a command.
`

// Main runs the command line and returns the process exit code.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd, rest := args[0], args[1:]
	var err error
	switch cmd {
	case "serve":
		err = serve(rest, stderr)
	case "run":
		var code int
		code, err = run(rest, stdin, stdout, stderr)
		if err == nil {
			return code
		}
	case "check":
		var ok bool
		ok, err = check(rest, stdout, stderr)
		if err == nil && !ok {
			return 1
		}
	case "bench":
		err = benchCmd(rest, stdout, stderr)
	case "cache":
		err = cacheCmd(rest, stdout, stderr)
	case "python":
		err = pythonCmd(rest, stdout, stderr)
	case "audit":
		err = auditCmd(rest, stdout, stderr)
	case "setup":
		err = setupCmd(rest, stdout, stderr)
	case "version", "--version":
		if len(rest) > 0 && isHelp(rest[0]) {
			fmt.Fprint(stderr, "Usage: pysandbox version\n\nPrints the version, the commit and the build date.\n")
			return 0
		}
		fmt.Fprint(stdout, versionText())
		return 0
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "pysandbox: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	var fe flagError
	if errors.As(err, &fe) {
		return 2 // the flag package has already printed the error and usage
	}
	if err != nil {
		fmt.Fprintf(stderr, "pysandbox: %v\n", err)
		var ue usageError
		if errors.As(err, &ue) {
			return 2
		}
		return 1
	}
	return 0
}

type usageError struct{ error }

// flagError is a flag parsing failure, already reported by the flag package.
type flagError struct{ error }

// commands are the commands and subcommands, each with its synopsis:
// what a bad flag's short usage line shows, and what the help tests go
// through.
var commands = []struct{ name, synopsis string }{
	{"serve", "serve [flags]"},
	{"run", "run [flags] FILE|- [ARG...]"},
	{"check", "check [--json] [flags]"},
	{"bench", "bench [-n N] [--concurrency C] [--phases] [--network] [--tools] [--cache] [--python] [--sessions] [--replicas] [--cpuprofile FILE] [flags]"},
	{"cache", "cache ls|prune [flags]"},
	{"cache ls", "cache ls [flags]"},
	{"cache prune", "cache prune [--all] [--max-size SIZE] [flags]"},
	{"python", "python list|install|remove [flags]"},
	{"python list", "python list [flags]"},
	{"python install", "python install [flags] VERSION"},
	{"python remove", "python remove [flags] VERSION"},
	{"audit", "audit verify|tail [flags] FILE..."},
	{"audit verify", "audit verify [flags] FILE..."},
	{"audit tail", "audit tail [-n N] [-f] [--json] FILE"},
	{"setup", "setup CLIENT [--write] [flags] [-- SERVE FLAGS]"},
	{"version", "version"},
}

// isHelp is an argument that asks for a command's usage.
func isHelp(a string) bool { return a == "-h" || a == "-help" || a == "--help" }

// shortUsage is the one line a command line the flags refuse gets,
// instead of every flag: the synopsis, and how to list them.
func shortUsage(name string) string {
	synopsis := name + " [flags]"
	for _, c := range commands {
		if c.name == name {
			synopsis = c.synopsis
		}
	}
	return fmt.Sprintf("usage: pysandbox %s; pysandbox %s -h lists them", synopsis, name)
}

// parseFlags parses args, marking errors as already reported. -h prints
// the command's whole usage; a bad flag, the error and one usage line.
func parseFlags(fs *flag.FlagSet, args []string) error {
	out, usage := fs.Output(), fs.Usage
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	fs.SetOutput(out)
	fs.Usage = usage
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		fs.Usage()
		return err
	}
	fmt.Fprintf(out, "pysandbox %s: %v\n%s\n", fs.Name(), err, shortUsage(fs.Name()))
	return flagError{err}
}

// options are the flags every command shares.
type options struct {
	// checkPackage is the package policy (serve --policy); nil allows all.
	checkPackage func(name string, requested bool) error
	// checkPython is the Python version policy (serve --policy); nil
	// allows all.
	checkPython   func(version string) error
	sandbox       string
	python        string
	timeout       duration
	maxTimeout    duration
	memory        size
	maxOutput     size
	maxProcs      int64
	cpus          float64
	tmpSize       size
	maxConcurrent int
	maxQueue      int
	logLevel      string
	poolSize      int
	preload       string
	learnPreload  int
	poolMemory    size
	zygoteRuns    int64
	zygoteAge     duration
	// trace and onPool are for bench's phase breakdown (never flags).
	trace  func(*pool.Trace)
	onPool func(*pool.Pool)

	cacheDir       string
	cacheSize      size
	indexURL       string
	extraIndexURLs listFlag
	findLinks      listFlag
	noIndex        bool
	allowSdist     bool
	installTimeout duration

	// Managed interpreters (internal/pydist), in uv's terms; their
	// defaults are uv's environment variables.
	pyDownloads, pyMetadata, pyMirror, pyPreference string
	// onPython receives every install and removal (serve: the audit log).
	onPython func(pydist.Event)

	// allowNet are --allow-net's hosts; netRules, when set (serve with a
	// policy that has a network section), replaces them. proxy is built
	// by engine.
	allowNet  listFlag
	flagRules *policy.NetworkRules
	netRules  func() *policy.NetworkRules
	proxy     *egress.Proxy
}

// networkRules are the network rules in force now.
func (o *options) networkRules() *policy.NetworkRules {
	if o.netRules != nil {
		return o.netRules()
	}
	return o.flagRules
}

// listFlag is a flag that may be given more than once.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// defaultCacheDir is where dependency environments are cached. A root
// server uses the system's cache directory rather than root's home: the
// path of a mounted environment is visible inside a sandbox (in
// /proc/self/mountinfo), and a home directory would tell whose it is.
func defaultCacheDir() string {
	if os.Geteuid() == 0 {
		return "/var/cache/pysandbox"
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "pysandbox")
	}
	return filepath.Join(os.TempDir(), "pysandbox-cache")
}

func newFlagSet(name, synopsis string, stderr io.Writer) (*flag.FlagSet, *options) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &options{
		timeout:        duration(30 * time.Second),
		maxTimeout:     duration(300 * time.Second),
		memory:         512 << 20,
		maxOutput:      1 << 20,
		tmpSize:        256 << 20,
		poolMemory:     1 << 30,
		zygoteRuns:     1000,
		zygoteAge:      duration(30 * time.Minute),
		cacheSize:      2 << 30,
		installTimeout: duration(5 * time.Minute),
	}
	fs.StringVar(&o.sandbox, "sandbox", "native", "sandbox backend: native, bwrap, or none (no isolation at all)")
	fs.StringVar(&o.python, "python", "", "interpreter: a path, or a version such as 3.12 (default /usr/bin/python3); a version the host lacks is a managed one, downloaded as --python-downloads allows")
	fs.Var(&o.timeout, "timeout", "default wall-clock limit per run (e.g. 30s, 2m; a bare number is seconds)")
	fs.Var(&o.maxTimeout, "max-timeout", "largest timeout a caller may ask for")
	fs.Var(&o.memory, "memory", "memory limit per run, swap included (e.g. 512MiB, 1GiB)")
	fs.Var(&o.maxOutput, "max-output", "bytes of stdout and of stderr kept per run (head and tail)")
	fs.Int64Var(&o.maxProcs, "max-procs", 64, "processes and threads per run")
	fs.Float64Var(&o.cpus, "cpus", 1, "CPU quota per run and per session, in CPUs (cgroup cpu.cfs_quota_us / cpu.max): no run can take more of the machine, however many processes it starts; 0: none")
	fs.Var(&o.tmpSize, "tmp-size", "size of the writable scratch space (/tmp, /work, /dev/shm together)")
	fs.IntVar(&o.maxConcurrent, "max-concurrent", 16, "runs executing at once")
	fs.IntVar(&o.maxQueue, "max-queue", 64, "runs waiting for a slot before new ones are refused")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn or error (logs go to stderr)")
	fs.IntVar(&o.poolSize, "pool-size", 4, "warm pool: sandboxes kept ready, forked from a zygote with the interpreter started (native backend; 0 turns the pool off)")
	fs.StringVar(&o.preload, "preload", "", "warm pool: comma-separated modules imported once in the zygote, e.g. numpy,pandas (a missing one is a warning)")
	fs.Var(&o.poolMemory, "pool-memory", "warm pool: memory budget of the zygote and its idle sandboxes")
	fs.Int64Var(&o.zygoteRuns, "zygote-max-runs", o.zygoteRuns, "warm pool: replace a zygote after it has forked this many runs (runs forked from one zygote share its memory layout and str hash seed); 0: never")
	fs.Var(&o.zygoteAge, "zygote-max-age", "warm pool: replace a zygote this long after it started; 0: never")
	fs.IntVar(&o.learnPreload, "adaptive-preload", 4, "warm pool: preload up to this many more modules on its own once recent runs keep importing them (within --pool-memory); 0 turns it off")
	fs.StringVar(&o.cacheDir, "cache-dir", defaultCacheDir(), "dependencies: where installed environments are cached")
	fs.Var(&o.cacheSize, "cache-size", "dependencies: size cap of the cache (least recently used environments go first)")
	fs.StringVar(&o.indexURL, "index-url", "", "dependencies: package index (PEP 503) for pip/uv (default: their own, PyPI)")
	fs.Var(&o.extraIndexURLs, "extra-index-url", "dependencies: an additional index (repeatable)")
	fs.Var(&o.findLinks, "find-links", "dependencies: a local wheelhouse directory or URL (repeatable)")
	fs.BoolVar(&o.noIndex, "no-index", false, "dependencies: use only --find-links (offline)")
	fs.BoolVar(&o.allowSdist, "allow-sdist", false, "dependencies: allow building source distributions, which runs their build code (in the installer's sandbox)")
	fs.Var(&o.installTimeout, "install-timeout", "dependencies: time limit of one install")
	fs.StringVar(&o.pyDownloads, "python-downloads", envOr("UV_PYTHON_DOWNLOADS", "automatic"), "Python versions the host lacks: automatic (download one when a run asks for it), manual (only 'pysandbox python install') or never, as uv's python-downloads; $UV_PYTHON_DOWNLOADS sets the default")
	fs.StringVar(&o.pyPreference, "python-preference", envOr("UV_PYTHON_PREFERENCE", "system"), "which Python serves a run that names a version: system (the host's, else a managed one), managed (an installed managed one first), only-managed (always a managed one) or only-system (never a managed one), as uv's python-preference; $UV_PYTHON_PREFERENCE sets the default")
	fs.StringVar(&o.pyMetadata, "python-downloads-json-url", os.Getenv("UV_PYTHON_DOWNLOADS_JSON_URL"), "Python downloads: uv's download metadata (a file or an http(s) URL) naming each archive and its SHA-256 (default: $UV_PYTHON_DOWNLOADS_JSON_URL, else the metadata pysandbox ships, for CPython 3.8 to 3.15 on Linux)")
	fs.StringVar(&o.pyMirror, "python-install-mirror", os.Getenv("UV_PYTHON_INSTALL_MIRROR"), "Python downloads: a mirror that replaces "+pydist.DefaultPrefix+" in archive URLs, as uv's UV_PYTHON_INSTALL_MIRROR (default: $UV_PYTHON_INSTALL_MIRROR)")
	fs.Var(&o.allowNet, "allow-net", "network: let runs reach this host through the server's proxy, e.g. api.github.com, '*.githubusercontent.com:443', or NAME[:PORT]=ADDRESS to pin a name to an address (repeatable). Without it (or a policy file's network section) runs have no network at all")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: pysandbox %s\n\nFlags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs, o
}

// showOnly makes fs's usage list only the named flags, for a command that
// uses few of the shared ones. It still takes every shared flag, so that a
// server's flags can be passed to it as they are; the usage says so.
func showOnly(fs *flag.FlagSet, stderr io.Writer, synopsis string, names ...string) {
	fs.Usage = func() {
		shown := flag.NewFlagSet(fs.Name(), flag.ContinueOnError)
		shown.SetOutput(stderr)
		for _, n := range names {
			if f := fs.Lookup(n); f != nil {
				shown.Var(f.Value, f.Name, f.Usage)
				shown.Lookup(n).DefValue = f.DefValue
			}
		}
		fmt.Fprintf(stderr, "Usage: pysandbox %s\n\nFlags:\n", synopsis)
		shown.PrintDefaults()
		fmt.Fprintf(stderr, "\nThe other flags of 'pysandbox serve -h' are accepted too, so a server's flags can be passed as they are; they change nothing here.\n")
	}
}

func (o *options) logger(stderr io.Writer) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(o.logLevel)); err != nil {
		return nil, usageError{fmt.Errorf("--log-level %q: want debug, info, warn or error", o.logLevel)}
	}
	return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lvl})), nil
}

// validate refuses the shared flags' values that no engine can take.
// engine checks them again, so run and check refuse what serve does.
func (o *options) validate() error {
	if _, err := sandbox.ParseKind(o.sandbox); err != nil {
		return usageError{err}
	}
	if o.timeout <= 0 || o.maxTimeout <= 0 {
		return usageError{errors.New("--timeout and --max-timeout must be positive")}
	}
	if o.timeout > o.maxTimeout {
		return usageError{fmt.Errorf("--timeout %s is above --max-timeout %s", o.timeout.String(), o.maxTimeout.String())}
	}
	// Each limit out of bounds is named with what it got and needs; a
	// size's bare number is bytes, which is the usual surprise.
	var bad []string
	sizeAtLeast := func(flag string, v size, least int64, unit string) {
		if int64(v) < least {
			bad = append(bad, fmt.Sprintf("--%s %s is below %s (a bare number is bytes: write 512MiB, 1GiB)", flag, v.String(), unit))
		}
	}
	sizeAtLeast("memory", o.memory, 16<<20, "16MiB")
	sizeAtLeast("tmp-size", o.tmpSize, 1<<20, "1MiB")
	sizeAtLeast("max-output", o.maxOutput, 1<<10, "1KiB")
	if o.poolSize > 0 {
		// A zygote does not start in less (its cgroup's limit).
		sizeAtLeast("pool-memory", o.poolMemory, 16<<20, "16MiB, what a zygote needs to start")
	}
	if o.maxProcs > 1<<22 {
		// The kernel's PID_MAX_LIMIT: pids.max takes no more.
		bad = append(bad, fmt.Sprintf("--max-procs %d is above %d, the most processes the kernel can have", o.maxProcs, 1<<22))
	}
	for _, c := range []struct {
		flag  string
		v     int64
		least int64
	}{{"max-procs", o.maxProcs, 1}, {"max-concurrent", int64(o.maxConcurrent), 1}, {"max-queue", int64(o.maxQueue), 0}, {"pool-size", int64(o.poolSize), 0}, {"adaptive-preload", int64(o.learnPreload), 0}, {"zygote-max-runs", o.zygoteRuns, 0}} {
		if c.v < c.least {
			bad = append(bad, fmt.Sprintf("--%s %d is below %d", c.flag, c.v, c.least))
		}
	}
	if o.zygoteAge < 0 {
		bad = append(bad, "--zygote-max-age must not be negative")
	}
	if !(o.cpus >= 0 && o.cpus <= 1024) || (o.cpus > 0 && o.cpus < 0.01) {
		bad = append(bad, fmt.Sprintf("--cpus %g is out of range: 0.01 to 1024, or 0 for no quota", o.cpus))
	}
	if len(bad) > 0 {
		return usageError{fmt.Errorf("limits out of range: %s", strings.Join(bad, "; "))}
	}
	if _, err := parsePreload(o.preload); err != nil {
		return usageError{err}
	}
	if _, err := o.allowNetRules(); err != nil {
		return err
	}
	if err := o.checkIndex(); err != nil {
		return err
	}
	if err := o.checkPythonDownloads(); err != nil {
		return err
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(o.logLevel)); err != nil {
		return usageError{fmt.Errorf("--log-level %q: want debug, info, warn or error", o.logLevel)}
	}
	return nil
}

// parsePreload checks --preload: module names only, since the zygote
// imports each one.
func parsePreload(s string) ([]string, error) {
	var out []string
	for _, m := range strings.Split(s, ",") {
		m = strings.TrimSpace(m)
		if m == "" {
			continue
		}
		for _, part := range strings.Split(m, ".") {
			if !engine.IsIdentifier(part) {
				return nil, fmt.Errorf("--preload: %q is not a module name", m)
			}
		}
		out = append(out, m)
	}
	return out, nil
}

// duration is a flag that takes Go durations or a bare number of seconds.
type duration time.Duration

func (d *duration) String() string { return time.Duration(*d).String() }
func (d *duration) Set(s string) error {
	if n, err := strconv.ParseFloat(s, 64); err == nil {
		*d = duration(n * float64(time.Second))
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("want a duration such as 30s or 2m")
	}
	*d = duration(v)
	return nil
}

// size is a flag that takes bytes with an optional unit (K, KiB, M, MiB, G, GiB; all binary).
type size int64

func (s *size) String() string {
	v := int64(*s)
	for _, u := range []struct {
		n    int64
		name string
	}{{1 << 30, "GiB"}, {1 << 20, "MiB"}, {1 << 10, "KiB"}} {
		if v >= u.n && v%u.n == 0 {
			return fmt.Sprintf("%d%s", v/u.n, u.name)
		}
	}
	return strconv.FormatInt(v, 10)
}

func (s *size) Set(v string) error {
	t := strings.TrimSpace(strings.ToUpper(v))
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		n      int64
	}{{"GIB", 1 << 30}, {"MIB", 1 << 20}, {"KIB", 1 << 10}, {"GB", 1 << 30}, {"MB", 1 << 20}, {"KB", 1 << 10}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1}} {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.n
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > (1<<50)/mult {
		return fmt.Errorf("want a size such as 512MiB or 1GiB")
	}
	*s = size(n * mult)
	return nil
}

// allowNetRules parses --allow-net.
func (o *options) allowNetRules() ([]policy.HostRule, error) {
	var rules []policy.HostRule
	for _, h := range o.allowNet {
		for _, one := range strings.Split(h, ",") {
			if one = strings.TrimSpace(one); one == "" {
				continue
			}
			r, err := policy.ParseHostRule(one)
			if err != nil {
				return nil, usageError{fmt.Errorf("--allow-net: %w", err)}
			}
			rules = append(rules, r)
		}
	}
	return rules, nil
}

// buildProxy parses --allow-net and builds the network proxy, which the
// installer always uses and runs use when some host is allowed.
func (o *options) buildProxy(log *slog.Logger) error {
	if o.netRules != nil && len(o.allowNet) > 0 {
		return usageError{errors.New("--allow-net and a policy file's network section both say which hosts runs may reach; put the hosts in the policy file")}
	}
	allow, err := o.allowNetRules()
	if err != nil {
		return err
	}
	o.flagRules = &policy.NetworkRules{Limits: policy.DefaultNetLimits, Allow: allow}
	for _, w := range o.flagRules.Warnings("--allow-net") {
		log.Warn("network rule that never takes effect", "warning", w)
	}
	o.proxy = egress.New(egress.Config{Rules: o.networkRules, Log: log})
	if r := o.networkRules(); r.Enabled() {
		var allowed, approved []string
		for _, h := range r.Allow {
			allowed = append(allowed, h.String())
		}
		for _, h := range r.Approve {
			approved = append(approved, h.String())
		}
		log.Info("network: runs may reach these hosts through the proxy", "allow", strings.Join(allowed, ","), "after_approval", strings.Join(approved, ","))
	}
	return nil
}
