package worker

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

// startSnapshotWorker starts a session worker with snapshot.py next to
// it, as the engine places it.
func startSnapshotWorker(t *testing.T, python string) *testWorker {
	t.Helper()
	w := startPython(t, python, false)
	if err := os.WriteFile(filepath.Join(filepath.Dir(w.dir), SnapshotFile), SnapshotSource, 0o444); err != nil {
		t.Fatal(err)
	}
	return w
}

// mustRun runs code as the cell filename, which must succeed, and returns
// its value as JSON.
func (w *testWorker) mustRun(t *testing.T, filename, code string) json.RawMessage {
	t.Helper()
	res, _, stderr := w.run(t, Request{Code: code, Filename: filename})
	if res.Status != "success" {
		t.Fatalf("run %q: %+v\nstderr:\n%s", code, res.Error, stderr)
	}
	return res.ReturnValue
}

// snapshot takes a snapshot of w, which must succeed.
func (w *testWorker) snapshot(t *testing.T, maxBytes int64) ([]byte, *Snapshotted) {
	t.Helper()
	var buf bytes.Buffer
	s, err := w.conn.Snapshot(testContext(t), &buf, maxBytes)
	if err != nil {
		_, stderr := w.output(t)
		t.Fatalf("Snapshot: %v\nstderr:\n%s", err, stderr)
	}
	if s.Bytes != int64(buf.Len()) {
		t.Errorf("Bytes = %d, %d written", s.Bytes, buf.Len())
	}
	return buf.Bytes(), s
}

// restore restores data into w, which must succeed.
func (w *testWorker) restore(t *testing.T, data []byte) *Restored {
	t.Helper()
	r, err := w.conn.Restore(testContext(t), bytes.NewReader(data), int64(len(data)))
	if err != nil {
		_, stderr := w.output(t)
		t.Fatalf("Restore: %v\nstderr:\n%s", err, stderr)
	}
	return r
}

func sorted(names []string) string {
	s := append([]string(nil), names...)
	sort.Strings(s)
	return strings.Join(s, ",")
}

func reasons(u []Unsaveable) map[string]string {
	m := map[string]string{}
	for _, x := range u {
		m[x.Name] = x.Reason
	}
	return m
}

// TestSnapshotRoundTrip pauses a session and resumes it in a new worker,
// on every interpreter: data, functions, classes and their instances,
// closures, lambdas, modules, a workspace module; what cannot be saved
// is listed with why.
func TestSnapshotRoundTrip(t *testing.T) {
	for name, python := range interpreters(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			snapshotRoundTrip(t, python)
		})
	}
}

const snapshotSetup = `
import math as m
import os.path
import json, threading, socket
import mymod as mm
from mymod import helper
import collections, dataclasses, enum, functools, typing

rows = [{"id": i, "name": "row%d" % i, "score": i * 0.5, "tags": ["a", "b"]} for i in range(1000)]
alias = rows                      # shared: the same list after a restore
base = 10
def add(x, y=2):
    "Adds."
    return x + y + base
def make_counter(start):
    n = [start]
    def step():
        n[0] += 1
        return n[0]
    return step
counter = make_counter(5)
counter()
square = lambda v: v * v
class Point:
    dims = 2
    def __init__(self, x, y):
        self.x, self.y = x, y
    def norm2(self):
        return self.x ** 2 + self.y ** 2
    @property
    def pair(self):
        return (self.x, self.y)
    @staticmethod
    def origin():
        return Point(0, 0)
    @classmethod
    def unit(cls):
        return cls(1, 0)
class Point3(Point):
    __slots__ = ("z",)
    def __init__(self, x, y, z):
        super().__init__(x, y)
        self.z = z
    def norm2(self):
        return super().norm2() + self.z ** 2
p = Point(3, 4)
q = Point3(1, 2, 2)
points = [p, Point(1, 1)]
@dataclasses.dataclass
class Item:
    name: str
    qty: int = 1
    tags: list = dataclasses.field(default_factory=list)
item = Item("pen")
class Color(enum.Enum):
    RED = 1
    GREEN = 2
    def shout(self):
        return self.name + "!"
fav = Color.GREEN
Pair = collections.namedtuple("Pair", "a b")
pr = Pair(1, 2)
class NT(typing.NamedTuple):
    u: int
    v: str = "v"
nt = NT(7)
@functools.lru_cache(maxsize=None)
def fib(k):
    return k if k < 2 else fib(k - 1) + fib(k - 2)
fib(20)
def deco(f):
    @functools.wraps(f)
    def wrapper(*a):
        return f(*a) * 2
    return wrapper
@deco
def twice(v):
    return v + 1
mod_obj = mm.Thing(4)
g = globals()
__version__ = "1.2"

fh = open("data.txt", "w")
gen = (i for i in range(3))
lock = threading.Lock()
sock = socket.socket()
bad_list = [1, lock]
`

