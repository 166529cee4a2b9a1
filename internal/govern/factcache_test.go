package govern

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/codefacts"
	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/interp"
	"github.com/pysandbox/pysandbox/internal/policy"
	"github.com/pysandbox/pysandbox/internal/sandbox"
)

// socketFacts are facts as codefacts.Facts.Value gives them.
func socketFacts() map[string]any {
	return map[string]any{"bytes": json.Number("13"), "imports": []any{"socket"}, "dynamic_code": nil, "syntax_error": nil}
}

// TestFactsCacheKeys: facts come back only for the same caller, the same
// interpreter and the same code, and as a copy: what a caller does with
// them (or with the map it put in) changes nothing for the next one.
func TestFactsCacheKeys(t *testing.T) {
	c := newFactsCache(8)
	given := socketFacts()
	c.put(newFactKey("alice", "", "import socket"), given, "imports: socket")
	for _, k := range []factKey{
		newFactKey("bob", "", "import socket"),
		newFactKey("alice", "3.12", "import socket"),
		newFactKey("alice", "", "import socket "),
		newFactKey("", "", "import socket"),
	} {
		if f, _, ok := c.get(k); ok {
			t.Errorf("%q %q: got alice's facts %v", k.identity, k.python, f)
		}
	}
	got, summary, ok := c.get(newFactKey("alice", "", "import socket"))
	if !ok || summary != "imports: socket" || !reflect.DeepEqual(got, socketFacts()) {
		t.Fatalf("alice's own: %v %q %v", ok, summary, got)
	}
	// Neither the map put in nor one taken out is the cache's.
	given["imports"].([]any)[0] = "os"
	got["imports"].([]any)[0] = "os"
	got["imports"] = nil
	delete(got, "bytes")
	if again, _, _ := c.get(newFactKey("alice", "", "import socket")); !reflect.DeepEqual(again, socketFacts()) {
		t.Errorf("changed through a copy: %v", again)
	}
	// Facts of an analysis that gave up may say otherwise next time.
	c.put(newFactKey("alice", "", "deep"), map[string]any{"dynamic_code": []any{"unanalysable"}}, "")
	if _, _, ok := c.get(newFactKey("alice", "", "deep")); ok {
		t.Error("unanalysable facts were kept")
	}
	// No cache: nothing kept, nothing found.
	var none *factsCache
	none.put(newFactKey("alice", "", "x"), socketFacts(), "")
	if _, _, ok := none.get(newFactKey("alice", "", "x")); ok {
		t.Error("a nil cache found facts")
	}
}

// TestFactsCacheBounded: the cache holds at most its entries, at most
// factsCacheBytes in all and no entry over maxFactsEntryBytes, least
// recently used out first, each for factsCacheTTL.
func TestFactsCacheBounded(t *testing.T) {
	c := newFactsCache(64)
	for i := range 1000 {
		c.put(newFactKey("alice", "", fmt.Sprint(i)), socketFacts(), "")
		if c.len() > 64 {
			t.Fatalf("%d entries after %d puts", c.len(), i+1)
		}
	}
	if _, _, ok := c.get(newFactKey("alice", "", "999")); !ok {
		t.Error("the newest entry is gone")
	}
	if _, _, ok := c.get(newFactKey("alice", "", "0")); ok {
		t.Error("the oldest entry is still there")
	}
	// Large facts: the bytes bound, not the count, holds them.
	big := newFactsCache(100000)
	imports := make([]any, 0, 150)
	for i := range 150 {
		imports = append(imports, fmt.Sprintf("%060d", i))
	}
	for i := range 2000 {
		big.put(newFactKey("alice", "", fmt.Sprint(i)), map[string]any{"imports": imports}, "")
		if big.size() > factsCacheBytes {
			t.Fatalf("%d bytes after %d puts", big.size(), i+1)
		}
	}
	if big.len() == 0 || big.len() >= 2000 {
		t.Errorf("%d entries of about 14 KiB", big.len())
	}
	huge := append(imports, imports...)
	big.put(newFactKey("alice", "", "huge"), map[string]any{"imports": huge}, "")
	if _, _, ok := big.get(newFactKey("alice", "", "huge")); ok {
		t.Error("an entry over maxFactsEntryBytes was kept")
	}
	// Expired entries are derived again.
	now := time.Now()
	c.now = func() time.Time { return now }
	c.put(newFactKey("alice", "", "old"), socketFacts(), "")
	now = now.Add(factsCacheTTL)
	if _, _, ok := c.get(newFactKey("alice", "", "old")); ok {
		t.Error("an expired entry was used")
	}
}

