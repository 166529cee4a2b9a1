package worker_test

import (
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/deps"
	"github.com/pysandbox/pysandbox/internal/egress"
	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/interp"
	"github.com/pysandbox/pysandbox/internal/pool"
	"github.com/pysandbox/pysandbox/internal/sandbox"
	"github.com/pysandbox/pysandbox/internal/testutil/pypi"
	"github.com/pysandbox/pysandbox/internal/worker"
)

func TestMain(m *testing.M) {
	// The native backend re-executes this test binary as the sandbox init
	// (TestToolsNameReserved runs real sandboxes).
	sandbox.InitMain()
	os.Exit(m.Run())
}

// shadowHook runs from the wheel's .pth file when the environment is put
// on sys.path: it tries to import pysandbox_tools before any run (and
// records what it got), then puts a finder of its own first in
// sys.meta_path that would serve the wheel's copy.
const shadowHook = `
import os, sys
seen = []
try:
    import pysandbox_tools
    seen.append(getattr(pysandbox_tools, "SHADOW", "built-in"))
except ImportError:
    seen.append("ImportError")

class ShadowFinder(object):
    def find_spec(self, name, path=None, target=None):
        if name != "pysandbox_tools":
            return None
        import importlib.util
        return importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(__file__), "pysandbox_tools", "__init__.py"))

sys.meta_path.insert(0, ShadowFinder())
`

// shadowTools is a dependency that ships both names of the tools module,
// and a .pth hook that tries to plant its own.
var shadowTools = pypi.Package{Name: "pysbx-shadow-tools", Version: "1.0.0", Files: map[string]string{
	"pysandbox_tools/__init__.py": "SHADOW = 'dependency'\n",
	"tools/__init__.py":           "SHADOW = 'dependency'\n",
	"pysbx_shadow_hook.py":        shadowHook,
	"pysbx-shadow-tools.pth":      "import pysbx_shadow_hook\n",
}}

// echoTools serves one tool, t.echo.
type echoTools struct{}

func (echoTools) Catalog(context.Context) ([]worker.ToolSpec, []worker.ServerStatus) {
	return []worker.ToolSpec{{Name: "t.echo", Server: "t", Tool: "echo", InputSchema: json.RawMessage(`{"type":"object","properties":{"message":{"type":"string"}}}`)}},
		[]worker.ServerStatus{{Name: "t", Status: "ready", Tools: 1}}
}

func (echoTools) Call(ctx context.Context, name string, args json.RawMessage) worker.ToolReply {
	var a struct{ Message string }
	json.Unmarshal(args, &a)
	text, _ := json.Marshal([]map[string]string{{"type": "text", "text": "Echo: " + a.Message}})
	return worker.ToolReply{Content: text}
}

// withTools: pysandbox_tools is the built-in whatever the wheel did, and
// tools is the wheel's (as docs/upstream.md says).
const withTools = `
import os, sys, tools, pysandbox_tools
[os.path.basename(pysandbox_tools.__file__), getattr(pysandbox_tools, "SHADOW", None), pysandbox_tools.t.echo(message="hi"),
 tools.SHADOW, sys.modules["pysbx_shadow_hook"].seen]`

const wantWithTools = `["sandbox_tools.py",null,"Echo: hi","dependency",["ImportError"]]`

// withoutTools: in a run without tools the reserved name is not there,
// not the wheel's module either.
const withoutTools = `
import tools
try:
    import pysandbox_tools
    got = ["imported", getattr(pysandbox_tools, "SHADOW", None)]
except ModuleNotFoundError as e:
    got = str(e)
[tools.SHADOW, got]`

const wantWithoutTools = `["dependency","No module named 'pysandbox_tools'"]`

// TestToolsNameReserved: a dependency named pysandbox_tools, installed
// from an index by the real installer, shadows the built-in module in no
// kind of run: one-shot cold and pooled runs and sessions, where the
// workspace's own pysandbox_tools.py and install_package's copy do not
// either.
func TestToolsNameReserved(t *testing.T) {
	py, err := interp.Find(context.Background(), "")
	if err != nil {
		t.Skipf("no python3: %v", err)
	}
	idx := pypi.NewIndex(t, shadowTools)
	limits := sandbox.Limits{MemoryBytes: 256 << 20, MaxProcs: 64, TmpBytes: 64 << 20}
	cache, err := deps.New(deps.Config{Dir: t.TempDir(), Index: deps.IndexConfig{IndexURL: idx.URL}, Backend: sandbox.NewNative(),
		Limits: limits, Network: egress.New(egress.Config{}).Installer})
	if err != nil {
		t.Fatal(err)
	}
	cfg := engine.Config{
		Backend: sandbox.NewNative(), Python: py, Limits: limits, Deps: cache,
		DefaultTimeout: 20 * time.Second, MaxTimeout: time.Minute, MaxOutput: 1 << 20, MaxConcurrent: 4, MaxQueue: 16,
	}
	cold, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p, err := pool.New(context.Background(), pool.Config{Backend: cfg.Backend.(*sandbox.Native), Spec: cold.RunSpec(), MaxConcurrent: 4, MemoryBudget: 4 << 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	pcfg := cfg
	pcfg.Backend = p
	pooled, err := engine.New(pcfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // a hang guard
	defer cancel()
	dep := []string{shadowTools.Name}

	for name, e := range map[string]*engine.Engine{"cold": cold, "pooled": pooled} {
		t.Run(name, func(t *testing.T) {
			r, err := e.Run(ctx, engine.RunRequest{Code: withTools, Dependencies: dep, Tools: echoTools{}})
			wantReturn(t, r, err, wantWithTools)
			r, err = e.Run(ctx, engine.RunRequest{Code: withoutTools, Dependencies: dep})
			wantReturn(t, r, err, wantWithoutTools)
		})
	}

	t.Run("session", func(t *testing.T) {
		s := cold.NewSessions(engine.SessionConfig{})
		defer s.Shutdown()
		info, err := s.Create(ctx, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		// The workspace's own pysandbox_tools.py, first on sys.path.
		r, err := s.Run(ctx, info.ID, engine.RunRequest{Code: "open('pysandbox_tools.py', 'w').write('SHADOW = \"workspace\"\\n')", Tools: echoTools{}})
		wantReturn(t, r, err, "21")
		if _, err := s.Install(ctx, info.ID, dep, nil); err != nil {
			t.Fatal(err)
		}
		r, err = s.Run(ctx, info.ID, engine.RunRequest{Code: withTools, Tools: echoTools{}})
		wantReturn(t, r, err, wantWithTools)
	})
}

func wantReturn(t *testing.T, r *engine.Result, err error, want string) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(r.ReturnValue)
	if r.Status != engine.StatusSuccess || string(got) != want {
		t.Fatalf("%s %s: %s, want %s\nstderr:\n%s", r.Status, r.Message, got, want, r.Stderr)
	}
}
