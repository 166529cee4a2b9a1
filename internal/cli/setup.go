package cli

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/pysandbox/pysandbox/internal/httpserver"
	"github.com/pysandbox/pysandbox/internal/policy"
	"github.com/pysandbox/pysandbox/internal/profiles"
	"github.com/pysandbox/pysandbox/internal/setup"
	"github.com/pysandbox/pysandbox/internal/upstream"
)

// setupCmd is `pysandbox setup CLIENT [--write] [-- SERVE FLAGS...]`, or
// `pysandbox setup CLIENT --url URL [--token-file F]` for a server
// already running over HTTP.
func setupCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("setup", flag.ContinueOnError)
	fs.SetOutput(stderr)
	write := fs.Bool("write", false, "merge the entry into the client's config file (keeping every other entry, with a backup FILE.bak) instead of only printing it")
	name := fs.String("name", "pysandbox", "the server's name in the client")
	file := fs.String("file", "", "the config file to write (default: the client's documented user-level file)")
	binary := fs.String("binary", "", "the pysandbox binary the client runs (default: this one, by absolute path)")
	rawURL := fs.String("url", "", "instead of running this binary, point the client at a server already serving over HTTP: its streamable HTTP endpoint, e.g. https://sandbox.example.com/mcp (pysandbox serve --http serves it at /mcp). Not for Claude Desktop, which takes remote servers only under Settings > Connectors")
	tokenFile := fs.String("token-file", "", "with --url: a file holding the client's bearer token (the token alone, or one 'NAME TOKEN' line of the server's --auth-token-file); it is written into the client's config as an 'Authorization: Bearer' header")
	maxTimeout := durationFlag(fs, "max-timeout", 300*time.Second, "with --url: the server's --max-timeout, from which the client's tool-call timeout is set where it has one (without --url it comes from the serve flags)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: pysandbox setup CLIENT [--write] [--name NAME] [--file PATH] [-- SERVE FLAGS...]\n"+
			"       pysandbox setup CLIENT --url URL [--token-file FILE] [--max-timeout D] [--write] [--name NAME] [--file PATH]\n\n"+
			"CLIENT is one of: %s.\n"+
			"Prints the exact config entry that runs this binary's `serve` (with the serve flags after --, checked as serve\n"+
			"would check them, their files made absolute), or with --url the entry that reaches a running server over\n"+
			"streamable HTTP; with --write merges it into the client's file. Where the client has a tool-call timeout\n"+
			"setting (Codex, Gemini CLI), it is set to --max-timeout plus --install-timeout plus 30s.\n\nFlags:\n",
			strings.Join(setup.IDs(), ", "))
		fs.PrintDefaults()
	}
	var serveFlags []string
	dashes := false
	for i, a := range args {
		if a == "--" {
			args, serveFlags, dashes = args[:i], args[i+1:], true
			break
		}
	}
	// The client comes first or after the flags.
	var client string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		client, args = args[0], args[1:]
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if client == "" && fs.NArg() > 0 {
		// Flags before the client, and maybe after it too: Go's flag
		// package stops at the first non-flag, which would leave
		// `--write cursor --file F` writing the client's own file.
		client = fs.Arg(0)
		if err := parseFlags(fs, fs.Args()[1:]); err != nil {
			return err
		}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("setup: unexpected argument %q; serve flags go after --", fs.Arg(0))}
	}
	c, ok := setup.Clients[client]
	if !ok {
		if client != "" {
			return usageError{fmt.Errorf("setup: unknown client %q; the clients are %s", client, strings.Join(setup.IDs(), ", "))}
		}
		return usageError{fmt.Errorf("setup: name a client: %s", strings.Join(setup.IDs(), ", "))}
	}
	if strings.TrimSpace(*name) == "" {
		return usageError{errors.New("setup: --name: the server needs a name in the client (the default is pysandbox)")}
	}
	e := setup.Entry{Name: *name}
	if *rawURL != "" {
		if dashes {
			return usageError{errors.New("setup: --url points the client at a running server; serve flags (after --) go with the entry that starts one")}
		}
		if *binary != "" {
			return usageError{errors.New("setup: --binary goes with the entry that starts a server, not with --url")}
		}
		if c.URLKey == "" {
			return usageError{fmt.Errorf("setup: %s", c.NoHTTP)}
		}
		u, warning, err := checkURL(*rawURL)
		if err != nil {
			return usageError{err}
		}
		e.URL = u
		if *tokenFile != "" {
			tok, err := readClientToken(*tokenFile)
			if err != nil {
				return usageError{err}
			}
			e.Headers = []setup.Header{{Name: "Authorization", Value: "Bearer " + tok}}
			if warning != "" {
				fmt.Fprintf(stderr, "pysandbox: warning: %s\n", warning)
			}
		}
		e.ToolTimeout = toolTimeout(time.Duration(*maxTimeout), 5*time.Minute)
	} else {
		if *tokenFile != "" || isSet(fs, "max-timeout") {
			return usageError{errors.New("setup: --token-file and --max-timeout go with --url (a server this binary starts takes its limits from the serve flags after --)")}
		}
		cfg, abs, absFS, err := checkServeFlags(serveFlags)
		if err != nil {
			return err
		}
		bin := *binary
		if bin == "" {
			self, err := os.Executable()
			if err != nil {
				return fmt.Errorf("setup: where is this binary: %w", err)
			}
			bin = self
		}
		if bin, err = filepath.Abs(bin); err != nil {
			return err
		}
		// Each client's server its own state directory: a directory is
		// held by one server at a time, so with the one default the
		// second client's server could keep no paused session. (In a
		// container the launcher keeps its own, in a volume.)
		if !isSet(absFS, "state-dir") && cfg.Container == "" {
			if d := defaultStateDir(); d != "" {
				dir := filepath.Join(d, clientStateDir(c.ID, *name))
				// serve refuses to start with a --state-dir it cannot
				// make, where the default only costs a warning.
				if err := canMakeDir(dir); err != nil {
					fmt.Fprintf(stderr, "pysandbox: warning: the entry names no --state-dir: %s cannot be made (%v), so its server keeps paused sessions only where the default allows\n", dir, err)
				} else {
					abs = append([]string{"--state-dir", dir}, abs...)
				}
			}
		}
		e.Command, e.Args = bin, append([]string{"serve"}, abs...)
		e.ToolTimeout = toolTimeout(time.Duration(cfg.maxTimeout), time.Duration(cfg.installTimeout))
	}
	path := *file
	if path == "" {
		var err error
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
	if len(e.Headers) > 0 {
		if st, err := os.Stat(r.Path); err == nil && st.Mode().Perm()&0o044 != 0 {
			fmt.Fprintf(stderr, "pysandbox: warning: %s now holds a bearer token and is readable by other users (mode %#o); chmod 600 it\n", r.Path, st.Mode().Perm())
		}
	}
	return nil
}

