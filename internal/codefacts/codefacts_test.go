package codefacts

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/interp"
	"github.com/pysandbox/pysandbox/internal/sandbox"
	"github.com/pysandbox/pysandbox/internal/worker"
)

func TestMain(m *testing.M) {
	// The native backend re-executes this test binary as the sandbox init.
	sandbox.InitMain()
	os.Exit(m.Run())
}

// newEngine builds an engine on the native backend, the system python3 by
// default and every interpreter on the machine selectable, as the server
// has them.
func newEngine(t testing.TB, mod func(*engine.Config)) *engine.Engine {
	t.Helper()
	ctx := context.Background()
	py, err := interp.Find(ctx, "")
	if err != nil {
		t.Fatalf("no python3: %v", err)
	}
	cfg := engine.Config{
		Backend:        sandbox.NewNative(),
		Python:         py,
		Interpreters:   interp.Discover(ctx),
		Limits:         sandbox.Limits{MemoryBytes: 512 << 20, MaxProcs: 64, TmpBytes: 64 << 20},
		DefaultTimeout: 30 * time.Second,
		MaxTimeout:     2 * time.Minute,
		MaxOutput:      1 << 20,
		MaxConcurrent:  4,
		MaxQueue:       64,
	}
	if mod != nil {
		mod(&cfg)
	}
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// fact is what a case expects of one list: every name in has, and with
// exact, nothing else.
type want struct {
	imports, process, file, network, dynamic, urls, deps []string
	exact                                                bool // the lists are exactly these
	syntax                                               string
	unanalysable                                         bool
	lines                                                int
	// since: the case needs this Python (e.g. "3.10" for match); before
	// it, the code is a syntax error.
	since string
}

type factCase struct {
	name string
	code string
	want want
}

var bombs = map[string]string{
	"unary":  strings.Repeat("-", 100000) + "1",
	"binop":  "1" + strings.Repeat("+1", 200000),
	"parens": strings.Repeat("(", 5000) + "1" + strings.Repeat(")", 5000),
	"calls":  "f" + strings.Repeat("()", 200000),
}

func factCases() []factCase {
	cs := []factCase{
		{"benign", "import json\nclass A:\n    def __init__(self):\n        super().__init__()\n        self.__dict__['x'] = 1\n        print(self.__class__.__name__, json.__version__)\nprint(json.dumps({'a': 1}))\n",
			want{imports: []string{"json"}, exact: true, lines: 7}},
		{"import as", "import subprocess as sp\nsp.run(['ls'])",
			want{imports: []string{"subprocess"}, process: []string{"subprocess.run"}, exact: true, lines: 2}},
		{"from import", "from os import system\nsystem('x')",
			want{imports: []string{"os"}, process: []string{"os.system"}, exact: true}},
		{"from import as", "from os import system as s, popen\ns('x'); popen('y')",
			want{imports: []string{"os"}, process: []string{"os.popen", "os.system"}, exact: true}},
		{"dotted import", "import os.path\nos.system('x'); os.path.join('a', 'b')",
			want{imports: []string{"os", "os.path"}, process: []string{"os.system"}, exact: true}},
		{"assigned alias", "import os\nrun = os.system\nrun2 = run\nrun2('ls')",
			want{imports: []string{"os"}, process: []string{"os.system"}, exact: true}},
		{"star import", "from subprocess import *\ncall(['ls'])",
			want{imports: []string{"subprocess"}, process: []string{"subprocess.call"}, exact: true}},
		{"process family", "import os as o, pty, multiprocessing\no.execvp('a', ['a'])\no.fork()\npty.spawn('sh')\nmultiprocessing.Process(target=print).start()\nimport asyncio\nasyncio.create_subprocess_exec('ls')",
			want{process: []string{"asyncio.create_subprocess_exec", "multiprocessing.Process", "os.execvp", "os.fork", "pty.spawn"}}},
		{"files", "import shutil, os\nfrom pathlib import Path\nopen('f', 'w').write('x')\np = Path('a') / 'b'\np.write_text('y')\nPath('c').read_bytes()\nshutil.rmtree('/tmp/x')\nos.remove('z')\nimport io\nio.open('q')",
			want{imports: []string{"os", "pathlib", "shutil", "io"}, file: []string{"io.open", "open", "os.remove", "pathlib.Path.read_bytes", "pathlib.Path.write_text", "shutil.rmtree"}, exact: true}},
		{"path method on an unknown object", "def f(p):\n    p.write_text('x')",
			want{file: []string{"*.write_text"}, exact: true}},
		{"network", "import urllib.request as ur\nimport socket, requests\nhost = 'h'\nur.urlopen('https://example.com/x')\nsocket.create_connection(('h', 80))\nrequests.get(f'https://{host}/api/{host.upper()}')",
			want{imports: []string{"requests", "socket", "urllib", "urllib.request"}, network: []string{"requests.get", "socket.create_connection", "urllib.request.urlopen"},
				urls: []string{"https://example.com/x", "https://{host}/api/{...}"}, exact: true}},
		{"relative imports", "from .mod import f\nfrom .. import x\nfrom ..pkg.sub import y",
			want{imports: []string{"..", "..pkg.sub", ".mod"}, exact: true}},
		{"import_module literal", "import importlib\nm = importlib.import_module('json.decoder')",
			want{imports: []string{"importlib", "json", "json.decoder"}, dynamic: []string{"importlib.import_module"}, exact: true}},
		{"urls", "a = 'see https://example.com/a?b=1.'\nb = b'ftp://files.example.org/x'\nc = \"wss://ws.example.net/s\"\nd = 'http://' + 'not.a.url'\ne = 'mailto:x@example.com'",
			want{urls: []string{"ftp://files.example.org/x", "https://example.com/a?b=1", "wss://ws.example.net/s"}, exact: true}},
		{"pep 723", "# /// script\n# requires-python = \">=3.8\"\n# dependencies = [\"rich\", \"requests<3\"]\n# ///\nimport requests\n",
			want{imports: []string{"requests"}, deps: []string{"requests<3", "rich"}, exact: true, lines: 5}},
		{"syntax error", "# /// script\n# dependencies = [\"rich\"]\n# ///\nimport os\ndef f(:\n    os.system('x')\n",
			want{syntax: "(line 5)", deps: []string{"rich"}, exact: true}},
		{"null byte", "x = 1\x00", want{syntax: "null", exact: true}},
		{"line endings", "a = 1\r\nb = 2\rc = 3\n", want{exact: true, lines: 3}},
		{"match statement", "match x:\n    case 1:\n        import os\n", want{imports: []string{"os"}, exact: true, since: "3.10"}},

		// Obfuscations: each must leave a trace in dynamic_code.
		{"getattr builtins", `getattr(__builtins__, "ex"+"ec")("print(1)")`,
			want{dynamic: []string{"__builtins__", "getattr(non-literal)"}}},
		{"builtins dict", `__builtins__.__dict__["eval"]("1")`,
			want{dynamic: []string{".__dict__", "__builtins__"}}},
		{"import_module computed", "import importlib\nimportlib.import_module(\"o\"+\"s\").system('x')",
			want{dynamic: []string{"importlib.import_module", "importlib.import_module(non-literal)"}}},
		{"exec base64", "import base64\nexec(base64.b64decode(\"cHJpbnQoMSk=\").decode())",
			want{dynamic: []string{"exec", "exec(decoded)", "exec(non-literal)"}}},
		{"exec rot13", "import codecs\nexec(codecs.decode(\"cevag(1)\", \"rot13\"))",
			want{dynamic: []string{"exec", "exec(decoded)"}}},
		{"__import__", `__import__("subprocess").run(["ls"])`,
			want{imports: []string{"subprocess"}, process: []string{"subprocess.run"}, dynamic: []string{"__import__"}}},
		{"globals subscript", `globals()["__builtins__"]`,
			want{dynamic: []string{"'__builtins__'", "globals()[...]"}}},
		{"lambda globals", `(lambda: 0).__globals__["os"]`,
			want{dynamic: []string{".__globals__"}}},
		{"subclasses", `().__class__.__bases__[0].__subclasses__()`,
			want{dynamic: []string{".__bases__", ".__subclasses__"}}},
		{"compile", `c = compile("1+1", "<s>", "eval")`,
			want{dynamic: []string{"compile"}}},
		{"code object", `type((lambda: 0).__code__)(0, 0, 0, 0, 0, 0, b"", (), (), (), "", "", 0, b"")`,
			want{dynamic: []string{".__code__", "type(...)(...)"}}},
		{"eval alias", "e = eval\ne('1')", want{dynamic: []string{"eval"}}},
		{"nfkc eval", "\uff45\uff56\uff41\uff4c('1')", want{dynamic: []string{"eval"}}},
		{"deserialisers", "import marshal, pickle, ctypes\nmarshal.loads(b'')\npickle.loads(b'')\nctypes.CDLL(None)",
			want{dynamic: []string{"ctypes.CDLL", "import ctypes", "marshal.loads", "pickle.loads"}}},
		{"sys.modules", "import sys\nsys.modules['os'].system('x')", want{dynamic: []string{"sys.modules"}}},
		{"getattr dunder", "def f(): pass\ng = getattr(f, '__globals__')",
			want{dynamic: []string{"'__globals__'", "getattr(__globals__)"}}},
		{"frames", "import sys\nsys._getframe().f_back.f_globals", want{dynamic: []string{".f_back", ".f_globals", "sys._getframe"}}},
		{"builtins assignment", "import builtins\nbuiltins.print = None", want{dynamic: []string{"builtins.print="}}},
		{"type 3 args", "T = type('T', (object,), {})", want{dynamic: []string{"type(name, bases, dict)"}}},
		{"unknown receiver", "import sys\nsys.modules['os'].system('x')\ndef f(m):\n    m.popen('y')",
			want{process: []string{"*.popen", "*.system"}, dynamic: []string{"sys.modules"}}},
		{"builtin behind a dead import", "if 0:\n    from re import compile\ncompile('x', 'f', 'exec')",
			want{dynamic: []string{"compile"}}},
		{"getattr as a value", "import os\nlist(map(getattr, [os], ['sys' + 'tem']))",
			want{dynamic: []string{"getattr(non-literal)"}}},
		{"import hook", "import sys\nsys.meta_path = []", want{dynamic: []string{"sys.meta_path="}}},
		{"walrus alias", "import os\n(r := os.system)('x')", want{process: []string{"os.system"}, since: "3.8"}},

		// Modules other modules re-export, reached through attributes.
		{"os.path.os", "import os.path\nos.path.os.popen('id')", want{process: []string{"os.popen"}}},
		{"shutil.os", "import shutil\nshutil.os.system('id')", want{process: []string{"os.system"}}},
		{"tempfile._os", "import tempfile\ntempfile._os.system('id')", want{process: []string{"os.system"}}},
		{"re-export aliased", "from os import path\np = path.os\np.system('id')\nimport ctypes.util\nctypes.util.subprocess.run(['id'])\nimport six\nsix.moves.builtins.eval('1')",
			want{process: []string{"os.system", "subprocess.run"}, dynamic: []string{"eval"}}},
		{"getattr re-export", "import shutil\ngetattr(shutil, 'os').system('id')", want{process: []string{"os.system"}}},
		{"re-export from import", "from shutil import os as o\no.system('id')", want{process: []string{"*.system"}}},
		{"unknown module attribute", "import foo\nfoo.bar.system('id')\nfoo.bar.run(['id'])\nfoo.baz.posix_spawnp('id', ['id'], {})",
			want{process: []string{"*.posix_spawnp", "*.run", "*.system"}}},
		{"run and system that are not processes", "import asyncio, uvicorn, platform\nfrom absl import app\nfrom distutils.errors import *\nasyncio.run(main())\nuvicorn.run(a)\napp.run(main)\nplatform.system()\nx.run()\ny.cmd.run()",
			want{imports: []string{"absl", "asyncio", "distutils", "distutils.errors", "platform", "uvicorn"}, exact: true}},
		{"own submodule named subprocess", "from .subprocess import *\nfrom pkg.utils import subprocess\nfrom pkg.utils.subprocess import make\nsubprocess.helper()\nmake()",
			want{imports: []string{".subprocess", "pkg", "pkg.utils", "pkg.utils.subprocess"}, exact: true}},
		// Imports by string.
		{"pkgutil.resolve_name", "import pkgutil\npkgutil.resolve_name('os:popen')('id')",
			want{imports: []string{"os", "pkgutil"}, process: []string{"os.popen"}, dynamic: []string{"pkgutil.resolve_name"}}},
		{"importlib.util", "import importlib.util\ns = importlib.util.spec_from_file_location('m', '/tmp/m.py')\nm = importlib.util.module_from_spec(s)\nimportlib.util.find_spec('os')",
			want{dynamic: []string{"importlib.util.find_spec", "importlib.util.module_from_spec", "importlib.util.spec_from_file_location"}}},
		{"runpy and zipimport", "import runpy, zipimport\nrunpy.run_module('x')\nrunpy.run_path('y')\nzipimport.zipimporter('a.zip').load_module('m')",
			want{dynamic: []string{"runpy.run_module", "runpy.run_path", "zipimport.zipimporter"}}},
		// Unpickling runs code.
		{"unpicklers", "import pickle, _pickle, copyreg, shelve\npickle._loads(b'')\npickle._Unpickler(f).load()\npickle.Unpickler(f)\n_pickle.loads(b'')\ncopyreg.dispatch_table\nshelve.open('x')",
			want{dynamic: []string{"_pickle.loads", "copyreg.dispatch_table", "pickle.Unpickler", "pickle._Unpickler", "pickle._loads", "shelve.open"}}},
		{"posix and pty", "import posix, pty\nposix.posix_spawnp('id', ['id'], {})\nposix.forkpty()\nposix.system('id')\npty.openpty()",
			want{process: []string{"posix.forkpty", "posix.posix_spawnp", "posix.system", "pty.openpty"}}},
		{"pagers and browsers", "import pydoc, webbrowser\npydoc.tempfilepager('x', 'sh -c id')\npydoc.pipepager('x', 'id')\npydoc.pager('x')\nwebbrowser.open('u')",
			want{process: []string{"pydoc.pager", "pydoc.pipepager", "pydoc.tempfilepager", "webbrowser.open"}}},
		{"logging.config", "import logging.config\nlogging.config.dictConfig({})\nlogging.config.fileConfig('f')\nlogging.config.listen()",
			want{dynamic: []string{"logging.config.dictConfig", "logging.config.fileConfig", "logging.config.listen"}}},
		{"library helpers that run commands", "import uuid, platform\nimport distutils.spawn, distutils.util\nimport ctypes.util\nuuid._get_command_stdout('id')\ndistutils.spawn.spawn(['id'])\ndistutils.util.execute(f, ())\nplatform._syscmd_file('x')\nctypes.util.find_library('c')",
			want{process: []string{"ctypes.util.find_library", "distutils.spawn.spawn", "distutils.util.execute", "platform._syscmd_file", "uuid._get_command_stdout"}}},
		{"string runners", "import code, codeop, timeit, doctest, cProfile, profile, trace\ncode.interact()\ncode.InteractiveInterpreter().runsource('x')\ncodeop.compile_command('x')\ntimeit.timeit('x')\ndoctest.run_docstring_examples(f, {})\ncProfile.run('x')\nprofile.run('x')\nt = trace.Trace()\nt.run('x')",
			want{dynamic: []string{"cProfile.run", "code.InteractiveInterpreter", "code.interact", "codeop.compile_command", "doctest.run_docstring_examples", "profile.run", "timeit.timeit", "trace.Trace.run"}}},
	}
	for name, code := range bombs {
		cs = append(cs, factCase{"bomb " + name, code, want{unanalysable: true, syntax: "too deeply nested", exact: true}})
	}
	return cs
}

// check compares f with w on Python version v ("3.11").
func check(t *testing.T, c factCase, v string, f *Facts) {
	t.Helper()
	w := c.want
	if w.since != "" && versionBefore(v, w.since) {
		if f.SyntaxError == "" {
			t.Errorf("%s on %s: no syntax error: %+v", c.name, v, f)
		}
		return
	}
	if w.syntax == "" && f.SyntaxError != "" {
		t.Errorf("%s: unexpected syntax error %q", c.name, f.SyntaxError)
	}
	if w.syntax != "" && !strings.Contains(f.SyntaxError, w.syntax) {
		t.Errorf("%s: syntax error %q, want it to contain %q", c.name, f.SyntaxError, w.syntax)
	}
	dyn := w.dynamic
	if w.unanalysable {
		dyn = append(slices.Clone(dyn), "unanalysable")
	}
	for _, l := range []struct {
		name      string
		got, want []string
	}{
		{"imports", f.Imports, w.imports},
		{"process_calls", f.ProcessCalls, w.process},
		{"file_calls", f.FileCalls, w.file},
		{"network_calls", f.NetworkCalls, w.network},
		{"dynamic_code", f.DynamicCode, dyn},
		{"urls", f.URLs, w.urls},
		{"dependencies", f.Dependencies, w.deps},
	} {
		if l.got == nil {
			t.Errorf("%s: %s is nil, not empty", c.name, l.name)
		}
		if !slices.IsSorted(l.got) || len(slices.Compact(slices.Clone(l.got))) != len(l.got) {
			t.Errorf("%s: %s not sorted and unique: %q", c.name, l.name, l.got)
		}
		if w.exact {
			want := slices.Clone(l.want)
			slices.Sort(want)
			if !slices.Equal(l.got, want) && !(len(l.got) == 0 && len(want) == 0) {
				t.Errorf("%s: %s = %q, want %q", c.name, l.name, l.got, want)
			}
			continue
		}
		for _, x := range l.want {
			if !slices.Contains(l.got, x) {
				t.Errorf("%s: %s = %q, want it to hold %q", c.name, l.name, l.got, x)
			}
		}
	}
	if c.name != "benign" && !w.exact && len(f.DynamicCode) == 0 && len(w.dynamic) > 0 {
		t.Errorf("%s: no dynamic code", c.name)
	}
	if f.Bytes != len(c.code) {
		t.Errorf("%s: bytes %d, want %d", c.name, f.Bytes, len(c.code))
	}
	if w.lines != 0 && f.Lines != w.lines {
		t.Errorf("%s: lines %d, want %d", c.name, f.Lines, w.lines)
	}
}

func versionBefore(v, since string) bool {
	var a1, a2, b1, b2 int
	fmt.Sscanf(v, "%d.%d", &a1, &a2)
	fmt.Sscanf(since, "%d.%d", &b1, &b2)
	return a1 < b1 || a1 == b1 && a2 < b2
}

// pyenvPython finds a pyenv interpreter of version v ("3.8").
func pyenvPython(v string) string {
	m, _ := filepath.Glob("/root/.pyenv/versions/" + v + ".*/bin/python3")
	home, _ := os.UserHomeDir()
	if home != "" {
		m2, _ := filepath.Glob(filepath.Join(home, ".pyenv", "versions", v+".*", "bin", "python3"))
		m = append(m, m2...)
	}
	if len(m) == 0 {
		return ""
	}
	return m[0]
}

// TestDerive runs the table in real sandboxes, on the system Python and on
// pyenv's 3.8 and 3.13.
func TestDerive(t *testing.T) {
	e := newEngine(t, nil)
	sys := e.Config().Python.MajorMinor()
	for _, v := range []string{"", "3.8", "3.13"} {
		name, version := "system-"+sys, sys
		if v != "" {
			name, version = "pyenv-"+v, v
		}
		t.Run(name, func(t *testing.T) {
			if v != "" && pyenvPython(v) == "" {
				t.Skipf("no pyenv Python %s on this machine", v)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			for _, c := range factCases() {
				f, err := Derive(ctx, e, c.code, v)
				if err != nil {
					t.Errorf("%s: %v", c.name, err)
					continue
				}
				check(t, c, version, f)
				if strings.HasPrefix(c.name, "bomb") {
					t.Logf("%s: %s", c.name, f.SyntaxError)
				}
			}
		})
	}
}

// hostRunner runs the analyzer with a Python on the host, with no sandbox,
// the way the worker would (inputs as globals): to check the analyzer on
// every Python it supports, 3.6 and 3.7 among them, which the worker does
// not run on. Only the tests' own snippets go through it.
type hostRunner struct{ python string }

const hostBoot = `import json, sys
req = json.load(sys.stdin)
g = {"__name__": "__main__"}
g.update(req["inputs"])
exec(compile(req["code"], "<codefacts>", "exec"), g)
`

func (h hostRunner) Run(ctx context.Context, req engine.RunRequest) (*engine.Result, error) {
	in, err := json.Marshal(map[string]any{"code": req.Code, "inputs": req.Inputs})
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, h.python, "-I", "-S", "-c", hostBoot)
	cmd.Stdin = bytes.NewReader(in)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return &engine.Result{Status: engine.StatusError, Stdout: stdout.String(), Stderr: stderr.String(), Message: err.Error() + ": " + stderr.String()}, nil
	}
	return &engine.Result{Status: engine.StatusSuccess, Stdout: stdout.String(), Stderr: stderr.String()}, nil
}

