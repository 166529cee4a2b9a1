package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/pydist"
	"github.com/pysandbox/pysandbox/internal/pydist/hostbuild"
	"github.com/pysandbox/pysandbox/internal/testutil/pypi"
)

// managedSetup is a loopback mirror serving an install_only archive of
// the system's python3, and download metadata naming it (as 3.X.Y) and,
// at the same URL, a 3.(X+1).0 that a policy can deny.
type managedSetup struct {
	archive  *hostbuild.Archive
	mirror   *hostbuild.Mirror
	path     string
	meta     string
	cacheDir string
	other    string // the version the metadata also names
}

func newManagedSetup(t *testing.T) *managedSetup {
	t.Helper()
	dir, err := os.MkdirTemp("", "pysandbox-archive-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	a, err := hostbuild.System(dir)
	if err != nil {
		t.Skipf("this machine's python3 cannot be made into a relocatable archive: %v", err)
	}
	s := &managedSetup{archive: a, mirror: hostbuild.NewMirror()}
	t.Cleanup(s.mirror.Close)
	s.path = "/pbs/20990101/" + a.Name()
	s.mirror.Put(s.path, a.Path)
	url := pydist.DefaultPrefix + "/20990101/" + a.Name()
	other := hostbuild.EntryOf(a, url)
	other.Minor, other.Patch = a.Minor+1, 0
	s.other = fmt.Sprintf("3.%d", other.Minor)
	s.meta = filepath.Join(t.TempDir(), "download-metadata.json")
	if err := os.WriteFile(s.meta, hostbuild.Metadata(hostbuild.EntryOf(a, url), other), 0o644); err != nil {
		t.Fatal(err)
	}
	// Outside /tmp: a sandbox has a /tmp of its own, over which an
	// interpreter below /tmp could not be mounted at its own path.
	s.cacheDir, err = os.MkdirTemp("/var/tmp", "pysandbox-cache-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(s.cacheDir) })
	return s
}

// flags are serve's flags for the setup: only managed interpreters serve
// a run that names a version, so the host's own 3.X is not used.
func (s *managedSetup) flags() []string {
	return []string{"--cache-dir", s.cacheDir, "--python-downloads-json-url", s.meta,
		"--python-install-mirror", s.mirror.URL + "/pbs", "--python-preference", "only-managed"}
}

// runOut is a call's text and structured output.
func runOut(t *testing.T) func(*mcp.CallToolResult, error) (string, map[string]any) {
	return func(res *mcp.CallToolResult, err error) (string, map[string]any) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		out, _ := res.StructuredContent.(map[string]any)
		var text strings.Builder
		for _, c := range res.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				text.WriteString(tc.Text)
			}
		}
		return text.String(), out
	}
}