const snapshotCheck = `
import sys
checks = {
  "rows": len(rows) == 1000 and rows[999] == {"id": 999, "name": "row999", "score": 499.5, "tags": ["a", "b"]},
  "alias": alias is rows,
  "add": add(1) == 13 and add(1, 3) == 14 and add.__doc__ == "Adds." and add.__defaults__ == (2,),
  "global": (globals().__setitem__("base", 20), add(1))[1] == 23,
  "closure": counter() == 7 and counter() == 8,
  "lambda": square(9) == 81,
  "class": isinstance(p, Point) and p.norm2() == 25 and p.pair == (3, 4) and Point.dims == 2,
  "static": isinstance(Point.origin(), Point) and Point.unit().x == 1,
  "subclass": isinstance(q, Point3) and isinstance(q, Point) and q.norm2() == 9 and Point3.__slots__ == ("z",),
  "shared class": all(type(x) is Point for x in points) and points[0] is p,
  "dataclass": item == Item("pen") and Item("a", 2).qty == 2 and Item("b").tags == [] and dataclasses.fields(Item)[2].name == "tags",
  "enum": fav is Color.GREEN and Color(1) is Color.RED and fav.shout() == "GREEN!" and list(Color) == [Color.RED, Color.GREEN],
  "namedtuple": pr == Pair(1, 2) and isinstance(pr, Pair) and pr.a == 1 and pr._replace(a=5).a == 5,
  "NamedTuple": nt == NT(7, "v") and nt.v == "v" and isinstance(nt, NT),
  "lru": fib(30) == 832040 and hasattr(fib, "cache_info"),
  "decorated": twice(1) == 4 and twice.__name__ == "twice",
  "modules": m.sqrt(16) == 4 and os.path.join("a", "b") == "a/b" and json.dumps(1) == "1",
  "workspace module": mm.VALUE == 42 and helper(2) == 84 and isinstance(mod_obj, mm.Thing) and mod_obj.n == 4,
  "globals": g is globals(),
  "dunder": __version__ == "1.2",
  "main": Point.__module__ == "__main__" and sys.modules["__main__"].Point is Point,
}
[k for k, v in checks.items() if not v]
`

func snapshotRoundTrip(t *testing.T, python string) {
	a := startSnapshotWorker(t, python)
	mymod := "VALUE = 42\ndef helper(v):\n    return v * VALUE\nclass Thing:\n    def __init__(self, n):\n        self.n = n\n"
	if err := os.WriteFile(filepath.Join(a.dir, "mymod.py"), []byte(mymod), 0o644); err != nil {
		t.Fatal(err)
	}
	a.mustRun(t, "<cell 1>", snapshotSetup)
	data, s := a.snapshot(t, 64<<20)
	if s.TooBig {
		t.Fatal("too big")
	}
	why := reasons(s.Unsaveable)
	for name, want := range map[string]string{
		"fh":       "TextIOWrapper: cannot pickle '", // '_io.TextIOWrapper' object, or 'TextIOWrapper' instances (3.12)
		"gen":      "generator: cannot pickle 'generator' object",
		"lock":     "lock: cannot pickle '_thread.lock' object",
		"sock":     "socket: cannot pickle 'socket' object",
		"bad_list": "list: cannot pickle '_thread.lock' object",
	} {
		if got, ok := why[name]; !ok || !strings.HasPrefix(got, want) {
			t.Errorf("unsaveable %s: %q, want %q", name, got, want)
		}
	}
	if len(s.Unsaveable) != 5 {
		t.Errorf("unsaveable: %+v", s.Unsaveable)
	}
	for _, n := range []string{"rows", "add", "Point", "p", "m", "mm", "helper", "counter", "square", "g", "__version__"} {
		if !strings.Contains(","+sorted(s.Saved)+",", ","+n+",") {
			t.Errorf("%s not saved: %v", n, s.Saved)
		}
	}
	for _, n := range s.Saved {
		if strings.HasPrefix(n, "__") && n != "__version__" && n != "__annotations__" {
			t.Errorf("%s saved", n)
		}
	}

	// Resumed elsewhere, with the workspace restored first.
	b := startSnapshotWorker(t, python)
	if err := os.WriteFile(filepath.Join(b.dir, "mymod.py"), []byte(mymod), 0o644); err != nil {
		t.Fatal(err)
	}
	r := b.restore(t, data)
	if len(r.Failed) != 0 {
		t.Errorf("failed: %+v", r.Failed)
	}
	if sorted(r.Restored) != sorted(s.Saved) {
		t.Errorf("restored %v, saved %v", r.Restored, s.Saved)
	}
	jsonEqual(t, b.mustRun(t, "<cell 2>", snapshotCheck), `[]`)

	// A traceback through a restored function shows its source.
	res, _, stderr := b.run(t, Request{Code: "add('x')", Filename: "<cell 9>"})
	wantError(t, res, "TypeError", 1)
	if !strings.Contains(stderr, "return x + y + base") {
		t.Errorf("traceback without the restored function's line:\n%s", stderr)
	}
}

// TestSnapshotEdges: identity across a failed record, deep graphs, user
// code that breaks pickle and json, the session dict, names that are
// not identifiers, and sessions that keep working after all of it.
func TestSnapshotEdges(t *testing.T) {
	for name, python := range interpreters(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			snapshotEdges(t, python)
		})
	}
}

