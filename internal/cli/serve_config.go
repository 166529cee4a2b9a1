package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/pysandbox/pysandbox/internal/tools"
)

// ServeConfig is every flag of `pysandbox serve`, parsed. newServeFlags
// fills it, Validate checks it, and assemble builds the server it
// describes; nothing in it is open or running.
type ServeConfig struct {
	// The flags every command shares: the sandbox, its limits, the warm
	// pool, dependencies, --allow-net, --log-level.
	*options

	HTTP           string // --http: streamable HTTP on this address; "" serves stdio
	MaxSessions    int
	SessionTTL     duration
	MaxSessionTTL  duration
	SessionsMemory size
	MaxUpload      size
	MaxReply       size
	MaxReplyOutput size   // --max-reply-output: what a reply shows of each stream
	Upstream       string // --upstream: the upstream servers' file

	// Container is --container: run the server in pysandbox's image under
	// this runtime (internal/launcher) instead of here; Image is --image.
	Container, Image string

	// Governance.
	Policy            string
	AuditLog          string
	AuditSyncEach     bool
	AuditMaxSize      size
	AuthTokenFile     string
	OperatorTokenFile string
	MetricsTokenFile  string
	TLSCert, TLSKey   string
	Console           bool
	InsecureNoAuth    bool
	AllowedHosts      listFlag

	Profiles profileFlags
	Quotas   quotaFlags
	Store    storeFlags
	Replica  replicaFlags
	State    stateFlags

	// Args are the arguments after the flags: serve takes none.
	Args []string
}

// newServeFlags is serve's flag set, bound to the ServeConfig it fills. A
// command that takes serve flags (setup's after --) parses them with it,
// and Validate refuses what serve would.
func newServeFlags(stderr io.Writer) (*flag.FlagSet, *ServeConfig) {
	fs, o := newFlagSet("serve", "serve [--http ADDR] [flags]", stderr)
	c := &ServeConfig{
		options:        o,
		SessionTTL:     duration(10 * time.Minute),
		MaxSessionTTL:  duration(24 * time.Hour),
		SessionsMemory: 4 << 30,
		MaxUpload:      16 << 20,
		MaxReply:       size(tools.DefaultMaxReply),
		MaxReplyOutput: size(tools.DefaultMaxStreamReply),
		AuditMaxSize:   100 << 20,
	}
	c.addServerFlags(fs)
	c.addGovernanceFlags(fs)
	c.Profiles.add(fs, o)
	c.Quotas.add(fs)
	c.Store.add(fs)
	c.Replica.add(fs)
	c.State.add(fs)
	fs.Var(&c.AllowedHosts, "allowed-host", "with --http: a further Host name clients may use (e.g. sandbox.example.com behind a proxy); repeat or separate with commas. Loopback names and the listen address are always allowed")
	return fs, c
}

func (c *ServeConfig) addServerFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.HTTP, "http", "", "serve MCP over streamable HTTP on this address (e.g. 127.0.0.1:8080) instead of stdio; a non-loopback address needs --auth-token-file")
	fs.IntVar(&c.MaxSessions, "max-sessions", 8, "sessions open at once")
	fs.Var(&c.SessionTTL, "session-ttl", "idle time after which a session expires, when create_session names none")
	fs.Var(&c.MaxSessionTTL, "max-session-ttl", "largest ttl_seconds create_session may ask for")
	fs.Var(&c.SessionsMemory, "sessions-memory", "memory budget of all sessions together (each may use --memory)")
	fs.Var(&c.MaxUpload, "max-upload", "largest file upload_file accepts")
	fs.Var(&c.MaxReply, "max-reply", "largest tool result on the wire, JSON escapes included: figures beyond it become resource links and output is cut further (clients drop connections at about 10MiB)")
	fs.Var(&c.MaxReplyOutput, "max-reply-output", "how much of each of a run's stdout, stderr and return value its reply shows, head and tail; the whole (as --max-output captured it) is linked: a resource, or a file in the session. A reply's text, both channels together, stays within five times it (100000 bytes, about 25000 tokens, by default)")
	fs.StringVar(&c.Container, "container", "", "run the server in pysandbox's OCI image under this container runtime (podman, docker, or its absolute path) with stdio passed through, as on macOS and Windows (see docs/commands.md)")
	fs.StringVar(&c.Image, "image", "", "with --container: the image (default pysandbox:VERSION, loaded from pysandbox-image.tar next to this binary when missing)")
	fs.StringVar(&c.Upstream, "upstream", "", "MCP servers whose tools Python code may call (import tools), in the mcpServers JSON format of Claude Desktop, Cursor and VS Code: {\"mcpServers\": {\"NAME\": {\"command\": ..., \"args\": [...], \"env\": {...}} or {\"url\": ..., \"headers\": {...}}}}. They run as children of this server, with its credentials; the policy names their tools NAME.TOOL")
}