// clientStateDir names a client's server's state directory below the
// default one: the client's id, and the entry's name when it is not the
// default (two entries in one client are two servers). The name is the
// user's: only its letters, digits, '-' and '_' are kept, at most 48 of
// them, and a name that lost anything gets a digest of the whole after a
// '.', so that two names never share a directory.
func clientStateDir(client, name string) string {
	if name == "pysandbox" {
		return client
	}
	clean := strings.Map(func(r rune) rune {
		if r < utf8.RuneSelf && (r == '-' || r == '_' || '0' <= r && r <= '9' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z') {
			return r
		}
		return '_'
	}, name)
	if len(clean) > 48 {
		clean = clean[:48]
	}
	if clean != name {
		// After a '.', which no kept name has: "a_-c0e0aaae" as a name
		// stays apart from "a!" with its digest.
		sum := sha256.Sum256([]byte(name))
		clean += "." + hex.EncodeToString(sum[:4])
	}
	return client + "-" + clean
}

// canMakeDir tells whether this user could make dir (or has it): its
// nearest existing ancestor must be a directory it may write to.
func canMakeDir(dir string) error {
	for p := dir; ; p = filepath.Dir(p) {
		st, err := os.Lstat(p)
		if err == nil && st.Mode()&fs.ModeSymlink != 0 {
			// mkdir of a dangling link's name fails: it exists.
			if st, err = os.Stat(p); err != nil {
				return fmt.Errorf("%s is a symbolic link to nothing", p)
			}
		}
		switch {
		case err == nil && !st.IsDir():
			return fmt.Errorf("%s is not a directory", p)
		case err == nil:
			return unix.Access(p, unix.W_OK|unix.X_OK)
		case !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, unix.ENOTDIR) || p == filepath.Dir(p):
			return err
		}
	}
}

// toolTimeout is the client's tool-call timeout for a server whose runs
// take at most maxTimeout, after installing their dependencies for at
// most install, with 30 s for the rest (queueing, the reply).
func toolTimeout(maxTimeout, install time.Duration) time.Duration {
	return maxTimeout + install + 30*time.Second
}