func snapshotEdges(t *testing.T, python string) {
	a := startSnapshotWorker(t, python)
	a.mustRun(t, "<cell 1>", `
import threading, pickle, json, marshal, copyreg
class P:
    def hello(self):
        return "hi"
def broken(x=threading.Lock()):   # a definition that fails: the memo starts afresh
    return x
p = P()                           # so P comes back by its name
deep = []
cur = deep
for _ in range(100000):
    cur.append([])
    cur = cur[0]
del cur
class Boom:
    def __reduce__(self):
        raise ValueError("no way")
boom = Boom()
class Exit:
    def __reduce__(self):
        raise SystemExit(3)
leave = Exit()
class Heavy:
    def __reduce__(self):
        raise MemoryError()
heavy = Heavy()
globals()["not an identifier"] = 1
globals()[("tuple", "key")] = 2
globals()["x" * 2000] = 3
ok = "still saved"
pickle.Pickler = pickle.dumps = json.dumps = marshal.dumps = None   # user code that breaks them
copyreg.dispatch_table.clear()
`)
	data, s := a.snapshot(t, 64<<20)
	why := reasons(s.Unsaveable)
	for name, want := range map[string]string{
		"broken":                 "function: cannot pickle '_thread.lock' object",
		"deep":                   "list: too deeply nested to save (RecursionError)",
		"boom":                   "Boom: ValueError: no way",
		"leave":                  "Exit: SystemExit: 3",
		"heavy":                  "Heavy: out of memory while saving it",
		"('tuple', 'key')":       "the name is not a string",
		strings.Repeat("x", 100): "the name is longer than 1024 bytes", // shown shortened
	} {
		found := false
		for n, r := range why {
			if strings.HasPrefix(n, name) && r == want {
				found = true
			}
		}
		if !found {
			t.Errorf("unsaveable %s: want %q in %+v", name, want, s.Unsaveable)
		}
	}
	if got := sorted(s.Saved); got != "Boom,Exit,Heavy,P,_,copyreg,json,marshal,not an identifier,ok,p,pickle,threading" {
		t.Errorf("saved %s", got)
	}
	// The session goes on.
	jsonEqual(t, a.mustRun(t, "<cell 2>", "ok"), `"still saved"`)

	b := startSnapshotWorker(t, python)
	r := b.restore(t, data)
	if len(r.Failed) != 0 || sorted(r.Restored) != sorted(s.Saved) {
		t.Errorf("restored %v, failed %+v", r.Restored, r.Failed)
	}
	jsonEqual(t, b.mustRun(t, "<cell 2>", `[isinstance(p, P), p.hello(), ok, globals()["not an identifier"]]`), `[true, "hi", "still saved", 1]`)

	// The session can be saved again, restored or not.
	for _, w := range []*testWorker{a, b} {
		if _, s := w.snapshot(t, 64<<20); len(s.Saved) < 5 {
			t.Errorf("second snapshot saved %v", s.Saved)
		}
	}
}

// TestSnapshotNumpy: an array travels without a copy of it on either side
// (protocol 5 buffers), and comes back equal.
func TestSnapshotNumpy(t *testing.T) {
	withModules(t, []string{"numpy"}, func(t *testing.T, python string) {
		a := startSnapshotWorker(t, python)
		a.mustRun(t, "<cell 1>", "import numpy as np\narr = np.arange(3_000_000, dtype=np.float64).reshape(1000, 3000)\nft = np.asfortranarray(arr[:10])\nview = arr[::2]\nobjs = np.array([{'a': 1}, None], dtype=object)\n")
		data, s := a.snapshot(t, 64<<20)
		if len(s.Unsaveable) != 0 || s.Bytes < 24_000_000 || s.Bytes > 40_000_000 {
			t.Errorf("saved %v, unsaveable %+v, %d bytes", s.Saved, s.Unsaveable, s.Bytes)
		}
		b := startSnapshotWorker(t, python)
		if r := b.restore(t, data); len(r.Failed) != 0 {
			t.Errorf("failed: %+v", r.Failed)
		}
		jsonEqual(t, b.mustRun(t, "<cell 2>", "[np.__name__, arr.shape, float(arr[999, 2999]), bool((ft == arr[:10]).all()), ft.flags.f_contiguous, bool((view == arr[::2]).all()), objs[0]]"),
			`["numpy", [1000, 3000], 2999999.0, true, true, true, {"a": 1}]`)
	})
}

// TestSnapshotTooBig: a state over max_bytes ends with TooBig, no more
// than max_bytes sent; the session goes on.
func TestSnapshotTooBig(t *testing.T) {
	w := startSnapshotWorker(t, systemPython)
	w.mustRun(t, "<cell 1>", "small = 1\nbig = b'x' * 3_000_000\nrest = list(range(100))\n")
	for _, max := range []int64{10, 1000, 2 << 20} {
		data, s := w.snapshot(t, max)
		if !s.TooBig || int64(len(data)) > max {
			t.Errorf("max %d: TooBig %v, %d bytes", max, s.TooBig, len(data))
		}
	}
	_, s := w.snapshot(t, 4<<20)
	if s.TooBig || sorted(s.Saved) != "big,rest,small" {
		t.Errorf("%+v", s)
	}
	jsonEqual(t, w.mustRun(t, "<cell 2>", "small"), "1")
}

// TestRestoreGarbage: a stream that is not a snapshot, or one cut short,
// is consumed whole; the session stays usable.
func TestRestoreGarbage(t *testing.T) {
	a := startSnapshotWorker(t, systemPython)
	a.mustRun(t, "<cell 1>", "x = 1\ny = [2] * 1000\nz = 'three'\n")
	data, _ := a.snapshot(t, 1<<20)

	w := startSnapshotWorker(t, systemPython)
	garbage := bytes.Repeat([]byte("not a snapshot\n{\"op\":\"run\"}\n"), 100_000)
	_, err := w.conn.Restore(testContext(t), bytes.NewReader(garbage), int64(len(garbage)))
	var er *ErrorReply
	if !errors.As(err, &er) || !strings.Contains(er.Message, "not a pysandbox snapshot") {
		t.Errorf("Restore(garbage): %v", err)
	}
	// Cut, and damaged after the first records.
	cut := append([]byte(nil), data[:len(data)-200]...)
	cut = append(cut, bytes.Repeat([]byte{0xff}, 100)...)
	r, err := w.conn.Restore(testContext(t), bytes.NewReader(cut), int64(len(cut)))
	if err != nil || len(r.Failed) == 0 || !strings.Contains(r.Failed[len(r.Failed)-1].Reason, "could not be read") {
		t.Errorf("Restore(cut): %+v, %v", r, err)
	}
	// A reader that fails: the rest goes as zeros, in step.
	_, err = w.conn.Restore(testContext(t), io.MultiReader(bytes.NewReader(data[:20]), errReader{}), int64(len(data)))
	if err == nil || !strings.Contains(err.Error(), "disk on fire") {
		t.Errorf("Restore(failing reader): %v", err)
	}
	if r := w.restore(t, data); sorted(r.Restored) != "x,y,z" || len(r.Failed) != 0 {
		t.Errorf("restore after garbage: %+v", r)
	}
	jsonEqual(t, w.mustRun(t, "<cell 2>", "[x, len(y), z]"), `[1, 1000, "three"]`)
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("disk on fire") }