func (c *ServeConfig) addGovernanceFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Policy, "policy", "", "policy file (JSON or YAML): which tools are allowed, denied or need the user's approval, rate limits, package rules; default: everything allowed. SIGHUP reloads it (a broken file changes nothing)")
	fs.StringVar(&c.AuditLog, "audit-log", "", "append a tamper-evident record of every tool call to this file (JSON lines, hash-chained; check it with 'pysandbox audit verify')")
	fs.BoolVar(&c.AuditSyncEach, "audit-sync-each", false, "make each audit record durable (fdatasync) before its call's result is returned, rather than in the background right after (costs a disk flush per call)")
	fs.Var(&c.AuditMaxSize, "audit-max-size", "rotate the audit log to FILE.1, FILE.2, ... when it would grow past this size (the chain continues across files); 0 never rotates")
	fs.StringVar(&c.AuthTokenFile, "auth-token-file", "", "require a bearer token on /mcp (and /metrics, unless --metrics-token-file): a file of 'NAME TOKEN' lines; NAME becomes the caller's identity in the audit log and rate limits. SIGHUP rereads every token file (a broken one changes nothing)")
	fs.StringVar(&c.TLSCert, "tls-cert", "", "with --http: serve HTTPS with this PEM certificate (chain) file; needs --tls-key")
	fs.StringVar(&c.TLSKey, "tls-key", "", "with --http: the PEM private key of --tls-cert")
	fs.BoolVar(&c.Console, "console", false, "with --http: serve the operator console at /console (live runs and sessions, kill, the audit trail, the policy); needs --operator-token-file")
	fs.StringVar(&c.OperatorTokenFile, "operator-token-file", "", "with --console: the operators' tokens ('NAME TOKEN' lines, as --auth-token-file); an agent's token never opens the console, and an operator's never runs code. SIGHUP reloads it: a removed operator's console sessions end")
	fs.StringVar(&c.MetricsTokenFile, "metrics-token-file", "", "with --http: the tokens that open /metrics ('NAME TOKEN' lines, as --auth-token-file) and nothing else; with it, agents' tokens no longer open /metrics. SIGHUP reloads it")
	fs.BoolVar(&c.InsecureNoAuth, "insecure-no-auth", false, "allow --http on a non-loopback address without --auth-token-file: ANYONE who can reach the port can run code")
}

// parseServeFlags parses serve's command line into a ServeConfig, not yet
// validated.
func parseServeFlags(args []string, stderr io.Writer) (*ServeConfig, error) {
	fs, c := newServeFlags(stderr)
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	c.Args = fs.Args()
	return c, nil
}