// TestAnalyzerEveryPython runs the table through the analyzer on every
// Python 3 of the machine (pyenv's 3.6 to 3.13 here) directly.
func TestAnalyzerEveryPython(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	pythons := map[string]string{}
	if it, err := interp.Inspect(context.Background(), "/usr/bin/python3"); err == nil {
		pythons[it.Version] = it.Path
	}
	m, _ := filepath.Glob("/root/.pyenv/versions/3.*/bin/python3")
	for _, p := range m {
		if it, err := interp.Inspect(context.Background(), p); err == nil {
			pythons[it.Version] = it.Path
		}
	}
	if len(pythons) == 0 {
		t.Skip("no Python 3 on this machine")
	}
	var versions []string
	for v := range pythons {
		versions = append(versions, v)
	}
	slices.Sort(versions)
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			t.Parallel()
			mm := v[:strings.LastIndexByte(v, '.')]
			for _, c := range factCases() {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				f, err := Derive(ctx, hostRunner{pythons[v]}, c.code, "")
				cancel()
				if err != nil {
					t.Errorf("%s: %v", c.name, err)
					continue
				}
				check(t, c, mm, f)
			}
		})
	}
}

// TestDeriveLargeProgram: a program at the size limit is analysed within
// the timeout, and one past it is refused before anything runs.
func TestDeriveLargeProgram(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	e := newEngine(t, nil)
	code := program(MaxCodeBytes)
	start := time.Now()
	f, err := Derive(context.Background(), e, code, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d bytes, %d lines: %v", f.Bytes, f.Lines, time.Since(start))
	if f.Bytes != len(code) || !slices.Contains(f.ProcessCalls, "subprocess.run") || !slices.Contains(f.DynamicCode, "exec") {
		t.Errorf("facts of the large program: %s", f.Summary())
	}
	if _, err := Derive(context.Background(), e, code+strings.Repeat("#", MaxCodeBytes-len(code)+1), ""); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("past the limit: %v", err)
	}
}