// failWriter fails once n bytes are written.
type failWriter struct{ n int }

func (f *failWriter) Write(p []byte) (int, error) {
	if len(p) > f.n {
		n := f.n
		f.n = 0
		return n, errors.New("disk full")
	}
	f.n -= len(p)
	return len(p), nil
}

// A writer that fails (a full disk) does not leave the stream out of
// step: the snapshot is read to its end, the error returned, the Conn
// usable.
func TestSnapshotWriteError(t *testing.T) {
	w := startSnapshotWorker(t, systemPython)
	w.mustRun(t, "<cell 1>", "data = [bytes(1000) for _ in range(5000)]\n")
	_, err := w.conn.Snapshot(testContext(t), &failWriter{n: 100_000}, 64<<20)
	if err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("Snapshot: %v", err)
	}
	jsonEqual(t, w.mustRun(t, "<cell 2>", "len(data)"), "5000")
	if _, s := w.snapshot(t, 64<<20); len(s.Saved) != 1 {
		t.Errorf("%+v", s)
	}
}

// A one-shot worker has no session to save; a restore's bytes are read
// all the same.
func TestSnapshotOneshot(t *testing.T) {
	w := startPython(t, systemPython, true)
	if err := os.WriteFile(filepath.Join(filepath.Dir(w.dir), SnapshotFile), SnapshotSource, 0o444); err != nil {
		t.Fatal(err)
	}
	var er *ErrorReply
	if _, err := w.conn.Snapshot(testContext(t), io.Discard, 1<<20); !errors.As(err, &er) {
		t.Errorf("Snapshot: %v", err)
	}
	data := bytes.Repeat([]byte("x\n"), 100_000)
	if _, err := w.conn.Restore(testContext(t), bytes.NewReader(data), int64(len(data))); !errors.As(err, &er) {
		t.Errorf("Restore: %v", err)
	}
	res, _, _ := w.run(t, Request{Code: "1 + 1"})
	jsonEqual(t, res.ReturnValue, "2")
}

// Without snapshot.py next to the worker, a restore is still consumed.
func TestSnapshotModuleMissing(t *testing.T) {
	w := startPython(t, systemPython, false)
	data := bytes.Repeat([]byte("x\n"), 100_000)
	var er *ErrorReply
	if _, err := w.conn.Restore(testContext(t), bytes.NewReader(data), int64(len(data))); !errors.As(err, &er) || !strings.Contains(er.Message, "not available") {
		t.Errorf("Restore: %v", err)
	}
	jsonEqual(t, w.mustRun(t, "<c>", "1 + 1"), "2")
}