// Validate checks everything serve would refuse before it starts
// anything: arguments, flags that go together, values out of range, and
// files that are not there. What a file holds is checked when it is read
// (assemble). A refusal of the command line is a usageError (exit 2).
func (c *ServeConfig) Validate() error {
	for _, check := range []func() error{
		c.checkArgs,
		c.checkHTTP,
		c.options.validate,
		c.checkProfiles,
		c.checkRanges,
		c.Quotas.check,
		c.State.check,
		func() error { return c.Replica.check(c.HTTP, c.Store.storeURL() != "") },
		c.checkFiles,
	} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

func (c *ServeConfig) checkArgs() error {
	if len(c.Args) > 0 {
		return usageError{fmt.Errorf("serve takes no arguments, got %q", c.Args)}
	}
	return nil
}

// checkHTTP checks the flags of the HTTP deployment: those that need
// --http, those that go together, and the exposure of the address.
func (c *ServeConfig) checkHTTP() error {
	if c.HTTP == "" && (c.AuthTokenFile != "" || c.MetricsTokenFile != "" || c.InsecureNoAuth || len(c.AllowedHosts) > 0 || c.TLSCert != "" || c.TLSKey != "") {
		return usageError{errors.New("--auth-token-file, --metrics-token-file, --insecure-no-auth, --allowed-host, --tls-cert and --tls-key apply to --http only")}
	}
	if c.Console && (c.HTTP == "" || c.OperatorTokenFile == "") || !c.Console && c.OperatorTokenFile != "" {
		return usageError{errors.New("--console needs --http and --operator-token-file (and --operator-token-file goes with --console)")}
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return usageError{errors.New("--tls-cert and --tls-key go together")}
	}
	if c.HTTP == "" {
		return nil
	}
	if err := checkExposure(c.HTTP, c.AuthTokenFile != "", c.InsecureNoAuth); err != nil {
		return usageError{err}
	}
	for _, h := range c.AllowedHosts {
		if err := checkAllowedHost(h); err != nil {
			return usageError{err}
		}
	}
	return nil
}

// checkAllowedHost refuses an --allowed-host that is not a host name or
// address, as httpserver.Handler does (which checks it again).
func checkAllowedHost(h string) error {
	name := h
	if host, _, err := net.SplitHostPort(h); err == nil {
		name = host
	}
	if name = strings.TrimSuffix(strings.Trim(name, "[]"), "."); name == "" || strings.ContainsAny(name, "/ @") {
		return fmt.Errorf("--allowed-host %q: want a host name or IP address, e.g. sandbox.example.com", h)
	}
	return nil
}

func (c *ServeConfig) checkProfiles() error {
	if _, _, err := c.Profiles.selectProfiles(); err != nil {
		return usageError{err}
	}
	return nil
}

func (c *ServeConfig) checkRanges() error {
	if c.MaxSessions < 1 || c.SessionTTL <= 0 || c.MaxSessionTTL < c.SessionTTL || c.MaxUpload < 1 || c.AuditMaxSize < 0 || c.MaxReply < 256<<10 || c.MaxReplyOutput < 1024 {
		return usageError{errors.New("--max-sessions must be at least 1, --session-ttl positive and at most --max-session-ttl, --max-upload positive, --audit-max-size not negative, --max-reply at least 256KiB, --max-reply-output at least 1KiB")}
	}
	return nil
}

// checkFiles checks that every file a flag names is there (and the
// directory of the audit log, which serve creates).
func (c *ServeConfig) checkFiles() error {
	for _, f := range []struct{ flag, what, path string }{
		{"--tls-cert", "certificate file", c.TLSCert},
		{"--tls-key", "key file", c.TLSKey},
		{"--auth-token-file", "auth token file", c.AuthTokenFile},
		{"--operator-token-file", "auth token file", c.OperatorTokenFile},
		{"--metrics-token-file", "auth token file", c.MetricsTokenFile},
		{"--upstream", "upstream servers file", c.Upstream},
		{"--policy", "policy file", c.Policy},
		{"--approval-key-file", "approval key file", c.Store.keyFile},
		{"--replica-token-file", "replica token file", c.Replica.tokenFile},
	} {
		if f.path == "" {
			continue
		}
		if err := checkFile(f.flag, f.what, f.path); err != nil {
			return err
		}
	}
	if c.AuditLog != "" {
		dir := filepath.Dir(c.AuditLog)
		if st, err := os.Stat(dir); err != nil {
			return fmt.Errorf("--audit-log: directory %s: %w", dir, pathErr(err))
		} else if !st.IsDir() {
			return fmt.Errorf("--audit-log: %s is not a directory", dir)
		}
	}
	return nil
}

// checkFile checks that path names something other than a directory.
func checkFile(flagName, what, path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("%s: %s %s: %w", flagName, what, path, pathErr(err))
	}
	if st.IsDir() {
		return fmt.Errorf("%s: %s %s is a directory", flagName, what, path)
	}
	return nil
}

// pathErr is err without the operation and path a *fs.PathError repeats.
func pathErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
