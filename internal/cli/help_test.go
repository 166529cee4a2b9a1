package cli

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/deps"
	"github.com/pysandbox/pysandbox/internal/engine"
)

// TestCommandsTableIsComplete: every command the usage text shows is in
// the commands table the help tests go through.
func TestCommandsTableIsComplete(t *testing.T) {
	known := map[string]bool{}
	for _, c := range commands {
		known[c.name] = true
	}
	re := regexp.MustCompile(`(?m)^  pysandbox ([a-z]+)(?: (ls|prune|verify|tail|list|install|remove)\b)?`)
	for _, m := range re.FindAllStringSubmatch(usage, -1) {
		name := m[1]
		if m[2] != "" {
			name += " " + m[2]
		}
		if !known[name] {
			t.Errorf("the usage shows %q, which is not in commands", name)
		}
	}
	for _, sub := range []string{"cache ls", "cache prune", "audit verify", "audit tail", "python list", "python install", "python remove"} {
		if !known[sub] {
			t.Errorf("%q is not in commands", sub)
		}
	}
}

// TestHelp: every command and subcommand takes -h and --help, exits 0
// and prints a usage that names it.
func TestHelp(t *testing.T) {
	for _, c := range commands {
		for _, h := range []string{"-h", "--help"} {
			t.Run(c.name+" "+h, func(t *testing.T) {
				var out, errb bytes.Buffer
				args := append(strings.Fields(c.name), h)
				code := Main(args, strings.NewReader(""), &out, &errb)
				all := out.String() + errb.String()
				if code != 0 {
					t.Errorf("exit %d, want 0:\n%s", code, all)
				}
				if !strings.Contains(all, "Usage: pysandbox "+c.name) {
					t.Errorf("the usage does not name %q:\n%s", c.name, all)
				}
				if strings.Contains(all, "unknown") {
					t.Errorf("-h taken for something unknown:\n%s", all)
				}
			})
		}
	}
}

// TestBadFlag: a flag a command does not have gets the error and one
// usage line saying how to list the flags, not every flag.
func TestBadFlag(t *testing.T) {
	for _, c := range commands {
		if c.name == "cache" || c.name == "audit" || c.name == "python" || c.name == "version" {
			continue // no flags of their own: a subcommand comes first
		}
		t.Run(c.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			args := append(strings.Fields(c.name), "--no-such-flag")
			if c.name == "setup" {
				args = []string{"setup", "claude-code", "--no-such-flag"}
			}
			code := Main(args, strings.NewReader(""), &out, &errb)
			msg := errb.String()
			if code != 2 {
				t.Errorf("exit %d, want 2:\n%s", code, msg)
			}
			want := "usage: pysandbox " + c.name + " "
			if !strings.Contains(msg, "flag provided but not defined: -no-such-flag") || !strings.Contains(msg, want) ||
				!strings.Contains(msg, "pysandbox "+c.name+" -h lists them") {
				t.Errorf("want the error and %q...:\n%s", want, msg)
			}
			if n := strings.Count(strings.TrimSpace(msg), "\n") + 1; n > 2 {
				t.Errorf("%d lines, want 2:\n%s", n, msg)
			}
		})
	}
	// A bad value too.
	var out, errb bytes.Buffer
	if code := Main([]string{"serve", "--timeout", "soon"}, nil, &out, &errb); code != 2 ||
		!strings.Contains(errb.String(), "-timeout") || strings.Count(errb.String(), "\n") != 2 {
		t.Errorf("serve --timeout soon: %d\n%s", code, errb.String())
	}
	// A missing FILE is as short.
	errb.Reset()
	if code := Main([]string{"run"}, nil, &out, &errb); code != 2 || !strings.Contains(errb.String(), "usage: pysandbox run [flags] FILE|-") || strings.Count(errb.String(), "\n") != 2 {
		t.Errorf("run without FILE: %d\n%s", code, errb.String())
	}
}

// TestRunMessage: run tells how a run ended in its flags' terms: its
// timeout is --timeout, not the MCP argument timeout_seconds.
func TestRunMessage(t *testing.T) {
	o := &options{timeout: duration(time.Second), maxTimeout: duration(5 * time.Second), memory: 512 << 20}
	for _, tc := range []struct {
		res       engine.Result
		want, not string
	}{
		{engine.Result{Status: engine.StatusTimeout, Message: "the run exceeded its 1s timeout ...; pass a larger timeout_seconds (at most 5 seconds on this server)"},
			"exceeded its 1s timeout (--timeout) and every process it started was killed; make the code faster or pass a larger --timeout (at most --max-timeout, 5s)", "timeout_seconds"},
		{engine.Result{Status: engine.StatusMemoryLimit, Message: "the run exceeded the 512 MiB memory limit"}, "512MiB memory limit (--memory)", ""},
		{engine.Result{Status: engine.StatusKilled, Message: "pass a larger timeout_seconds"}, "pass a larger --timeout", "timeout_seconds"},
		// run's user is the operator an agent is sent to.
		{engine.Result{Status: engine.StatusInstallError, Message: "cannot install x: the package index could not be reached (a). " + deps.UnreachableAdvice},
			"cannot install x: the package index could not be reached (a). This machine cannot reach the package index. Give run one it can reach: --index-url", "operator"},
	} {
		got := o.runMessage(&tc.res)
		if !strings.Contains(got, tc.want) || tc.not != "" && strings.Contains(got, tc.not) {
			t.Errorf("%s: %q, want %q", tc.res.Status, got, tc.want)
		}
	}
	o.timeout = o.maxTimeout
	if got := o.runMessage(&engine.Result{Status: engine.StatusTimeout}); !strings.Contains(got, "pass a larger --timeout, and --max-timeout with it") {
		t.Errorf("at the maximum: %q", got)
	}
}

// TestFlagsAreDocumented: every flag a command's -h lists is in
// docs/commands.md, where a user looks them up, so the two cannot drift
// apart again (bench's --concurrency and --baseline, and seven of serve's,
// were only in -h or in another page).
func TestFlagsAreDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/commands.md")
	if err != nil {
		t.Fatal(err)
	}
	flagRE := regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`)
	for _, c := range commands {
		var out, errb bytes.Buffer
		Main(append(strings.Fields(c.name), "-h"), strings.NewReader(""), &out, &errb)
		for _, m := range flagRE.FindAllStringSubmatch(out.String()+errb.String(), -1) {
			name := "--" + m[1]
			if len(m[1]) == 1 {
				name = "-" + m[1]
			}
			if !regexp.MustCompile(regexp.QuoteMeta(name) + `\b`).Match(doc) {
				t.Errorf("pysandbox %s -h lists %s, which docs/commands.md does not mention", c.name, name)
			}
		}
	}
}