// SIGINT interrupts a snapshot (an error, the session kept) and a restore
// (the rest listed as failed, the stream read to its end), in user code
// and in an import.
func TestSnapshotInterrupt(t *testing.T) {
	a := startSnapshotWorker(t, systemPython)
	setup := `
import time
class Slow:
    def __init__(self, label):
        self.label = label
    def __reduce__(self):
        return (Slow, (self.label,), {"label": self.label})
    def __setstate__(self, state):
        if open("sleep").read() == "restore":
            open("started", "w").close()
            time.sleep(30)
        self.__dict__.update(state)
first = 1
slow = Slow("s")
after = [1] * 100000
`
	a.mustRun(t, "<cell 1>", setup)
	// interrupt sends SIGINT to w once dir/started exists.
	interrupt := func(w *testWorker) {
		go func() {
			for range 6000 {
				if _, err := os.Stat(filepath.Join(w.dir, "started")); err == nil {
					w.cmd.Process.Signal(syscall.SIGINT)
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	a.mustRun(t, "<cell 2>", "def _slow_reduce(self):\n    open('started', 'w').close()\n    time.sleep(30)\nSlow.__reduce__ = _slow_reduce\n")
	interrupt(a)
	start := time.Now()
	_, err := a.conn.Snapshot(testContext(t), io.Discard, 64<<20)
	var er *ErrorReply
	if !errors.As(err, &er) || !strings.Contains(er.Message, "interrupted") || time.Since(start) > 20*time.Second {
		t.Fatalf("Snapshot: %v after %v", err, time.Since(start))
	}
	jsonEqual(t, a.mustRun(t, "<cell 3>", "[first, slow.label, len(after)]"), `[1, "s", 100000]`)

	a.mustRun(t, "<cell 4>", "del Slow.__reduce__, _slow_reduce\nSlow.__reduce__ = lambda self: (Slow, (self.label,), {'label': self.label})\n")
	os.WriteFile(filepath.Join(a.dir, "slowmod.py"), []byte("x = 1\n"), 0o644)
	a.mustRun(t, "<cell 5>", "import slowmod\n")
	data, s := a.snapshot(t, 64<<20)
	if len(s.Unsaveable) != 0 {
		t.Fatalf("%+v", s.Unsaveable)
	}

	// In a __setstate__: what came before stays, the rest is listed.
	b := startSnapshotWorker(t, systemPython)
	os.WriteFile(filepath.Join(b.dir, "sleep"), []byte("restore"), 0o644)
	os.WriteFile(filepath.Join(b.dir, "slowmod.py"), []byte("x = 1\n"), 0o644)
	interrupt(b)
	start = time.Now()
	r := b.restore(t, data)
	why := reasons(r.Failed)
	if sorted(r.Restored) != "Slow,first,slowmod,time" || why["slow"] != "the restore was interrupted" || why["after"] != "the restore was interrupted" || len(r.Failed) != 2 {
		t.Errorf("restored %v, failed %+v", r.Restored, r.Failed)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("the restore took %v", d)
	}
	jsonEqual(t, b.mustRun(t, "<cell 6>", "[first, 'after' in globals()]"), `[1, false]`)

	// In an import (held back for the grace an import gets): modules come
	// first, so only those before it are restored.
	c := startSnapshotWorker(t, systemPython)
	os.WriteFile(filepath.Join(c.dir, "slowmod.py"), []byte("open('started', 'w').close()\nimport time\ntime.sleep(30)\n"), 0o644)
	interrupt(c)
	r = c.restore(t, data)
	why = reasons(r.Failed)
	if sorted(r.Restored) != "time" || why["slowmod"] != "the restore was interrupted" || len(r.Failed) != 5 {
		t.Errorf("restored %v, failed %+v", r.Restored, r.Failed)
	}
	jsonEqual(t, c.mustRun(t, "<cell 7>", "[time.__name__, 'first' in globals()]"), `["time", false]`)
}

// User code that writes tool messages on the control channel during a
// snapshot is refused, as in any exchange but a run's.
func TestSnapshotToolMessages(t *testing.T) {
	w := startSnapshotWorker(t, systemPython)
	w.mustRun(t, "<cell 1>", `
import os
class Noisy:
    def __reduce__(self):
        msg = b'{"op":"tool_call","id":"x1","name":"a.b","arguments":{}}\n'
        os.write(3, msg)
        return (int, (5,))
n = Noisy()
`)
	data, s := w.snapshot(t, 1<<20)
	if sorted(s.Saved) != "Noisy,n,os" {
		t.Errorf("%+v", s)
	}
	b := startSnapshotWorker(t, systemPython)
	b.restore(t, data)
	jsonEqual(t, b.mustRun(t, "<c>", "n"), "5")
	jsonEqual(t, w.mustRun(t, "<c>", "1"), "1")
}

// A snapshot taken by one Python version restores in another: session
// code is compiled again from the source the snapshot keeps.
func TestSnapshotOtherPython(t *testing.T) {
	pys := interpreters(t)
	from, to := pys["3.11.7"], pys["3.12.1"]
	if from == "" || to == "" {
		t.Skip("needs pyenv 3.11.7 and 3.12.1")
	}
	a := startSnapshotWorker(t, from)
	a.mustRun(t, "<cell 1>", "base = 3\ndef f(x):\n    g = lambda y: y * base\n    return g(x)\nclass C:\n    def m(self):\n        return f(2)\nc = C()\n")
	data, _ := a.snapshot(t, 1<<20)
	b := startSnapshotWorker(t, to)
	if r := b.restore(t, data); len(r.Failed) != 0 {
		t.Fatalf("failed: %+v", r.Failed)
	}
	jsonEqual(t, b.mustRun(t, "<cell 2>", "[f(1), c.m(), isinstance(c, C)]"), "[3, 6, true]")
}

// hostileSnapshot plays a worker that answers one snapshot request with
// script, and returns the Snapshot's error.
func hostileSnapshot(t *testing.T, maxBytes int64, script string) (*Conn, error) {
	t.Helper()
	c, wc := pairConn(t)
	done := make(chan error, 1)
	go func() {
		done <- func() error {
			r := bufio.NewReader(wc)
			if _, err := wc.Write([]byte(`{"op":"ready","python":"3.11.0","version":[3,11],"pid":1}` + "\n")); err != nil {
				return err
			}
			if _, err := r.ReadBytes('\n'); err != nil {
				return err
			}
			_, err := wc.Write([]byte(script))
			return err
		}()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.Snapshot(ctx, io.Discard, maxBytes)
	// The fake worker may be stuck writing what nobody reads: the
	// cleanup's Close ends it.
	t.Cleanup(func() {
		c.Close()
		if werr := <-done; werr != nil {
			t.Logf("fake worker: %v", werr)
		}
	})
	return c, err
}

func dataFrame(n int) string {
	return fmt.Sprintf(`{"op":"snapshot_data","id":"1","bytes":%d}`+"\n", n) + strings.Repeat("x", n)
}

// Everything the worker sends is hostile: frames, sizes and lists are
// bounded, and past a bound the Conn is unusable.
func TestSnapshotHostile(t *testing.T) {
	names := func(n, size int) string {
		return `["` + strings.Repeat(strings.Repeat("a", size)+`","`, n-1) + strings.Repeat("a", size) + `"]`
	}
	end := `{"op":"snapshotted","id":"1","saved":["a"],"unsaveable":[],"too_big":false}` + "\n"
	for _, c := range []struct {
		name, script, wantErr string
		maxBytes              int64
	}{
		{"frame too large", dataFrame(MaxSnapshotFrameBytes+1) + end, "snapshot_data of 1048577 bytes", 64 << 20},
		{"empty frame", dataFrame(0) + end, "snapshot_data of 0 bytes", 64 << 20},
		{"negative frame", `{"op":"snapshot_data","id":"1","bytes":-5}` + "\n" + end, "snapshot_data of -5 bytes", 64 << 20},
		{"over max_bytes", dataFrame(600) + dataFrame(600) + end, "more than 1000 bytes", 1000},
		{"no size", `{"op":"snapshot_data","id":"1"}` + "\n" + end, "bad snapshot_data message", 64 << 20},
		{"size not a number", `{"op":"snapshot_data","id":"1","bytes":"12"}` + "\n" + end, "bad snapshot_data message", 64 << 20},
		{"size a float", `{"op":"snapshot_data","id":"1","bytes":1.5}` + "\n" + end, "bad snapshot_data message", 64 << 20},
		{"other id", `{"op":"snapshot_data","id":"2","bytes":1}` + "\nx" + end, "does not match", 64 << 20},
		{"too many names", `{"op":"snapshotted","id":"1","saved":` + names(MaxSnapshotNames+1, 1) + `,"unsaveable":[]}` + "\n", "100001 names", 64 << 20},
		{"names and failures", `{"op":"snapshotted","id":"1","saved":` + names(MaxSnapshotNames, 1) + `,"unsaveable":[{"name":"b","reason":"c"}]}` + "\n", "100001 names", 64 << 20},
		{"long name", `{"op":"snapshotted","id":"1","saved":` + names(1, 1025) + `}` + "\n", "a name of 1025 bytes", 64 << 20},
		{"long reason", `{"op":"snapshotted","id":"1","unsaveable":[{"name":"b","reason":"` + strings.Repeat("r", 2049) + `"}]}` + "\n", "reason of 2049", 64 << 20},
		{"wrong reply", `{"op":"restored","id":"1"}` + "\n", `want "snapshotted"`, 64 << 20},
		{"huge line", `{"op":"snapshotted","id":"1","saved":["` + strings.Repeat("a", maxLineBytes+1<<17), "message too long", 64 << 20},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			conn, err := hostileSnapshot(t, c.maxBytes, c.script)
			if err == nil || !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("error = %v, want a protocol violation with %q", err, c.wantErr)
			}
			if _, err2 := conn.Snapshot(testContext(t), io.Discard, 1); err2 == nil || !errors.Is(err2, ErrProtocol) {
				t.Errorf("Conn usable after a violation: %v", err2)
			}
		})
	}

	// Within bounds: data, a refused tool call, the end.
	t.Run("well-behaved", func(t *testing.T) {
		script := dataFrame(MaxSnapshotFrameBytes) + `{"op":"tool_call","id":"t1","name":"a.b","arguments":{}}` + "\n" + dataFrame(5) +
			`{"op":"snapshotted","id":"1","saved":` + names(MaxSnapshotNames-1, 3) + `,"unsaveable":[{"name":"` + strings.Repeat("n", 1024) + `","reason":"` + strings.Repeat("r", 2048) + `"}],"too_big":false}` + "\n"
		c, wc := pairConn(t)
		go func() {
			r := bufio.NewReader(wc)
			wc.Write([]byte(`{"op":"ready","python":"3.11.0","version":[3,11],"pid":1}` + "\n"))
			r.ReadBytes('\n')
			wc.Write([]byte(script))
			if line, _ := r.ReadBytes('\n'); !bytes.Contains(line, []byte(`"kind":"cancelled"`)) {
				t.Errorf("tool call answered %s", line)
			}
		}()
		var buf bytes.Buffer
		s, err := c.Snapshot(testContext(t), &buf, MaxSnapshotFrameBytes+5)
		if err != nil || s.Bytes != MaxSnapshotFrameBytes+5 || buf.Len() != MaxSnapshotFrameBytes+5 || len(s.Saved) != MaxSnapshotNames-1 || len(s.Unsaveable) != 1 {
			t.Fatalf("Snapshot: %v", err)
		}
	})
}

// A restore's reply is bounded like a snapshot's.
func TestRestoreHostile(t *testing.T) {
	c, wc := pairConn(t)
	go func() {
		r := bufio.NewReader(wc)
		wc.Write([]byte(`{"op":"ready","python":"3.11.0","version":[3,11],"pid":1}` + "\n"))
		r.ReadBytes('\n')
		io.CopyN(io.Discard, r, 100)
		wc.Write([]byte(`{"op":"restored","id":"1","restored":[],"failed":[{"name":"` + strings.Repeat("n", 1025) + `","reason":""}]}` + "\n"))
	}()
	_, err := c.Restore(testContext(t), bytes.NewReader(make([]byte, 100)), 100)
	if !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "a name of 1025 bytes") {
		t.Fatalf("Restore: %v", err)
	}
}

// peakRSS is the most memory the worker held since the last resetPeak.
func (w *testWorker) peakRSS(t *testing.T) (peak, now int64) {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", w.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		var kb int64
		if _, err := fmt.Sscanf(line, "VmHWM: %d kB", &kb); err == nil {
			peak = kb << 10
		}
		if _, err := fmt.Sscanf(line, "VmRSS: %d kB", &kb); err == nil {
			now = kb << 10
		}
	}
	return peak, now
}

