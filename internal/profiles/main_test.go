package profiles

import (
	"context"
	"encoding/json"
	"flag"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/audit"
	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/policy"
	"github.com/pysandbox/pysandbox/internal/sandbox"
	"github.com/pysandbox/pysandbox/internal/testutil/enginetest"
	"github.com/pysandbox/pysandbox/internal/testutil/pypi"
	"github.com/pysandbox/pysandbox/internal/tools"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

func TestMain(m *testing.M) {
	// The native backend re-executes this test binary as the sandbox init.
	sandbox.InitMain()
	os.Exit(m.Run())
}

// serverOpts adjust a test server.
type serverOpts struct {
	policy  string // JSON; "" allows everything
	index   *pypi.Index
	popts   Options
	timeout time.Duration // the default timeout; 0: 20 s
	audit   string        // an audit log to write, "" for none
	output  int           // bytes kept per stream; 0: 16 KiB
	facts   int           // code facts kept (govern.Config.FactsCache); 0: none
}

// connect serves spec's profiles on the real native sandbox and returns a
// real SDK client session to it.
func connect(t testing.TB, spec string, so serverOpts) *mcp.ClientSession {
	t.Helper()
	ctx := context.Background()
	cfg := enginetest.Config(t)
	cfg.MaxOutput = 16 << 10 // small: the goldens hold a cut output
	cfg.MaxConcurrent, cfg.MaxQueue = 8, 16
	if so.output > 0 {
		cfg.MaxOutput = so.output
	}
	if so.timeout > 0 {
		cfg.DefaultTimeout = so.timeout
	}
	if so.index != nil {
		cfg.Deps = enginetest.Deps(t, so.index.URL, cfg.Limits)
	}
	eng, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	profs, native, err := Select(spec, so.popts)
	if err != nil {
		t.Fatal(err)
	}
	pol := policy.AllowAll()
	if so.policy != "" {
		if pol, err = policy.Parse([]byte(so.policy), "test.json", ToolNames(profs, native)); err != nil {
			t.Fatal(err)
		}
	}
	sessions := eng.NewSessions(engine.SessionConfig{MaxSessions: 4})
	t.Cleanup(sessions.Shutdown)
	gov := tools.Governance{Policy: pol, FactsCache: so.facts}
	if so.audit != "" {
		w, err := audit.Open(so.audit, audit.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { w.Close() })
		gov.Audit = w
	}
	srv := tools.NewServer(tools.Options{Engine: eng, Sessions: sessions, Profiles: profs, NoNative: !native,
		Governance: gov, Logger: slog.New(slog.DiscardHandler)})
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "peer-client", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// callText calls a tool and returns its text and the whole result.
func callText(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) (string, *mcp.CallToolResult) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String(), res
}

// volatile are the parts of a transcript that change from run to run.
var volatile = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`duration_ms: \d+`), "duration_ms: N"},
	{regexp.MustCompile(`"end_time": [0-9.e+]+`), `"end_time": T`},
	{regexp.MustCompile(`s-[0-9a-f]{8,}`), "s-ID"},
	{regexp.MustCompile(`session:[0-9A-Za-z_-]+`), "session:ID"},
	{regexp.MustCompile(`sandbox_id": "[^"]+"`), `sandbox_id": "ID"`},
	{regexp.MustCompile(`pysandbox://sessions/[^/]+/`), "pysandbox://sessions/ID/"},
	// mcp-run-python names the server's default interpreter.
	{regexp.MustCompile(`executed with Python 3\.\d+\.`), "executed with Python 3.X."},
}

func normalize(s string) string {
	for _, v := range volatile {
		s = v.re.ReplaceAllString(s, v.with)
	}
	return s
}

// golden compares got with testdata/NAME, or writes it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	got = normalize(got)
	if *update {
		os.MkdirAll(filepath.Dir(path), 0o755)
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if string(want) != got {
		t.Errorf("%s differs from the golden file (run with -update if the change is meant):\n--- want\n%s\n--- got\n%s", name, want, got)
	}
}

// toolsList is tools/list as a peer's client sees it: names, titles,
// descriptions, input and output schemas.
func toolsList(t *testing.T, cs *mcp.ClientSession) string {
	t.Helper()
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.MarshalIndent(res.Tools, "", "  ")
	return string(b) + "\n"
}

func connectB(b *testing.B, spec string) *mcp.ClientSession { return connect(b, spec, serverOpts{}) }

func callParams(tool, arg, code string) *mcp.CallToolParams {
	return &mcp.CallToolParams{Name: tool, Arguments: map[string]any{arg: code}}
}