// An agent's python_version for a version the host does not have (as
// only-managed makes it) runs on a build downloaded from the mirror,
// verified, governed and recorded; pooled, cold, and with dependencies.
func TestServeManagedPython(t *testing.T) {
	s := newManagedSetup(t)
	idx := pypi.NewIndex(t, pypi.Package{Name: "pysbx-alpha", Version: "1.2.0"})
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	os.WriteFile(pol, []byte(fmt.Sprintf("version: \"1\"\ndefault: allow\npython:\n  deny: [%q]\n", s.other)), 0o600)
	auditLog := filepath.Join(t.TempDir(), "audit.log")
	ver := s.archive.MajorMinor()

	ctx, cs := serveStdio(t, append(s.flags(), "--index-url", idx.URL, "--policy", pol, "--audit-log", auditLog)...)
	probe := "import sys\nprint(sys.version_info[:3], sys.prefix)"
	text, out := runOut(t)(cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": probe, "python_version": ver}}))
	if out["status"] != "success" || !strings.Contains(text, s.cacheDir) || !strings.Contains(text, fmt.Sprintf("(3, %d, %d)", s.archive.Minor, s.archive.Patch)) {
		t.Fatalf("first run on the managed Python: %s", text)
	}
	// Again: installed, from the warm pool, not downloaded twice.
	text, out = runOut(t)(cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": probe, "python_version": ver}}))
	if out["status"] != "success" || !strings.Contains(text, s.cacheDir) {
		t.Fatalf("second run: %s", text)
	}
	if n := s.mirror.Hits(s.path); n != 1 {
		t.Errorf("mirror hits = %d, want 1", n)
	}
	// With dependencies, installed by the managed interpreter's own pip.
	text, out = runOut(t)(cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{
		"code": "import sys, pysbx_alpha\nprint(pysbx_alpha.VALUE, sys.prefix)", "python_version": ver, "dependencies": []string{"pysbx-alpha"}}}))
	if out["status"] != "success" || !strings.Contains(text, s.cacheDir) {
		t.Fatalf("run with dependencies: %s", text)
	}
	// A session on it.
	text, out = runOut(t)(cs.CallTool(ctx, &mcp.CallToolParams{Name: "create_session", Arguments: map[string]any{"python_version": ver}}))
	id, _ := out["session_id"].(string)
	if id == "" {
		t.Fatalf("create_session: %s", text)
	}
	text, out = runOut(t)(cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": probe, "session_id": id}}))
	if out["status"] != "success" || !strings.Contains(text, s.cacheDir) {
		t.Fatalf("session run: %s", text)
	}
	// A session keeps its Python: a run naming another is told so.
	text, out = runOut(t)(cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "1", "session_id": id, "python_version": "3.10"}}))
	if out["status"] != "invalid_request" || !strings.Contains(text, "runs Python "+s.archive.Version()) {
		t.Errorf("session run naming another Python: %s", text)
	}
	// requires-python names a version too: under only-managed, the
	// managed build serves it; validate_script says it would.
	pep723 := "# /// script\n# requires-python = \">=3." + fmt.Sprint(s.archive.Minor) + "\"\n# ///\n" + probe
	text, out = runOut(t)(cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": pep723}}))
	if out["status"] != "success" || !strings.Contains(text, s.cacheDir) {
		t.Errorf("requires-python run: %s", text)
	}
	text, out = runOut(t)(cs.CallTool(ctx, &mcp.CallToolParams{Name: "validate_script", Arguments: map[string]any{"code": pep723}}))
	if out["valid"] != true {
		t.Errorf("validate_script of a requires-python the managed build meets: %s", text)
	}
	// One only the denied version meets: validate_script says so.
	text, out = runOut(t)(cs.CallTool(ctx, &mcp.CallToolParams{Name: "validate_script", Arguments: map[string]any{"code": strings.Replace(pep723, ">=3."+fmt.Sprint(s.archive.Minor), ">="+s.other, 1)}}))
	if out["valid"] != false || !strings.Contains(text, "python.deny") {
		t.Errorf("validate_script of a requires-python only a denied version meets: %s", text)
	}
	text, out = runOut(t)(cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "1", "python_version": "banana"}}))
	if out["status"] != "invalid_request" || !strings.Contains(text, "is not one pysandbox runs") {
		t.Errorf("python_version banana: %s", text)
	}
	// The policy denies the other version before anything is downloaded.
	text, out = runOut(t)(cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "1", "python_version": s.other}}))
	if out["status"] != "denied" || !strings.Contains(text, "python.deny") {
		t.Errorf("denied version: %s", text)
	}
	if n := s.mirror.Hits(s.path); n != 1 {
		t.Errorf("mirror hits after a denied version = %d, want 1", n)
	}
	// A version nobody has: the answer lists what is possible.
	text, _ = runOut(t)(cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "1", "python_version": "3.99"}}))
	if !strings.Contains(text, "downloadable: "+s.archive.Version()) {
		t.Errorf("unknown version: %s", text)
	}
	// check_environment lists the installed version, and as downloadable
	// only what the policy allows.
	_, env := runOut(t)(cs.CallTool(ctx, &mcp.CallToolParams{Name: "check_environment", Arguments: map[string]any{}}))
	mp, _ := env["managed_pythons"].(map[string]any)
	if mp == nil || fmt.Sprint(mp["installed"]) != "["+s.archive.Version()+"]" || fmt.Sprint(mp["downloadable"]) != "["+s.archive.Version()+"]" || mp["mode"] != "automatic" || mp["preference"] != "only-managed" {
		t.Errorf("managed_pythons = %v", mp)
	}
	if gov, _ := env["governance"].(map[string]any); gov == nil || fmt.Sprint(gov["python_denied"]) != "["+s.other+"]" {
		t.Errorf("governance = %v", env["governance"])
	}
	cs.Close()

	// The audit log has the install, and its connection through the
	// proxy, for the caller that asked.
	var install, connect bool
	f, err := os.Open(auditLog)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r struct {
			Event, Tool, Decision string
			Detail                map[string]string
			Net                   *struct{ Host string }
		}
		json.Unmarshal(sc.Bytes(), &r)
		switch {
		case r.Event == "python" && r.Decision == "installed" && r.Detail["version"] == s.archive.Version() && r.Detail["sha256"] == s.archive.SHA256 && r.Detail["url"] == s.mirror.URL+s.path:
			install = true
		case r.Event == "connect" && r.Tool == "python-download" && r.Decision == "allow":
			connect = true
		}
	}
	if !install || !connect {
		t.Errorf("audit log: install record %v, connect record %v", install, connect)
	}

	// A cold server (no pool) on the same cache uses the installed build,
	// as its default too: --python 3.X under only-managed.
	ctx, cs = serveStdio(t, append(s.flags(), "--pool-size", "0", "--python", ver)...)
	text, out = runOut(t)(cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": probe}}))
	if out["status"] != "success" || !strings.Contains(text, s.cacheDir) {
		t.Fatalf("cold run: %s", text)
	}
	if n := s.mirror.Hits(s.path); n != 1 {
		t.Errorf("mirror hits after the cold server = %d, want 1", n)
	}
}