func (w *testWorker) resetPeak(t *testing.T) {
	t.Helper()
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", w.cmd.Process.Pid), []byte("5"), 0); err != nil {
		t.Skipf("cannot reset the peak RSS: %v", err)
	}
}

// TestSnapshotMeasure measures pause and resume of a 100 MB DataFrame (or
// array) and of 1000 small dicts: time, stream size and the worker's peak
// RSS above what it held before, beside pickle.dump/load of the same
// data to a file. Run with PYSANDBOX_MEASURE=1 -v.
func TestSnapshotMeasure(t *testing.T) {
	if os.Getenv("PYSANDBOX_MEASURE") == "" {
		t.Skip("set PYSANDBOX_MEASURE=1 to measure")
	}
	const mb = 1 << 20
	for _, c := range []struct{ name, setup string }{
		{"pandas 100 MB", "import pandas as pd, numpy as np\nx = pd.DataFrame(np.random.rand(1_310_720, 10), columns=list('abcdefghij'))\nsmall = [{'i': i, 's': str(i)} for i in range(1000)]"},
		{"numpy 100 MB", "import numpy as np\nx = np.random.rand(13_107_200)\nsmall = [{'i': i, 's': str(i)} for i in range(1000)]"},
		{"1000 small dicts", "x = [{'id': i, 'name': 'n%d' % i, 'v': i * 0.5} for i in range(1000)]\nsmall = None"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if strings.Contains(c.setup, "pandas") {
				requireModules(t, systemPython, "pandas")
			}
			a := startSnapshotWorker(t, systemPython)
			a.mustRun(t, "<setup>", c.setup+"\nimport pickle, time, gc\ngc.collect()")
			a.resetPeak(t)
			_, before := a.peakRSS(t)
			// To a file, as the engine keeps them: the first pause loads
			// snapshot.py, later ones do not.
			file := filepath.Join(t.TempDir(), "snap")
			pauseTo := func() (time.Duration, *Snapshotted) {
				f, err := os.Create(file)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				start := time.Now()
				s, err := a.conn.Snapshot(testContext(t), f, 1<<30)
				if err != nil {
					t.Fatal(err)
				}
				return time.Since(start), s
			}
			pause, s := pauseTo()
			peak, _ := a.peakRSS(t)
			warm := time.Duration(1 << 62)
			for range 3 {
				d, _ := pauseTo()
				warm = min(warm, d)
			}
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			a.resetPeak(t)
			direct := a.mustRun(t, "<pickle>", "t = time.perf_counter()\nwith open('direct.pkl', 'wb') as f:\n    pickle.dump((x, small), f, 5)\ntime.perf_counter() - t")
			peakDirect, _ := a.peakRSS(t)
			t.Logf("pause: %v (then %v), %.1f MB stream, peak +%.1f MB over %.1f MB (pickle.dump to a file: %s s, peak +%.1f MB); saved %v",
				pause.Round(time.Millisecond), warm.Round(time.Millisecond), float64(s.Bytes)/mb, float64(peak-before)/mb, float64(before)/mb, direct, float64(peakDirect-before)/mb, s.Saved)

			b := startSnapshotWorker(t, systemPython)
			imports := "import gc"
			if strings.Contains(c.setup, "pandas") {
				imports += "\nimport pandas, numpy"
			} else if strings.Contains(c.setup, "numpy") {
				imports += "\nimport numpy"
			}
			b.mustRun(t, "<imports>", imports+"\ngc.collect()")
			b.resetPeak(t)
			_, before = b.peakRSS(t)
			start := time.Now()
			r := b.restore(t, data)
			resume := time.Since(start)
			peak, now := b.peakRSS(t)
			if len(r.Failed) != 0 {
				t.Errorf("failed %+v", r.Failed)
			}
			b.mustRun(t, "<del>", "del x, small\ngc.collect()")
			start = time.Now()
			b.restore(t, data)
			warm = time.Since(start)
			// pickle.load of the same data, from a file, in a worker alike.
			d := startSnapshotWorker(t, systemPython)
			pkl, err := os.ReadFile(filepath.Join(a.dir, "direct.pkl"))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(d.dir, "direct.pkl"), pkl, 0o644); err != nil {
				t.Fatal(err)
			}
			d.mustRun(t, "<imports>", imports+"\nimport pickle, time\ngc.collect()")
			d.resetPeak(t)
			_, beforeDirect := d.peakRSS(t)
			direct = d.mustRun(t, "<unpickle>", "t = time.perf_counter()\nwith open('direct.pkl', 'rb') as f:\n    x, small = pickle.load(f)\ntime.perf_counter() - t")
			peakDirect, _ = d.peakRSS(t)
			t.Logf("resume: %v (then %v), peak +%.1f MB over %.1f MB, holding +%.1f MB (pickle.load from a file: %s s, peak +%.1f MB)",
				resume.Round(time.Millisecond), warm.Round(time.Millisecond), float64(peak-before)/mb, float64(before)/mb, float64(now-before)/mb, direct, float64(peakDirect-beforeDirect)/mb)
		})
	}
}

