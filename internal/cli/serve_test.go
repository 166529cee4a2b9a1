package cli

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/policy"
)

// TestServeConfigValidate: what serve refuses before it starts anything,
// each with the message it gives and whether it is a usage error (exit 2)
// or not (exit 1).
func TestServeConfigValidate(t *testing.T) {
	t.Setenv("PYSANDBOX_STORE_URL", "")
	t.Setenv("POD_IP", "")
	dir := t.TempDir()
	file := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("x\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tok, pol := file("tokens"), file("policy.json")
	missing := filepath.Join(dir, "missing")
	for _, tc := range []struct {
		args  []string
		want  string // "" accepts
		usage bool
	}{
		{nil, "", false},
		{[]string{"--http", "127.0.0.1:0", "--auth-token-file", tok, "--policy", pol, "--audit-log", filepath.Join(dir, "audit.log")}, "", false},
		{[]string{"--http", "0.0.0.0:8080", "--insecure-no-auth", "--allowed-host", "sandbox.example.com:443"}, "", false},
		{[]string{"extra"}, `serve takes no arguments, got ["extra"]`, true},
		{[]string{"--auth-token-file", tok}, "apply to --http only", true},
		{[]string{"--metrics-token-file", tok}, "apply to --http only", true},
		{[]string{"--tls-cert", tok}, "apply to --http only", true},
		{[]string{"--console"}, "--console needs --http and --operator-token-file", true},
		{[]string{"--http", "127.0.0.1:0", "--operator-token-file", tok}, "--console needs --http and --operator-token-file", true},
		{[]string{"--http", "127.0.0.1:0", "--tls-cert", tok}, "--tls-cert and --tls-key go together", true},
		{[]string{"--http", "0.0.0.0:8080"}, "refusing a non-loopback address without authentication", true},
		{[]string{"--http", "nonsense"}, `--http "nonsense": want HOST:PORT`, true},
		{[]string{"--http", "127.0.0.1:0", "--allowed-host", "a/b"}, `--allowed-host "a/b": want a host name`, true},
		{[]string{"--log-level", "loud"}, `--log-level "loud": want debug, info, warn or error`, true},
		{[]string{"--tools", "nope"}, `--tools: no profile "nope"`, true},
		{[]string{"--tools", "pysandbox,mcp-python-exec-sandbox"}, "both have a tool named check_environment", true},
		{[]string{"--sandbox", "docker"}, `unknown backend "docker"`, true},
		{[]string{"--timeout", "0"}, "--timeout and --max-timeout must be positive", true},
		{[]string{"--timeout", "10m", "--max-timeout", "1m"}, "--timeout 10m0s is above --max-timeout 1m0s", true},
		{[]string{"--memory", "1M"}, "--memory 1MiB is below 16MiB (a bare number is bytes", true},
		{[]string{"--memory", "1024"}, "--memory 1KiB is below 16MiB", true},
		{[]string{"--cpus", "0.001"}, "--cpus 0.001 is out of range", true},
		{[]string{"--pool-memory", "8MiB"}, "--pool-memory 8MiB is below 16MiB, what a zygote needs to start", true},
		{[]string{"--pool-memory", "8MiB", "--pool-size", "0"}, "", false},
		{[]string{"--max-procs", "100000000"}, "--max-procs 100000000 is above 4194304", true},
		{[]string{"--max-procs", "0", "--tmp-size", "1000"}, "limits out of range: --tmp-size 1000 is below 1MiB (a bare number is bytes: write 512MiB, 1GiB); --max-procs 0 is below 1", true},
		{[]string{"--preload", "1bad"}, `--preload: "1bad" is not a module name`, true},
		{[]string{"--allow-net", "a/b"}, "--allow-net:", true},
		{[]string{"--find-links", "rel"}, `--find-links "rel": give an absolute directory or a URL`, true},
		{[]string{"--no-index"}, "--no-index needs at least one --find-links wheelhouse", true},
		{[]string{"--max-sessions", "0"}, "--max-sessions must be at least 1", true},
		{[]string{"--session-ttl", "48h"}, "--session-ttl positive and at most --max-session-ttl", true},
		{[]string{"--max-reply", "1K"}, "--max-reply at least 256KiB", true},
		{[]string{"--mcp-session-idle", "0"}, "--mcp-session-idle, --max-mcp-sessions-per-caller and --max-mcp-sessions must be positive", true},
		{[]string{"--max-runs-per-caller", "-2"}, "take -1 (automatic), 0 (no bound) or a positive number", true},
		{[]string{"--replica", "r1"}, "--replica, --advertise and --replica-token-file go with --internal-http", true},
		{[]string{"--internal-http", ":0", "--http", "127.0.0.1:0"}, "--internal-http needs --http and --store", true},
		{[]string{"--internal-http", ":0", "--http", "127.0.0.1:0", "--store", "redis://127.0.0.1:1/0"}, "--internal-http needs --replica-token-file", true},
		{[]string{"--internal-http", ":0", "--http", "127.0.0.1:0", "--store", "redis://127.0.0.1:1/0", "--replica-token-file", tok}, "--internal-http needs --advertise (or $POD_IP)", true},
		{[]string{"--http", "127.0.0.1:0", "--auth-token-file", missing}, "--auth-token-file: auth token file " + missing + ": no such file or directory", false},
		{[]string{"--http", "127.0.0.1:0", "--tls-cert", missing, "--tls-key", tok}, "--tls-cert: certificate file " + missing + ": no such file", false},
		{[]string{"--policy", missing}, "--policy: policy file " + missing + ": no such file", false},
		{[]string{"--policy", dir}, "--policy: policy file " + dir + " is a directory", false},
		{[]string{"--upstream", missing}, "--upstream: upstream servers file " + missing + ": no such file", false},
		{[]string{"--approval-key-file", missing}, "--approval-key-file: approval key file " + missing + ": no such file", false},
		{[]string{"--audit-log", filepath.Join(missing, "audit.log")}, "--audit-log: directory " + missing + ": no such file", false},
	} {
		cfg, err := parseServeFlags(tc.args, io.Discard)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		err = cfg.Validate()
		var ue usageError
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v refused: %v", tc.args, err)
		case tc.want == "":
		case err == nil || !strings.Contains(err.Error(), tc.want):
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		case errors.As(err, &ue) != tc.usage:
			t.Errorf("%v: usage error %v, want %v (%v)", tc.args, !tc.usage, tc.usage, err)
		}
	}
}