// TestFactsCacheWithRealSandboxes: facts derived in real sandboxes by
// Python's parser, through a run's gate and through an analysis of its
// own. A caller's second call of the same code is decided before its run
// (no gate); another caller, or other code, is not decided on them; a run
// whose sandbox had packages, or whose facts failed, leaves nothing.
func TestFactsCacheWithRealSandboxes(t *testing.T) {
	eng := newTestEngine(t)
	pol, err := policy.Parse([]byte(`{"version": "1", "default": "allow", "tools": {"run_python": {
		"deny_if": [{"conditions": [{"path": "code.imports", "op": "contains", "value": "socket"}], "on_deny": "no sockets"}]}}}`), "p.json", testTools)
	if err != nil {
		t.Fatal(err)
	}
	derived := 0
	g := New(Config{Policy: pol, FactsCache: 16}, Sandbox{
		Facts: func(ctx context.Context, code, python string) (map[string]any, string, error) {
			derived++
			f, err := codefacts.Derive(ctx, eng, code, python)
			if err != nil {
				return nil, "", err
			}
			return f.Value(), f.Summary(), nil
		},
		FromRun: func(raw json.RawMessage, code string) (map[string]any, string, error) {
			var line string
			if json.Unmarshal(raw, &line) == nil {
				raw = json.RawMessage(line)
			}
			f, err := codefacts.FromLine(string(raw), code)
			if err != nil {
				return nil, "", err
			}
			return f.Value(), f.Summary(), nil
		},
	}, nil)
	type outcome struct {
		gated   bool   // decided in the run's sandbox
		refused string // why not run, or ""
	}
	run := func(who, code string, s Subject) outcome {
		t.Helper()
		args, _ := json.Marshal(map[string]any{"code": code})
		ctx, tk, ref := g.Admit(context.Background(), Call{Tool: "run_python", Identity: who, Args: args})
		if ref != nil {
			t.Fatalf("admit: %v", ref)
		}
		s.Kind, s.Code = KindRun, code
		v := tk.Check(ctx, s, Approver{})
		o := outcome{gated: v.Gate != nil}
		if v.Refusal != nil {
			tk.End(Outcome{Refused: v.Refusal})
			o.refused = v.Refusal.Message
			return o
		}
		res, err := eng.Run(ctx, engine.RunRequest{Code: code, Gate: v.Gate})
		if err != nil {
			t.Fatal(err)
		}
		if a := tk.AfterRun(ctx, true); a != nil && a.Refusal != nil {
			o.refused = a.Refusal.Message
		} else if res.Status != engine.StatusSuccess {
			t.Fatalf("%s: %s %s %+v", code, res.Status, res.Message, res.Error)
		}
		tk.End(Outcome{Status: string(res.Status)})
		return o
	}
	sock := "import socket\nprint('connected')"
	// The first call's facts come from its run's own sandbox.
	if o := run("alice", sock, Subject{}); !o.gated || !strings.Contains(o.refused, "no sockets") {
		t.Fatalf("alice's first call: %+v", o)
	}
	// Her second is decided on them before anything runs.
	if o := run("alice", sock, Subject{}); o.gated || !strings.Contains(o.refused, "no sockets") {
		t.Fatalf("alice's second call: %+v", o)
	}
	// Another caller's is not: its own run's sandbox says.
	if o := run("bob", sock, Subject{}); !o.gated || !strings.Contains(o.refused, "no sockets") {
		t.Fatalf("bob's call: %+v", o)
	}
	// Other code is not decided on these facts, even a byte away, nor on
	// another interpreter's.
	if o := run("alice", sock+" ", Subject{}); !o.gated {
		t.Fatalf("other code: %+v", o)
	}
	if o := run("alice", "print('hi')", Subject{}); !o.gated || o.refused != "" {
		t.Fatalf("harmless code: %+v", o)
	}
	if o := run("alice", "print('hi')", Subject{}); o.gated || o.refused != "" {
		t.Fatalf("harmless code again: %+v", o)
	}
	// A session's code is analysed in a sandbox of its own, which the
	// session's code never touched: those facts are kept too.
	sess := "import socket as s\ns"
	if o := run("alice", sess, Subject{Session: "s-1"}); o.gated || !strings.Contains(o.refused, "no sockets") || derived != 1 {
		t.Fatalf("session call: %+v, derived %d times", o, derived)
	}
	if o := run("alice", sess, Subject{Session: "s-1"}); !strings.Contains(o.refused, "no sockets") || derived != 1 {
		t.Fatalf("session call again: %+v, derived %d times", o, derived)
	}
	if o := run("carol", sess, Subject{Session: "s-2"}); !strings.Contains(o.refused, "no sockets") || derived != 2 {
		t.Fatalf("carol's session call: %+v, derived %d times", o, derived)
	}
	// A run with packages starts an interpreter whose packages can run
	// code before its worker's parser (a .pth file): its facts are used
	// for that run only.
	g.facts = newFactsCache(16)
	if o := run("alice", "print(1)", Subject{Packages: []string{"numpy"}}); !o.gated {
		t.Fatalf("with packages: %+v", o)
	}
	if g.facts.len() != 0 {
		t.Errorf("the facts of a run with packages were kept")
	}
	// A run of other code than the call's (a tool running a program of
	// its own for it): its facts neither decide the call nor are kept
	// for the call's code.
	args, _ := json.Marshal(map[string]any{"code": sock})
	ctx, tk, ref := g.Admit(context.Background(), Call{Tool: "run_python", Identity: "dave", Args: args})
	if ref != nil {
		t.Fatal(ref)
	}
	v := tk.Check(ctx, Subject{Kind: KindRun, Code: sock}, Approver{})
	if v.Gate == nil {
		t.Fatalf("dave's call: %+v", v)
	}
	if res, err := eng.Run(ctx, engine.RunRequest{Code: "print('other code')", Gate: v.Gate}); err == nil && (res.Status == engine.StatusSuccess || res.Stdout != "") {
		t.Errorf("a gated call ran other code than its own: %+v", res)
	}
	if a := tk.AfterRun(ctx, true); a == nil || a.Refusal == nil || !strings.Contains(a.Refusal.Message, "ran other code than the code it was asked to decide") {
		t.Errorf("after a run of other code: %+v", a)
	}
	tk.End(Outcome{})
	if g.facts.len() != 0 {
		t.Errorf("the facts of other code were kept for the call's code")
	}
	// Callers the server cannot tell apart (one shared identity) keep
	// nothing: how soon a call is decided would tell one of them what
	// code another sent.
	for i := range 2 {
		ctx, tk, ref := g.Admit(context.Background(), Call{Tool: "run_python", Identity: "http:anonymous", Args: args, Shared: true})
		if ref != nil {
			t.Fatal(ref)
		}
		if v := tk.Check(ctx, Subject{Kind: KindRun, Code: sock}, Approver{}); v.Gate == nil {
			t.Fatalf("shared identity, call %d: %+v", i, v)
		} else if _, err := eng.Run(ctx, engine.RunRequest{Code: sock, Gate: v.Gate}); err != nil {
			t.Fatal(err)
		}
		tk.AfterRun(ctx, true)
		tk.End(Outcome{})
	}
	if g.facts.len() != 0 {
		t.Errorf("a shared identity's facts were kept")
	}
}

func newTestEngine(t *testing.T) *engine.Engine {
	t.Helper()
	py, err := interp.Find(context.Background(), "")
	if err != nil {
		t.Fatalf("no python3: %v", err)
	}
	eng, err := engine.New(engine.Config{
		Backend:        sandbox.NewNative(),
		Python:         py,
		Limits:         sandbox.Limits{MemoryBytes: 256 << 20, MaxProcs: 64, TmpBytes: 64 << 20},
		DefaultTimeout: 30 * time.Second,
		MaxTimeout:     time.Minute,
		MaxOutput:      64 << 10,
		MaxConcurrent:  4,
		MaxQueue:       16,
	})
	if err != nil {
		t.Fatal(err)
	}
	return eng
}
