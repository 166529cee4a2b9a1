package tools

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/interp"
	"github.com/pysandbox/pysandbox/internal/sandbox"
)

func TestMain(m *testing.M) {
	// The native backend re-executes this test binary as the sandbox init.
	sandbox.InitMain()
	os.Exit(m.Run())
}

// connect starts a server with the real native sandbox and returns a real
// SDK client session to it over in-memory transports.
func connect(t *testing.T, mod func(*engine.Config)) *mcp.ClientSession {
	t.Helper()
	return connectWith(t, mod, nil)
}

// connectWith is connect with the tools' options adjusted too.
func connectWith(t *testing.T, mod func(*engine.Config), opt func(*Options), clientOpts ...*mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	var copts *mcp.ClientOptions
	if len(clientOpts) > 0 {
		copts = clientOpts[0]
	}
	return connectFull(t, mod, opt, copts, nil)
}

// connectFull is connectWith with the client session's options too (to
// speak an older protocol version).
func connectFull(t testing.TB, mod func(*engine.Config), opt func(*Options), copts *mcp.ClientOptions, sopts *mcp.ClientSessionOptions) *mcp.ClientSession {
	t.Helper()
	ctx := context.Background()
	srv := newServer(t, mod, opt)
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	client := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, copts)
	cs, err := client.Connect(ctx, ct, sopts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// newServer is an MCP server over the real native sandbox, with small
// limits; mod and opt adjust the engine's and the tools' options.
func newServer(t testing.TB, mod func(*engine.Config), opt func(*Options)) *mcp.Server {
	t.Helper()
	opts := Options{Engine: newEngine(t, mod), Logger: slog.New(slog.DiscardHandler)}
	if opt != nil {
		opt(&opts)
	}
	return NewServer(opts)
}

// newEngine is the engine of newServer.
func newEngine(t testing.TB, mod func(*engine.Config)) *engine.Engine {
	t.Helper()
	py, err := interp.Find(context.Background(), "")
	if err != nil {
		t.Fatalf("no python3: %v", err)
	}
	cfg := engine.Config{
		Backend:        sandbox.NewNative(),
		Python:         py,
		Limits:         sandbox.Limits{MemoryBytes: 256 << 20, MaxProcs: 64, TmpBytes: 64 << 20},
		DefaultTimeout: 20 * time.Second,
		MaxTimeout:     60 * time.Second,
		MaxOutput:      64 << 10,
		MaxConcurrent:  8,
		MaxQueue:       16,
	}
	if mod != nil {
		mod(&cfg)
	}
	eng, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return eng
}

// call calls a tool and decodes its structured content into a map.
func call(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) (*mcp.CallToolResult, map[string]any) {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: protocol error: %v", name, err)
	}
	out, _ := res.StructuredContent.(map[string]any)
	return res, out
}

func text(res *mcp.CallToolResult) string {
	var s string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			s += tc.Text
		}
	}
	return s
}

func readHostFile(p string) (string, error) {
	b, err := os.ReadFile(p)
	return string(b), err
}
