package cli

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var updateSetup = flag.Bool("update-setup", false, "rewrite the golden files under testdata/setup/")

// runSetup runs `pysandbox setup ARGS` in dir, with the binary named
// /usr/local/bin/pysandbox, and returns its exit code and output with dir
// written DIR.
func runSetup(t *testing.T, dir string, args ...string) (int, string) {
	t.Helper()
	t.Chdir(dir)
	t.Setenv("HOME", "/home/u")
	t.Setenv("XDG_STATE_HOME", "/home/u/.local/state")
	var out bytes.Buffer
	code := Main(append([]string{"setup"}, args...), nil, &out, &out)
	return code, strings.ReplaceAll(out.String(), dir, "DIR")
}

func setupGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", "setup", name)
	if *updateSetup {
		os.MkdirAll(filepath.Dir(path), 0o755)
		os.WriteFile(path, []byte(got), 0o644)
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update-setup)", err)
	}
	if string(want) != got {
		t.Errorf("%s differs (run with -update-setup if meant):\n--- want\n%s\n--- got\n%s", name, want, got)
	}
}

// TestSetupChecksServeFlags: the flags after -- are serve's, checked as
// serve checks them: each refusal exits 2 with serve's own reason, and
// writes nothing.
func TestSetupChecksServeFlags(t *testing.T) {
	wd, _ := os.Getwd()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "bad-policy.json"), []byte(`{"tools": {"run_python": {"action": "maybe"}}}`), 0o600)
	os.WriteFile(filepath.Join(dir, "bad-upstream.json"), []byte(`{"mcpServers": {"x": {}}}`), 0o600)
	os.Mkdir(filepath.Join(dir, "adir"), 0o700)
	cfg := filepath.Join(dir, "mcp.json")
	var all strings.Builder
	for _, args := range [][]string{
		{"--bogus-flag"},
		{"--policy", "missing.json"},
		{"--policy", "bad-policy.json"},
		{"--policy", "adir"},
		{"--upstream", "bad-upstream.json"},
		{"--timeout", "10m"},
		{"--http", "127.0.0.1:8080"},
		{"--auth-token-file", "tokens"},
		{"--audit-log", "no/such/dir/audit.log"},
		{"stray"},
		{"-h"},
	} {
		code, out := runSetup(t, dir, append([]string{"cursor", "--write", "--file", cfg, "--"}, args...)...)
		all.WriteString("$ setup cursor --write -- " + strings.Join(args, " ") + "\n" + out)
		if code != 2 {
			t.Errorf("%q: exit %d, want 2\n%s", args, code, out)
		}
		if _, err := os.Lstat(cfg); err == nil {
			t.Fatalf("%q: the config was written", args)
		}
	}
	t.Chdir(wd)
	setupGolden(t, "bad-flags.txt", all.String())
}

// TestSetupAbsolutePaths: every file flag's value is absolute in the
// entry, whether the file exists (the policy) or not yet (the audit log,
// the cache), in either flag form; values that are no paths (a URL, a
// Python version, a number) are kept.
func TestSetupAbsolutePaths(t *testing.T) {
	wd, _ := os.Getwd()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "policy.yaml"), []byte("version: \"1\"\ndefault: allow\n"), 0o600)
	code, out := runSetup(t, dir, "codex", "--binary", "/usr/local/bin/pysandbox", "--",
		"--policy", "policy.yaml", "--audit-log=logs/../audit.log", "-cache-dir", "cache", "--find-links", "https://example.com/wheels",
		"--find-links=wheels", "--python", "3.12", "--max-timeout", "10m", "--audit-sync-each", "--memory", "1GiB")
	t.Chdir(wd)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, out)
	}
	setupGolden(t, "absolute-paths.txt", out)
}

