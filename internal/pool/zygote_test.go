package pool

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/worker"
)

// splitSpawn runs the zygote's own _spawn_id (worker.py) on each line and
// returns what it made of them: [id as quoted, uid or null, rest].
func splitSpawn(t *testing.T, lines [][]byte) [][3]any {
	t.Helper()
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		t.Skip("no /usr/bin/python3")
	}
	script := filepath.Join(t.TempDir(), "worker.py")
	if err := os.WriteFile(script, worker.Source, 0o444); err != nil {
		t.Fatal(err)
	}
	const harness = `import sys, types, json
m = types.ModuleType("w"); m.__file__ = sys.argv[1]; sys.modules["w"] = m
exec(compile(open(sys.argv[1]).read(), sys.argv[1], "exec"), m.__dict__)
out = []
for line in sys.stdin.buffer.read().split(b"\n")[:-1]:
    rid, uid, rest = m._spawn_id(line)
    out.append([rid and rid.decode(), uid, rest and rest.decode()])
print(json.dumps(out))
`
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "-I", "-c", harness, script)
	cmd.Stdin = bytes.NewReader(append(bytes.Join(lines, []byte("\n")), '\n'))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var got [][3]any
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	return got
}

// A root server gives every child a uid of its own, so the uid changes
// with every spawn line as the id does. The zygote parses a line's rest
// only when it differs from the last one's: the uid must not be part of it
// (or every line would be parsed again), and must still reach each child
// (TestEachRunItsOwnUser).
func TestSpawnLineSplitsTheUID(t *testing.T) {
	base := spawnRequest{Op: "spawn", TmpBytes: 1 << 20, Rlimits: [][3]uint64{{7, 64, 64}}, Env: map[string]string{"A": "1,2"}, Oneshot: true}
	line := func(id string, uid int) []byte {
		r := base
		r.ID, r.UID = id, uid
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	lines := [][]byte{
		line("7", 2001),
		line("8", 65535+2000),
		line("9", 0), // a server that is not root: no uid
		[]byte(`{"op":"spawn","id":"10","uid":12a,"tmp_bytes":1}`),
		[]byte(`{"op":"spawn","id":"11","uid":12345678901,"tmp_bytes":1}`),
		[]byte(`{"op":"spawn","id":"12","uid":5}`), // nothing after it: parsed whole
		[]byte(`{"op":"spawn","id":"x","uid":5,"tmp_bytes":1}`),
		[]byte(`{"op":"run","id":"13"}`),
	}
	got := splitSpawn(t, lines)
	if len(got) != len(lines) {
		t.Fatalf("%d results for %d lines: %v", len(got), len(lines), got)
	}
	want := []struct {
		id  any
		uid any
	}{{`"7"`, 2001.0}, {`"8"`, 67535.0}, {`"9"`, nil}, {`"10"`, nil}, {`"11"`, nil}, {`"12"`, nil}, {nil, nil}, {nil, nil}}
	for i, w := range want {
		if got[i][0] != w.id || got[i][1] != w.uid {
			t.Errorf("line %s: id %v uid %v, want %v %v", lines[i], got[i][0], got[i][1], w.id, w.uid)
		}
	}
	if got[0][2] != got[1][2] {
		t.Errorf("two spawns that differ only in id and uid have different rests: %q and %q", got[0][2], got[1][2])
	}
	if rest, _ := got[0][2].(string); !strings.HasPrefix(rest, `,"tmp_bytes":`) {
		t.Errorf("rest %q: want it to start after the uid", rest)
	}
	if got[2][2] == got[0][2] {
		t.Errorf("a line without a uid has the same rest as one with: %q", got[2][2])
	}
	for _, i := range []int{3, 4, 5} {
		// A uid the split does not take stays in the rest, for the JSON
		// parse (and the child's own check) to see.
		if rest, _ := got[i][2].(string); !strings.Contains(rest, `"uid"`) {
			t.Errorf("line %s: rest %q lost the uid", lines[i], rest)
		}
	}
}

// TestEachRunItsOwnUser: on a root server every pooled run is a host user
// of its own, although the zygote reuses the request it parsed for the
// child before.
func TestEachRunItsOwnUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only a root server maps a block of ids for its children")
	}
	e, _ := newPooledEngine(t, 2, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	seen := map[string]bool{}
	for range 6 {
		// The map shows the id in the zygote's namespace that the kernel
		// gave this run's user 1000: not something the worker reports.
		r, err := e.Run(ctx, engine.RunRequest{Code: "open('/proc/self/uid_map').read().split()[1]"})
		if err != nil || r.Status != engine.StatusSuccess {
			t.Fatalf("%v %+v", err, r)
		}
		id := fmt.Sprint(r.ReturnValue)
		if seen[id] {
			t.Fatalf("two runs were the same user %s (seen: %v)", id, seen)
		}
		seen[id] = true
	}
}