// Once a run has called a tool, the control channel is read through its
// demultiplexer: a restore still reads its bytes in step. The tools
// module itself is not saved (it exists only in runs given tools).
func TestSnapshotAfterToolCalls(t *testing.T) {
	w := startToolsWorker(t, systemPython, false)
	if err := os.WriteFile(filepath.Join(filepath.Dir(w.dir), SnapshotFile), SnapshotSource, 0o444); err != nil {
		t.Fatal(err)
	}
	f := newFakeTools()
	res, _, _ := toolRun(t, w, f, "import tools\nechoed = tools.everything.echo(message='hi')\nkept = [1, 2, 3]\n")
	wantSuccess(t, res)
	data, s := w.snapshot(t, 1<<20)
	if why := reasons(s.Unsaveable); !strings.Contains(why["tools"], "tools module") || sorted(s.Saved) != "echoed,kept" {
		t.Errorf("%+v", s)
	}
	for i := 0; i < 3; i++ {
		if r := w.restore(t, data); sorted(r.Restored) != "echoed,kept" {
			t.Errorf("%+v", r)
		}
	}
	res, _, _ = toolRun(t, w, f, "tools.everything.echo(message='hi') == echoed and kept == [1, 2, 3]")
	wantSuccess(t, res)
	jsonEqual(t, res.ReturnValue, "true")
}