// TestSetupStateDir: without --state-dir, each client's server (and each
// entry of one client) gets a state directory of its own below the
// default, since a directory serves one server at a time; one given is
// kept, and so is none.
func TestSetupStateDir(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"cursor"}, "--state-dir /home/u/.local/state/pysandbox/cursor"},
		{[]string{"codex"}, "/home/u/.local/state/pysandbox/codex"},
		{[]string{"cursor", "--name", "data"}, "--state-dir /home/u/.local/state/pysandbox/cursor-data "},
		{[]string{"cursor", "--name", "data/../x y"}, "--state-dir /home/u/.local/state/pysandbox/cursor-data____x_y."},
		{[]string{"cursor", "--name", strings.Repeat("n", 300)}, "/cursor-" + strings.Repeat("n", 48) + "."},
		{[]string{"cursor", "--", "--memory", "1GiB", "--state-dir", "s"}, "--state-dir DIR/s"},
		{[]string{"cursor", "--", "--state-dir=none"}, "--state-dir=none"},
		{[]string{"cursor", "--", "--state-dir="}, "--state-dir="},
		{[]string{"cursor", "--", "--container", "podman"}, "serve --container podman ]"},
	} {
		code, out := runSetup(t, dir, append([]string{"--binary", "/usr/local/bin/pysandbox"}, c.args...)...)
		flat := strings.Join(strings.Fields(strings.NewReplacer(`"`, "", ",", "").Replace(out)), " ")
		if code != 0 || !strings.Contains(flat, c.want) {
			t.Errorf("setup %q: exit %d, want %q in\n%s", c.args, code, c.want, out)
		}
		if want := 1 - strings.Count(c.want, "container"); strings.Count(out, "state-dir") != want {
			t.Errorf("setup %q: want one --state-dir:\n%s", c.args, out)
		}
	}
	// Names that differ only in what is dropped get directories apart.
	// A kept name that looks like another's with its digest stays apart.
	_, foo := runSetup(t, dir, "--binary", "/usr/local/bin/pysandbox", "cursor", "--name", "foo!")
	_, fooLike := runSetup(t, dir, "--binary", "/usr/local/bin/pysandbox", "cursor", "--name", "foo_-c0e0aaae")
	if !strings.Contains(foo, "cursor-foo_.c0e0aaae") || !strings.Contains(fooLike, "cursor-foo_-c0e0aaae\"") {
		t.Errorf("digests:\n%s\n%s", foo, fooLike)
	}
	_, ab1 := runSetup(t, dir, "--binary", "/usr/local/bin/pysandbox", "cursor", "--name", "a b")
	_, ab2 := runSetup(t, dir, "--binary", "/usr/local/bin/pysandbox", "cursor", "--name", "a/b")
	if dirOf := func(out string) string {
		_, d, _ := strings.Cut(out, "cursor-a_b")
		d, _, _ = strings.Cut(d, `"`)
		return d
	}; dirOf(ab1) == dirOf(ab2) {
		t.Errorf("two names, one directory:\n%s\n%s", ab1, ab2)
	}
	if code, out := runSetup(t, dir, "cursor", "--name", " "); code != 2 || !strings.Contains(out, "needs a name") {
		t.Errorf("an empty name: exit %d %s", code, out)
	}
	// A default that cannot be made is left to serve (where it is a
	// warning, not a refusal to start), with a warning now.
	t.Setenv("XDG_STATE_HOME", "/dev/null")
	var b bytes.Buffer
	code, out := Main([]string{"setup", "cursor"}, nil, &b, &b), b.String()
	if code != 0 || strings.Contains(out, `"--state-dir"`) || !strings.Contains(out, "/dev/null is not a directory") {
		t.Errorf("a default that cannot be made: exit %d\n%s", code, out)
	}
}