// program generates a script of about size bytes.
func program(size int) string {
	var b strings.Builder
	b.WriteString("import os, subprocess, json\nfrom pathlib import Path\n")
	for i := 0; b.Len() < size-200; i++ {
		switch i % 5 {
		case 0:
			fmt.Fprintf(&b, "def f%d(a, b=%d):\n    return json.dumps({'a': a, 'b': b, 'u': 'https://example.com/%d'})\n", i, i, i%50)
		case 1:
			fmt.Fprintf(&b, "x%d = [os.path.join('a', str(k)) for k in range(%d)]\n", i, i%7)
		case 2:
			fmt.Fprintf(&b, "subprocess.run(['echo', '%d'], check=True)\n", i)
		case 3:
			fmt.Fprintf(&b, "Path('out%d.txt').write_text(str(x%d))\n", i, i-2)
		case 4:
			fmt.Fprintf(&b, "if x%d:\n    exec('y%d = %d')\n", i-3, i, i)
		}
	}
	return b.String()
}

// fakeRunner answers with what a hostile sandbox might print.
type fakeRunner struct {
	res *engine.Result
	err error
	got engine.RunRequest
}

func (f *fakeRunner) Run(_ context.Context, req engine.RunRequest) (*engine.Result, error) {
	f.got = req
	return f.res, f.err
}

