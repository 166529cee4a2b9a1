package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/pydist"
	"github.com/pysandbox/pysandbox/internal/pydist/hostbuild"
)

// Credentials the operator puts in --python-downloads-json-url and
// --python-install-mirror (user:token@host, as for an Artifactory
// mirror) reach those hosts and nothing else: not the agent's progress
// notifications, check_environment or refusals, not the audit log, not
// the cache's meta.json.
func TestManagedPythonCredentialsStayOut(t *testing.T) {
	s := newManagedSetup(t)
	ver := s.archive.MajorMinor()
	url := pydist.DefaultPrefix + "/20990101/" + s.archive.Name()
	bad := hostbuild.EntryOf(s.archive, url)
	bad.Minor, bad.Patch = s.archive.Minor+1, 0
	bad.SHA256 = strings.Repeat("ab", 32) // the mirror serves other bytes
	s.mirror.PutBytes("/meta.json", hostbuild.Metadata(hostbuild.EntryOf(s.archive, url), bad))
	host := strings.TrimPrefix(s.mirror.URL, "http://")
	metaURL := "http://alice:METATOKEN-123@" + host + "/meta.json"
	mirror := "http://bob:MIRRORTOKEN-456@" + host + "/pbs"
	auditLog := filepath.Join(t.TempDir(), "audit.log")

	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	var mu sync.Mutex
	var progress []string
	client := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			mu.Lock()
			progress = append(progress, r.Params.Message)
			mu.Unlock()
		}})
	cmd := exec.Command(binary(t), "serve", "--log-level", "error", "--cache-dir", s.cacheDir,
		"--python-downloads-json-url", metaURL, "--python-install-mirror", mirror,
		"--python-preference", "only-managed", "--audit-log", auditLog)
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()

	// 1. A run that downloads: its progress names the mirror, not its
	// token.
	params := &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "1", "python_version": ver}}
	params.SetProgressToken("p1")
	text, out := runOut(t)(cs.CallTool(ctx, params))
	if out["status"] != "success" {
		t.Fatalf("the run through the mirror with credentials: %s", text)
	}
	mu.Lock()
	got := strings.Join(progress, "\n")
	mu.Unlock()
	if strings.Contains(got, "MIRRORTOKEN") {
		t.Errorf("progress notifications to the agent carry the mirror's credentials:\n%s", got)
	}
	// 2. check_environment names the metadata URL as given.
	_, env := runOut(t)(cs.CallTool(ctx, &mcp.CallToolParams{Name: "check_environment", Arguments: map[string]any{}}))
	envJSON, _ := json.Marshal(env)
	if text = string(envJSON); strings.Contains(text, "METATOKEN") {
		i := strings.Index(text, "METATOKEN")
		t.Errorf("check_environment shows the metadata URL's credentials: …%s…", text[max(0, i-40):min(len(text), i+40)])
	}
	// 3. An archive that fails its digest: the message to the agent.
	text, _ = runOut(t)(cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "1", "python_version": "3." + itoa(bad.Minor)}}))
	if strings.Contains(text, "MIRRORTOKEN") {
		i := strings.Index(text, "MIRRORTOKEN")
		t.Errorf("the checksum refusal shown to the agent carries the mirror's credentials: …%s…", text[max(0, i-60):min(len(text), i+40)])
	}
	cs.Close()
	if b, _ := os.ReadFile(auditLog); strings.Contains(string(b), "MIRRORTOKEN") {
		t.Errorf("the audit log records the mirror's credentials")
	}
	metas, _ := filepath.Glob(filepath.Join(s.cacheDir, "envs", "*", "meta.json"))
	for _, m := range metas {
		if b, _ := os.ReadFile(m); strings.Contains(string(b), "MIRRORTOKEN") {
			t.Errorf("%s (world-readable cache) records the mirror's credentials", m)
		}
	}
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}

// A run_python call the policy's argument rule refuses (deny_if
// args.python_version) downloads nothing, even when the tool also has a
// rule on the code, which is decided in the run's own sandbox: the
// arguments are judged before it, and before anything is installed.
func TestManagedPythonRefusedBeforeDownload(t *testing.T) {
	s := newManagedSetup(t)
	ver := s.archive.MajorMinor()
	pol := filepath.Join(t.TempDir(), "policy.json")
	os.WriteFile(pol, []byte(`{"version": "1", "default": "allow", "tools": {"run_python": {"deny_if": [
  {"conditions": [{"path": "args.python_version", "op": "in", "value": ["`+ver+`"]}], "on_deny": "not for agents"},
  {"conditions": [{"path": "code.imports", "op": "contains", "value": "socket"}]}]}}}`), 0o600)
	ctx, cs := serveStdio(t, append(s.flags(), "--policy", pol)...)
	text, out := runOut(t)(cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "1", "python_version": ver}}))
	if out["status"] != "denied" {
		t.Fatalf("not denied: %s", text)
	}
	if n := s.mirror.Hits(s.path); n != 0 {
		envs, _ := filepath.Glob(filepath.Join(s.cacheDir, "envs", "*"))
		t.Errorf("the denied call downloaded the archive (%d hits) and left %v in the cache", n, envs)
	}
}