// TestSetupURL: --url gives each client that documents one a streamable
// HTTP entry with the token of --token-file; Claude Desktop, whose file
// takes none, is refused with what to do; serve flags, a bad URL or token
// file are refused.
func TestSetupURL(t *testing.T) {
	wd, _ := os.Getwd()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "token"), []byte("# the laptop's token\nlaptop 0123456789abcdef0123\n"), 0o600)
	os.WriteFile(filepath.Join(dir, "two"), []byte("a 0123456789abcdef0123\nb 0123456789abcdef4567\n"), 0o600)
	os.WriteFile(filepath.Join(dir, "short"), []byte("short\n"), 0o600)
	var all strings.Builder
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"claude-code", "--url", "https://sandbox.example.com/mcp", "--token-file", "token"}, 0},
		{[]string{"cursor", "--url", "https://sandbox.example.com/mcp", "--token-file", "token"}, 0},
		{[]string{"vscode", "--url", "http://127.0.0.1:8080/mcp"}, 0},
		{[]string{"codex", "--url", "https://sandbox.example.com/mcp", "--token-file", "token", "--max-timeout", "20m"}, 0},
		{[]string{"gemini", "--url", "https://sandbox.example.com/mcp", "--token-file", "token"}, 0},
		{[]string{"claude-desktop", "--url", "https://sandbox.example.com/mcp"}, 2},
		{[]string{"cursor", "--url", "http://10.1.2.3:8080/mcp", "--token-file", "token"}, 0},
		{[]string{"cursor", "--url", "sandbox.example.com/mcp"}, 2},
		{[]string{"cursor", "--url", "https://u:p@sandbox.example.com/mcp"}, 2},
		{[]string{"cursor", "--url", "https://sandbox.example.com/mcp", "--token-file", "two"}, 2},
		{[]string{"cursor", "--url", "https://sandbox.example.com/mcp", "--token-file", "short"}, 2},
		{[]string{"cursor", "--url", "https://sandbox.example.com/mcp", "--", "--policy", "p.json"}, 2},
		{[]string{"cursor", "--token-file", "token"}, 2},
	} {
		code, out := runSetup(t, dir, tc.args...)
		all.WriteString("$ setup " + strings.Join(tc.args, " ") + "\n" + out + "\n")
		if code != tc.code {
			t.Errorf("%q: exit %d, want %d\n%s", tc.args, code, tc.code, out)
		}
	}
	// --write puts it in the file; the file, new, is the user's alone.
	cfg := filepath.Join(dir, "mcp.json")
	if code, out := runSetup(t, dir, "cursor", "--write", "--file", cfg, "--url", "https://sandbox.example.com/mcp", "--token-file", "token"); code != 0 {
		t.Fatalf("--write: %d %s", code, out)
	}
	if st, _ := os.Stat(cfg); st.Mode().Perm() != 0o600 {
		t.Errorf("the new config's mode is %v", st.Mode().Perm())
	}
	if data, _ := os.ReadFile(cfg); !strings.Contains(string(data), `"Authorization": "Bearer 0123456789abcdef0123"`) {
		t.Errorf("the written entry:\n%s", data)
	}
	t.Chdir(wd)
	setupGolden(t, "url.txt", all.String())
}

// TestServeFileFlags: every serve flag that names a file or directory is
// one setup makes absolute.
func TestServeFileFlags(t *testing.T) {
	fs, _ := newServeFlags(nil)
	fs.VisitAll(func(f *flag.Flag) {
		u := strings.ToLower(f.Usage)
		looksLikePath := strings.HasSuffix(f.Name, "-file") || strings.HasSuffix(f.Name, "-dir") || strings.HasSuffix(f.Name, "-log") ||
			strings.HasSuffix(f.Name, "-cert") || strings.HasSuffix(f.Name, "-key") || strings.Contains(u, "directory") || strings.Contains(u, "a path") || strings.Contains(u, "(a file")
		if looksLikePath && !serveFileFlags[f.Name] {
			t.Errorf("--%s may name a file (%q): add it to serveFileFlags, or tell this test why not", f.Name, f.Usage)
		}
	})
	for _, name := range []string{"policy", "upstream"} {
		if !serveFileFlags[name] {
			t.Errorf("--%s is missing from serveFileFlags", name)
		}
	}
	for name := range serveFileFlags {
		if fs.Lookup(name) == nil {
			t.Errorf("serveFileFlags names --%s, which serve does not have", name)
		}
	}
}