func ok(stdout string) *engine.Result {
	return &engine.Result{Status: engine.StatusSuccess, Stdout: stdout}
}

// TestHostileOutput: whatever the sandbox prints, Derive either returns
// validated, capped facts whose sizes and dependencies it computed itself,
// or an error.
func TestHostileOutput(t *testing.T) {
	code := "# /// script\n# dependencies = [\"rich\"]\n# ///\nimport os\n"
	good := `{"v":1,"imports":["os"],"process_calls":[],"file_calls":[],"network_calls":[],"dynamic_code":[],"urls":[],"truncated":[],"syntax_error":""}`
	many := make([]string, 300)
	for i := range many {
		many[i] = fmt.Sprintf("subprocess.f%03d", i)
	}
	manyJSON, _ := json.Marshal(many)
	for _, c := range []struct {
		name string
		res  *engine.Result
		err  error
		ok   func(*Facts) bool
	}{
		{"good", ok(good + "\n"), nil, func(f *Facts) bool { return slices.Equal(f.Imports, []string{"os"}) }},
		{"only the last line", ok(`{"v":1,"imports":["evil"]}` + "\n" + good), nil, func(f *Facts) bool { return slices.Equal(f.Imports, []string{"os"}) }},
		{"sizes and dependencies are recomputed", ok(`{"v":1,"imports":[],"process_calls":[],"file_calls":[],"network_calls":[],"dynamic_code":[],"urls":[],"truncated":[],"syntax_error":""}`), nil,
			func(f *Facts) bool {
				return f.Bytes == len(code) && f.Lines == 4 && slices.Equal(f.Dependencies, []string{"rich"})
			}},
		{"claimed sizes are refused", ok(`{"v":1,"bytes":1,"lines":1,"dependencies":["x"]}`), nil, nil},
		{"unsorted and repeated", ok(`{"v":1,"imports":["b","a","b"]}`), nil, func(f *Facts) bool { return slices.Equal(f.Imports, []string{"a", "b"}) }},
		{"over the cap", ok(`{"v":1,"process_calls":` + string(manyJSON) + `}`), nil, func(f *Facts) bool {
			return len(f.ProcessCalls) == MaxEntries && slices.Contains(f.Truncated, "process_calls") && slices.Contains(f.DynamicCode, "unanalysable: too many process_calls")
		}},
		{"far over the cap", ok(`{"v":1,"imports":[` + strings.Repeat(`"a",`, 1000) + `"a"]}`), nil, nil},
		{"a number in a list", ok(`{"v":1,"imports":["os",1]}`), nil, nil},
		{"an object in a list", ok(`{"v":1,"imports":[{"a":"b"}]}`), nil, nil},
		{"a list for a string", ok(`{"v":1,"syntax_error":["x"]}`), nil, nil},
		{"an empty name", ok(`{"v":1,"imports":[""]}`), nil, nil},
		{"a long name", ok(`{"v":1,"imports":["` + strings.Repeat("a", MaxNameRunes+1) + `"]}`), nil, nil},
		{"a long url", ok(`{"v":1,"urls":["https://` + strings.Repeat("a", MaxURLRunes) + `"]}`), nil, nil},
		{"a control character", ok(`{"v":1,"imports":["os\u0007"]}`), nil, nil},
		{"an escape sequence", ok(`{"v":1,"urls":["https://x/\u001b[2J"]}`), nil, nil},
		{"a lone surrogate", ok(`{"v":1,"imports":["\ud800"]}`), nil, func(f *Facts) bool { return slices.Equal(f.Imports, []string{"\uFFFD"}) }},
		{"unknown field", ok(`{"v":1,"imports":[],"extra":1}`), nil, nil},
		{"unknown truncated list", ok(`{"v":1,"truncated":["bytes"]}`), nil, nil},
		{"wrong version", ok(`{"v":2}`), nil, nil},
		{"not an object", ok(`["os"]`), nil, nil},
		{"junk", ok("hello\n"), nil, nil},
		{"trailing junk", ok(good + ` {"v":1}`), nil, nil},
		{"a trailing bracket", ok(good + `]`), nil, nil},
		{"trailing spaces", ok(good + "  \n"), nil, func(f *Facts) bool { return slices.Equal(f.Imports, []string{"os"}) }},
		{"nothing", ok(""), nil, nil},
		{"a huge line", ok(`{"v":1,"syntax_error":"` + strings.Repeat("a", maxLine) + `"}`), nil, nil},
		{"syntax error cleaned", ok(`{"v":1,"syntax_error":"bad \u202e txt\u0000 (line 1)"}`), nil, func(f *Facts) bool {
			return !strings.ContainsAny(f.SyntaxError, "\u202e\x00") && strings.Contains(f.SyntaxError, "(line 1)")
		}},
		{"truncated output", &engine.Result{Status: engine.StatusSuccess, Stdout: good, StdoutTruncated: true}, nil, nil},
		{"timeout", &engine.Result{Status: engine.StatusTimeout, Stdout: good}, nil, nil},
		{"error", &engine.Result{Status: engine.StatusError, Stdout: good, Error: &worker.Exception{Type: "KeyError", Message: "x"}}, nil, nil},
		{"memory", &engine.Result{Status: engine.StatusMemoryLimit}, nil, nil},
		{"busy", nil, engine.ErrBusy, nil},
		{"no result", nil, nil, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := &fakeRunner{res: c.res, err: c.err}
			f, err := Derive(context.Background(), r, code, "")
			if c.ok == nil {
				if err == nil {
					t.Fatalf("accepted: %+v", f)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !c.ok(f) {
				t.Fatalf("facts: %+v", f)
			}
		})
	}
}

// TestInputNotCode: the program goes to the sandbox as an input, never as
// part of the code that runs; requires-python picks the interpreter as it
// would for a run of the program, through the analyzer's own block.
func TestInputNotCode(t *testing.T) {
	code := "# /// script\n# requires-python = \">=3.12\"\n# ///\nprint('\"\"\"; import os; os.system(\"zq_marker_7731\")')\n"
	r := &fakeRunner{res: ok(`{"v":1}`)}
	if _, err := Derive(context.Background(), r, code, ""); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(r.got.Code, "zq_marker_7731") || !strings.HasSuffix(r.got.Code, analyzer) {
		t.Errorf("the program is in the code")
	}
	if !strings.HasPrefix(r.got.Code, "# /// script\n# requires-python = \">=3.12\"\n# ///\n") {
		t.Errorf("no requires-python block: %q", r.got.Code[:80])
	}
	var got string
	if err := json.Unmarshal(r.got.Inputs[InputName], &got); err != nil || got != code {
		t.Errorf("input: %v %q", err, got)
	}
	if len(r.got.Inputs) != 1 || r.got.Network != nil || r.got.Tools != nil || r.got.Dependencies != nil {
		t.Errorf("request: %+v", r.got)
	}
	// With a version, or with no block, the analyzer is the code as is.
	for _, c := range []struct{ code, v string }{{code, "3.12"}, {"import os", ""}} {
		if _, err := Derive(context.Background(), r, c.code, c.v); err != nil || r.got.Code != analyzer || r.got.PythonVersion != c.v {
			t.Errorf("%q %q: %v %q", c.code, c.v, err, r.got.PythonVersion)
		}
	}
}

func TestValueAndSummary(t *testing.T) {
	f := &Facts{Bytes: 120, Lines: 4, Imports: []string{"os", "subprocess"}, ProcessCalls: []string{"subprocess.run"},
		FileCalls: []string{}, NetworkCalls: []string{}, DynamicCode: []string{"exec"}, URLs: []string{"https://x.example/\u202eexe.txt"}, Dependencies: []string{}}
	v := f.Value()
	if v["bytes"] != json.Number("120") || v["lines"] != json.Number("4") {
		t.Errorf("numbers: %#v %#v", v["bytes"], v["lines"])
	}
	if fmt.Sprint(v["imports"]) != "[os subprocess]" || v["file_calls"] != nil || v["syntax_error"] != nil || v["truncated"] != nil {
		t.Errorf("value: %#v", v)
	}
	if _, ok := v["imports"].([]any)[0].(string); !ok {
		t.Errorf("list elements are not strings")
	}
	s := f.Summary()
	want := `imports: os, subprocess; process calls: subprocess.run; dynamic code: exec; urls: https://x.example/\u202eexe.txt; 4 lines`
	if s != want {
		t.Errorf("summary\n%s\nwant\n%s", s, want)
	}
	many := &Facts{Lines: 1, Imports: []string{"a", "b", "c", "d", "e", "f", "g", "h"}, SyntaxError: "invalid syntax (line 1)"}
	if s := many.Summary(); s != "syntax error: invalid syntax (line 1); imports: a, b, c, d, e, f (+2 more); 1 line" {
		t.Errorf("summary: %s", s)
	}
	if s := (&Facts{}).Summary(); s != "no imports, calls or URLs of note; 0 lines" {
		t.Errorf("summary: %s", s)
	}
	long := &Facts{URLs: []string{"https://" + strings.Repeat("a", 1990)}}
	if s := long.Summary(); len([]rune(s)) > summaryMax+1 {
		t.Errorf("summary of %d characters", len([]rune(s)))
	}
}

func TestCountLines(t *testing.T) {
	for code, n := range map[string]int{"": 0, "a": 1, "a\n": 1, "a\nb": 2, "a\r\nb\r\n": 2, "a\rb\rc": 3, "\n\n": 2, "a\r": 1} {
		if got := countLines(code); got != n {
			t.Errorf("%q: %d, want %d", code, got, n)
		}
	}
}

// TestConcurrentDerive: analyses of different programs at once do not mix.
func TestConcurrentDerive(t *testing.T) {
	e := newEngine(t, nil)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mod := fmt.Sprintf("mod%d", i)
			f, err := Derive(context.Background(), e, "import "+mod, "")
			if err != nil || !slices.Equal(f.Imports, []string{mod}) {
				t.Errorf("%s: %v %+v", mod, err, f)
			}
		}()
	}
	wg.Wait()
}
