package tools

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/deps"
	"github.com/pysandbox/pysandbox/internal/egress"
	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/interp"
	"github.com/pysandbox/pysandbox/internal/sandbox"
	"github.com/pysandbox/pysandbox/internal/testutil/pypi"
)

func TestDependenciesOverMCP(t *testing.T) {
	idx := pypi.NewIndex(t,
		pypi.Package{Name: "pysbx-gamma", Version: "2.0.0", Requires: []string{"pysbx-delta"}},
		pypi.Package{Name: "pysbx-delta", Version: "0.5.0"})
	var mu sync.Mutex
	var progress []string
	cs := connectWith(t, func(c *engine.Config) {
		c.Interpreters = interp.Discover(context.Background())
		cache, err := deps.New(deps.Config{Dir: t.TempDir(), Index: deps.IndexConfig{IndexURL: idx.URL}, Backend: sandbox.NewNative(), Limits: c.Limits, Network: egress.New(egress.Config{}).Installer})
		if err != nil {
			t.Fatal(err)
		}
		c.Deps = cache
	}, nil, &mcp.ClientOptions{ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
		mu.Lock()
		progress = append(progress, req.Params.Message)
		mu.Unlock()
	}})
	ctx := context.Background()

	// run_python with dependencies, asking for progress.
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Meta: mcp.Meta{"progressToken": "t1"},
		Arguments: map[string]any{"code": "import pysbx_gamma, pysbx_delta\n[pysbx_gamma.VALUE, pysbx_delta.VALUE]", "dependencies": []any{"pysbx-gamma"}}})
	if err != nil || res.IsError {
		t.Fatalf("%v %s", err, text(res))
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		got := strings.Join(progress, "\n")
		mu.Unlock()
		if strings.Contains(got, "pysbx-gamma") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no progress notification naming the package; got %q", got)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// An unknown package: install_error, with the reason.
	res, out := call(t, cs, "run_python", map[string]any{"code": "1", "dependencies": []any{"pysbx-nonexistent"}})
	if !res.IsError || out["status"] != "install_error" || !strings.Contains(text(res), "pysbx-nonexistent") {
		t.Fatalf("unknown package: %s %v", text(res), out)
	}

	// A direct URL requirement is the caller's to change: invalid_request,
	// not a failed sandbox.
	res, out = call(t, cs, "run_python", map[string]any{"code": "1", "dependencies": []any{"six @ https://x.example/six.whl"}})
	if !res.IsError || out["status"] != "invalid_request" || !strings.HasPrefix(text(res), `requirement "six @ https://x.example/six.whl": direct URL requirements`) {
		t.Errorf("a URL requirement: %s %v", text(res), out["status"])
	}

	// A session with one package, then install_package for another.
	res, out = call(t, cs, "create_session", map[string]any{"dependencies": []any{"pysbx-delta"}})
	if res.IsError {
		t.Fatal(text(res))
	}
	id := out["session_id"].(string)
	res, _ = call(t, cs, "install_package", map[string]any{"session_id": id, "packages": []any{"pysbx-gamma"}})
	if res.IsError {
		t.Fatal(text(res))
	}
	res, out = call(t, cs, "run_python", map[string]any{"session_id": id, "code": "import pysbx_gamma\npysbx_gamma.VALUE"})
	if res.IsError || out["return_value"] != "pysbx-gamma-2.0.0" {
		t.Fatalf("after install_package: %s", text(res))
	}
	res, out = call(t, cs, "install_package", map[string]any{"session_id": id, "packages": []any{"pysbx-nonexistent"}})
	// What failed, the next step, and no Go package prefix.
	if !res.IsError || !strings.HasPrefix(text(res), "install_error: cannot install pysbx-nonexistent: ") ||
		!strings.Contains(text(res), "Check the requirement's name") || out["status"] != "install_error" || strings.HasPrefix(fmt.Sprint(out["message"]), "deps:") {
		t.Fatalf("install_package of an unknown package: %s %v", text(res), out)
	}
	// pip's lines once, not again below the summary that holds them.
	if n := strings.Count(text(res), "No matching distribution found"); n != 1 {
		t.Errorf("pip's line %d times in the answer:\n%s", n, text(res))
	}
}