// pysandbox python list, install and remove; never mode.
func TestPythonCommand(t *testing.T) {
	s := newManagedSetup(t)
	ver := s.archive.MajorMinor()
	out, errOut, code := runBin(t, "", append([]string{"python", "install"}, append(s.flags(), ver)...)...)
	if code != 0 || !strings.Contains(out, "installed Python "+s.archive.Version()) || !strings.Contains(errOut, "SHA-256 verified") {
		t.Fatalf("install: %d\n%s\n%s", code, out, errOut)
	}
	out, _, code = runBin(t, "", append([]string{"python", "install"}, append(s.flags(), ver)...)...)
	if code != 0 || !strings.Contains(out, "already installed") {
		t.Fatalf("install again: %d %s", code, out)
	}
	out, _, code = runBin(t, "", append([]string{"python", "list"}, s.flags()...)...)
	if code != 0 || !strings.Contains(out, s.archive.Version()+"       managed") || !strings.Contains(out, s.other+".0") {
		t.Fatalf("list: %d\n%s", code, out)
	}
	out, _, code = runBin(t, "", append([]string{"cache", "ls"}, "--cache-dir", s.cacheDir)...)
	if code != 0 || !strings.Contains(out, "Python "+s.archive.Version()) {
		t.Errorf("cache ls: %d\n%s", code, out)
	}
	out, _, code = runBin(t, "", append([]string{"python", "remove"}, append(s.flags(), ver)...)...)
	if code != 0 || !strings.Contains(out, "removed Python "+s.archive.Version()) {
		t.Fatalf("remove: %d %s", code, out)
	}
	_, errOut, code = runBin(t, "", append([]string{"python", "remove"}, append(s.flags(), ver)...)...)
	if code != 1 || !strings.Contains(errOut, "no managed Python") {
		t.Errorf("remove again: %d %s", code, errOut)
	}
	_, errOut, code = runBin(t, "", append([]string{"python", "install", "--python-downloads", "never"}, append(s.flags(), ver)...)...)
	if code != 1 || !strings.Contains(errOut, "never") {
		t.Errorf("install in never mode: %d %s", code, errOut)
	}
	_, errOut, code = runBin(t, "", append([]string{"python", "install"}, append(s.flags(), "3.99")...)...)
	if code != 1 || !strings.Contains(errOut, "downloadable: ") {
		t.Errorf("install of an unknown version: %d %s", code, errOut)
	}
	// A download that fails says what to do about it, here a mirror that
	// is not there (a closed port).
	_, errOut, code = runBin(t, "", append([]string{"python", "install"}, append(s.flags(), "--python-install-mirror", "http://127.0.0.1:1/mirror", ver)...)...)
	if code != 1 || !strings.Contains(errOut, "could not download") || !strings.Contains(errOut, "check that the mirror (--python-install-mirror http://127.0.0.1:1/mirror) is reachable") {
		t.Errorf("install from a mirror that is down: %d %s", code, errOut)
	}
	_, errOut, code = runBin(t, "", "python", "install", "--python-downloads", "sometimes", ver)
	if code != 2 || !strings.Contains(errOut, "automatic, manual or never") {
		t.Errorf("bad mode: %d %s", code, errOut)
	}
	if n := s.mirror.Hits(s.path); n != 1 {
		t.Errorf("mirror hits = %d, want 1", n)
	}
}