// durationFlag is a flag of serve's duration type (a bare number is
// seconds).
func durationFlag(fs *flag.FlagSet, name string, def time.Duration, usage string) *duration {
	d := duration(def)
	fs.Var(&d, name, usage)
	return &d
}

func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// checkServeFlags parses the serve flags with serve's own flag set and
// refuses what serve would refuse before starting (Validate), a policy or
// upstream servers' file that does not load (with serve's message), and
// --http, which no client could talk to over stdio. It returns the flags
// with every file argument absolute, and their flag set, which tells the
// flags they give.
func checkServeFlags(args []string) (*ServeConfig, []string, *flag.FlagSet, error) {
	refuse := func(err error) error {
		return usageError{fmt.Errorf("setup: serve would refuse the flags after --: %w", err)}
	}
	parse := func(args []string) (*flag.FlagSet, *ServeConfig, error) {
		fs, cfg := newServeFlags(io.Discard)
		fs.Usage = func() {}
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				err = errors.New("-h: see pysandbox serve -h for serve's flags")
			}
			return nil, nil, refuse(err)
		}
		cfg.Args = fs.Args()
		return fs, cfg, nil
	}
	fs, _, err := parse(args)
	if err != nil {
		return nil, nil, nil, err
	}
	// What is checked is what serve will get: the flags with their files
	// absolute (serve itself wants --find-links absolute).
	abs, err := absServeArgs(fs, args)
	if err != nil {
		return nil, nil, nil, err
	}
	absFS, cfg, err := parse(abs)
	if err != nil {
		return nil, nil, nil, err
	}
	if cfg.HTTP != "" {
		return nil, nil, nil, usageError{errors.New("setup: --http after -- would make a server the client cannot talk to (it talks over stdio); to point a client at a server running with --http, use setup CLIENT --url URL")}
	}
	if err := cfg.Validate(); err != nil {
		return nil, nil, nil, refuse(err)
	}
	// What serve reads before it starts, read now: a broken policy must
	// not become a client entry that fails every time it starts.
	for _, f := range []struct{ flag, path string }{{"--upstream", cfg.Upstream}, {"--policy", cfg.Policy}} {
		if f.path == "" {
			continue
		}
		// A FIFO would block the read, and serve's too.
		if st, err := os.Stat(f.path); err == nil && !st.Mode().IsRegular() {
			return nil, nil, nil, refuse(fmt.Errorf("%s: %s is not a regular file", f.flag, f.path))
		}
	}
	profs, native, err := cfg.Profiles.selectProfiles()
	if err != nil {
		return nil, nil, nil, refuse(err)
	}
	toolNames := profiles.ToolNames(profs, native)
	if cfg.Upstream != "" {
		upCfg, err := upstream.Load(cfg.Upstream)
		if err != nil {
			return nil, nil, nil, refuse(err)
		}
		toolNames = append(toolNames, upstreamPatterns(upCfg)...)
	}
	if cfg.Policy != "" {
		if _, err := policy.Load(cfg.Policy, toolNames); err != nil {
			return nil, nil, nil, refuse(err)
		}
	}
	return cfg, abs, absFS, nil
}

// serveFileFlags are serve's flags whose values are paths: setup makes
// them absolute, since the client starts the server from a directory of
// its own. (--python and --python-version take a path only when the
// value has a '/'; --find-links and --python-downloads-json-url also take a URL.) TestServeFileFlags
// checks that every flag that names a file is here.
var serveFileFlags = map[string]bool{
	"policy": true, "audit-log": true, "upstream": true,
	"auth-token-file": true, "operator-token-file": true, "metrics-token-file": true,
	"tls-cert": true, "tls-key": true,
	"approval-key-file": true, "replica-token-file": true,
	"cache-dir": true, "find-links": true, "python-downloads-json-url": true,
	"python": true, "python-version": true, "state-dir": true,
}