// TestServeConfigStoreFromEnvironment: $PYSANDBOX_STORE_URL and $POD_IP
// count as --store and --advertise.
func TestServeConfigStoreFromEnvironment(t *testing.T) {
	tok := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tok, []byte("x\n"), 0o600)
	t.Setenv("PYSANDBOX_STORE_URL", "redis://127.0.0.1:1/0")
	t.Setenv("POD_IP", "10.0.0.7")
	cfg, err := parseServeFlags([]string{"--http", "127.0.0.1:0", "--internal-http", ":0", "--replica-token-file", tok}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestServeFlagsDefaults: newServeFlags binds every flag to its field,
// with serve's defaults.
func TestServeFlagsDefaults(t *testing.T) {
	fs, cfg := newServeFlags(io.Discard)
	if cfg.MaxSessions != 8 || time.Duration(cfg.SessionTTL) != 10*time.Minute || time.Duration(cfg.MaxSessionTTL) != 24*time.Hour ||
		cfg.SessionsMemory != 4<<30 || cfg.MaxUpload != 16<<20 || cfg.AuditMaxSize != 100<<20 || time.Duration(cfg.Replica.drain) != 25*time.Second ||
		cfg.Profiles.tools != "pysandbox" || cfg.Store.namespace != "pysandbox" || cfg.Quotas.runs != -1 || cfg.maxConcurrent != 16 {
		t.Errorf("defaults: %+v", cfg)
	}
	if err := parseFlags(fs, []string{"--http", "127.0.0.1:9", "--max-sessions", "3", "--default-timeout", "7s", "--allowed-host", "a", "--allowed-host", "b",
		"--deps", "numpy,pandas", "--store-namespace", "ns", "--drain-timeout", "5"}); err != nil {
		t.Fatal(err)
	}
	if cfg.HTTP != "127.0.0.1:9" || cfg.MaxSessions != 3 || time.Duration(cfg.timeout) != 7*time.Second || !slices.Equal(cfg.AllowedHosts, []string{"a", "b"}) ||
		!slices.Equal(cfg.Profiles.deps, []string{"numpy", "pandas"}) || cfg.Store.namespace != "ns" || time.Duration(cfg.Replica.drain) != 5*time.Second {
		t.Errorf("parsed: %+v", cfg)
	}
}

// TestClosersReverse: parts close last opened first, and once.
func TestClosersReverse(t *testing.T) {
	var c closers
	var got []int
	for i := range 4 {
		c.add(func() { got = append(got, i) })
	}
	c.close()
	c.close()
	if !slices.Equal(got, []int{3, 2, 1, 0}) {
		t.Errorf("closed in order %v", got)
	}
}

// TestSDKLogger: the SDK's records below Warn are dropped, and so is its
// report of a Run the server itself stopped; its other errors pass.
func TestSDKLogger(t *testing.T) {
	var buf bytes.Buffer
	log := sdkLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	log.Info("chatter")
	log.Error("server run cancelled", "error", context.Canceled)
	log.Error("a real failure")
	out := buf.String()
	if strings.Contains(out, "chatter") || strings.Contains(out, "server run cancelled") || !strings.Contains(out, "a real failure") {
		t.Errorf("logged:\n%s", out)
	}
}

// TestLogPolicyWarnsWhenNothingIsAllowed: a policy that allows no tool
// (a network section alone, no default) is warned about at startup; one
// with default: allow is not.
func TestLogPolicyWarnsWhenNothingIsAllowed(t *testing.T) {
	tools := []string{"run_python", "check_environment"}
	for doc, warn := range map[string]bool{
		"version: \"1\"\nnetwork: {allow: [\"api.github.com\"]}\n":                 true,
		"version: \"1\"\ndefault: allow\nnetwork: {allow: [\"api.github.com\"]}\n": false,
	} {
		pol, err := policy.Parse([]byte(doc), "p.yaml", tools)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		logPolicy(slog.New(slog.NewTextHandler(&buf, nil)), pol, tools)
		if got := strings.Contains(buf.String(), "the policy allows no tool"); got != warn {
			t.Errorf("%q: warned %v, want %v:\n%s", doc, got, warn, buf.String())
		}
	}
}