// TestSnapshotDefinitions: the kinds of definitions sessions hold (generic
// classes, frozen and slotted dataclasses, ABCs, flags, metaclasses, nested
// classes, recursion, coroutines, private slots, properties, cached
// properties, partials, bound methods, singledispatch) come back working.
func TestSnapshotDefinitions(t *testing.T) {
	for name, python := range interpreters(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			a := startSnapshotWorker(t, python)
			a.mustRun(t, "<c1>", `
import abc, dataclasses, enum, functools, typing, sys
T = typing.TypeVar("T")
class Box(typing.Generic[T]):
    def __init__(self, v: T):
        self.v = v
    def get(self) -> T:
        return self.v
b = Box(3)
@dataclasses.dataclass(frozen=True)
class Frozen:
    a: int
    b: str = "x"
fz = Frozen(1)
class Shape(abc.ABC):
    @abc.abstractmethod
    def area(self): ...
class Sq(Shape):
    def __init__(self, s): self.s = s
    def area(self): return self.s ** 2
sq = Sq(3)
class Perm(enum.IntFlag):
    R = 4
    W = 2
rw = Perm.R | Perm.W
class Lvl(enum.IntEnum):
    LOW = 1
    HIGH = 2
class MyErr(ValueError):
    pass
err = MyErr("bad", 2)
class Meta(type):
    def __new__(m, name, bases, ns):
        ns["tagged"] = True
        return super().__new__(m, name, bases, ns)
class Tagged(metaclass=Meta):
    x = 1
class Outer:
    class Inner:
        def f(self): return "inner"
oi = Outer.Inner()
def fact(n):
    return 1 if n <= 1 else n * fact(n - 1)
def mutual():
    def even(n): return True if n == 0 else odd(n - 1)
    def odd(n): return False if n == 0 else even(n - 1)
    return even
ev = mutual()
def gen(n):
    yield from range(n)
async def coro():
    return 5
class Priv:
    __slots__ = ("__secret", "pub")
    def __init__(self):
        self.__secret = 42
        self.pub = 1
    def secret(self): return self.__secret
pv = Priv()
class Temp:
    def __init__(self): self._c = 0
    @property
    def c(self): return self._c
    @c.setter
    def c(self, v): self._c = v * 2
    @functools.cached_property
    def heavy(self): return [1, 2]
tp = Temp()
tp.c = 5
part = functools.partial(fact, 5)
bm = sq.area
@functools.singledispatch
def show(x): return "obj"
@show.register
def _(x: int): return "int"
class WithInitSub:
    registry = []
    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        WithInitSub.registry.append(cls.__name__)
class Sub1(WithInitSub): pass
if sys.version_info >= (3, 10):
    exec("@dataclasses.dataclass(slots=True)\nclass Slotted:\n    a: int\nsl = Slotted(4)\n")
`)
			data, s := a.snapshot(t, 64<<20)
			if len(s.Unsaveable) != 0 {
				t.Errorf("unsaveable: %+v", s.Unsaveable)
			}
			b := startSnapshotWorker(t, python)
			r := b.restore(t, data)
			if len(r.Failed) != 0 {
				t.Errorf("failed: %+v", r.Failed)
			}
			res, _, stderr := b.run(t, Request{Code: `
import asyncio, sys
checks = {
 "generic": b.get() == 3 and isinstance(b, Box) and Box.__parameters__ == (T,) and Box[int] is not None,
 "frozen": fz == Frozen(1, "x") and hash(fz) == hash(Frozen(1)),
 "abc": sq.area() == 9 and isinstance(sq, Shape) and Shape.__abstractmethods__ == frozenset({"area"}),
 "flag": rw == 6 and Perm.R in rw and isinstance(rw, Perm),
 "intenum": Lvl.HIGH > Lvl.LOW and Lvl(2) is Lvl.HIGH,
 "exc": isinstance(err, MyErr) and err.args == ("bad", 2),
 "meta": type(Tagged) is Meta and Tagged.tagged and Tagged.x == 1,
 "nested": oi.f() == "inner" and type(oi).__qualname__ == "Outer.Inner",
 "recursive": fact(5) == 120,
 "mutual": ev(10) is True and ev(7) is False,
 "gen": list(gen(3)) == [0, 1, 2],
 "coro": asyncio.run(coro()) == 5,
 "slots priv": pv.secret() == 42 and pv.pub == 1,
 "property": tp.c == 10 and (setattr(tp, "c", 1), tp.c)[1] == 2 and tp.heavy == [1, 2],
 "partial": part() == 120,
 "bound": bm() == 9,
 "singledispatch": show(1) == "int" and show("a") == "obj",
 # __init_subclass__ runs again as a class is made anew: its registry
 # has Sub1 twice.
 "init_subclass": "Sub1" in WithInitSub.registry,
 "slotted": sys.version_info < (3, 10) or (sl.a == 4 and not hasattr(sl, "__dict__")),
}
try:
    Shape()
    checks["abc abstract"] = False
except TypeError:
    checks["abc abstract"] = True
[k for k, v in checks.items() if not v]
`, Filename: "<c2>"})
			if res.Status != "success" {
				t.Fatalf("%+v\n%s", res.Error, stderr)
			}
			jsonEqual(t, res.ReturnValue, "[]")
		})
	}
}

// A global that fails after part of it was sent is abandoned in the
// stream: the restore skips it, and the globals after it come back.
func TestSnapshotAbandoned(t *testing.T) {
	w := startSnapshotWorker(t, systemPython)
	w.mustRun(t, "<cell 1>", "import threading\nbefore = {'k': 1}\nbad = [b'x' * 3_000_000, threading.Lock()]\nafter = [before, 2]\n")
	data, s := w.snapshot(t, 64<<20)
	if why := reasons(s.Unsaveable); why["bad"] != "list: cannot pickle '_thread.lock' object" || len(data) < 3_000_000 {
		t.Errorf("%+v, %d bytes", s, len(data))
	}
	b := startSnapshotWorker(t, systemPython)
	if r := b.restore(t, data); sorted(r.Restored) != "after,before,threading" || len(r.Failed) != 0 {
		t.Errorf("%+v", r)
	}
	// after was saved in a memo epoch of its own: its dict is a copy.
	jsonEqual(t, b.mustRun(t, "<cell 2>", "[after, 'bad' in globals(), after[0] is before]"), `[[{"k": 1}, 2], false, false]`)
}