// absServeArgs is args (parsed by fs without error) with the value of
// every file flag absolute, whether the file exists yet or not (an audit
// log is created by serve). Everything else is kept as written.
func absServeArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	for _, a := range args {
		// JSON config files hold text: an invalid byte would be written
		// as U+FFFD, and the client would start serve with another path.
		if !utf8.ValidString(a) {
			return nil, fmt.Errorf("setup: %q is not valid UTF-8, which a client's config file cannot hold; rename the file", a)
		}
	}
	out := slices.Clone(args)
	for i := 0; i < len(out); i++ {
		a := out[i]
		if a == "--" || len(a) < 2 || a[0] != '-' {
			break // where serve's flag parsing stops
		}
		dashes := "-"
		if strings.HasPrefix(a, "--") {
			dashes = "--"
		}
		name, value, inline := strings.Cut(a[len(dashes):], "=")
		f := fs.Lookup(name)
		if f == nil {
			return nil, fmt.Errorf("setup: flag %s: not a serve flag", a)
		}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			continue
		}
		at := i
		if !inline {
			if i+1 >= len(out) {
				break
			}
			i++
			at, value = i, out[i]
		}
		if !serveFileFlags[name] || !isPathValue(name, value) {
			continue
		}
		abs, err := filepath.Abs(value)
		if err != nil {
			return nil, fmt.Errorf("setup: %s %s: %w", dashes+name, value, err)
		}
		if inline {
			out[at] = dashes + name + "=" + abs
		} else {
			out[at] = abs
		}
	}
	return out, nil
}

func isPathValue(flagName, v string) bool {
	switch {
	case v == "" || filepath.IsAbs(v):
		return false
	case flagName == "python" || flagName == "python-version":
		return strings.ContainsRune(v, '/')
	case flagName == "find-links" || flagName == "python-downloads-json-url":
		return !strings.Contains(v, "://")
	case flagName == "state-dir":
		return v != "none"
	}
	return true
}

// checkURL checks a server's URL for --url: http or https, a host, no
// user information (a password in a config file is the token's job). A
// plain http URL to another machine gets a warning, for the token it
// would carry in clear text.
func checkURL(raw string) (string, string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", "", fmt.Errorf("setup: --url %q: %v", raw, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" || u.Hostname() == "" {
		return "", "", fmt.Errorf("setup: --url %q: want http(s)://HOST[:PORT]/mcp, the server's streamable HTTP endpoint", raw)
	}
	if u.User != nil {
		return "", "", fmt.Errorf("setup: --url %q: no user or password in the URL; give the token with --token-file", raw)
	}
	if u.Fragment != "" {
		return "", "", fmt.Errorf("setup: --url %q: no #fragment", raw)
	}
	if u.Path == "" || u.Path == "/" {
		// The client would POST to / and get 404 from pysandbox.
		return "", "", fmt.Errorf("setup: --url %q names no endpoint; pysandbox serve --http serves MCP at /mcp: use %s", raw, strings.TrimSuffix(u.String(), "/")+"/mcp")
	}
	warning := ""
	if u.Scheme == "http" && !isLoopback(u.Hostname()) {
		warning = fmt.Sprintf("--url %s is plain HTTP to another machine: the bearer token travels in clear text; serve with --tls-cert/--tls-key or behind a TLS proxy and use https://", raw)
	}
	return u.String(), warning, nil
}

// readClientToken reads the client's bearer token from path: a regular
// file of at most httpserver.MaxTokenFileBytes holding one token, alone
// or as one 'NAME TOKEN' (or NAME:TOKEN) line as in the server's token
// file; blank lines and # comments are skipped.
func readClientToken(path string) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("setup: --token-file: %w", err)
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("setup: --token-file %s: not a regular file", path)
	}
	if st.Size() > httpserver.MaxTokenFileBytes {
		return "", fmt.Errorf("setup: --token-file %s: larger than 1 MiB; that is no token file", path)
	}
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("setup: --token-file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, httpserver.MaxTokenFileBytes+1))
	if err != nil {
		return "", fmt.Errorf("setup: --token-file %s: %w", path, err)
	}
	var tokens []string
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		switch {
		case len(fields) == 2:
			tokens = append(tokens, fields[1])
		case len(fields) == 1:
			if _, tok, ok := strings.Cut(line, ":"); ok {
				tokens = append(tokens, tok)
			} else {
				tokens = append(tokens, line)
			}
		default:
			return "", fmt.Errorf("setup: --token-file %s: want the token, or one 'NAME TOKEN' line", path)
		}
	}
	switch {
	case len(tokens) == 0:
		return "", fmt.Errorf("setup: --token-file %s: no token", path)
	case len(tokens) > 1:
		return "", fmt.Errorf("setup: --token-file %s: %d tokens; give a file with this client's one token", path, len(tokens))
	}
	tok := tokens[0]
	if len(tok) < httpserver.MinTokenLength || strings.IndexFunc(tok, func(r rune) bool { return r < 0x21 || r > 0x7e }) >= 0 {
		return "", fmt.Errorf("setup: --token-file %s: the token must be at least %d printable characters without spaces, as the server requires", path, httpserver.MinTokenLength)
	}
	return tok, nil
}
