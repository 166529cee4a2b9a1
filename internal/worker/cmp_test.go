package worker

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

func TestTmpCompare(t *testing.T) {
	cases := []string{
		"a = 1\nb = 0\nc = a / b\n",
		"x = {}\nx['missing']",
		"x = {}\nprint(x['missing'])",
		"def f(n):\n    return 1 / n\n\nf(0) + 1",
		"try:\n    1/0\nexcept Exception as e:\n    raise ValueError('v') from e\n",
		"class MyError(Exception): pass\nraise MyError('boom')",
		"x = 1\ny = (\n",
		"def f():\n  return 1\n    return 2\n",
		"import json\njson.loads('{')",
		"def r(): r()\nr()",
		"import sys\nsys.exit('bye')",
	}
	for name, py := range interpreters(t) {
		w := startPython(t, py, false)
		for _, code := range cases {
			file := filepath.Join(w.dir, "cell.py")
			os.WriteFile(file, []byte(code), 0o644)
			cmd := exec.Command(py, "-I", "-B", file)
			cmd.Dir = w.dir
			want, _ := cmd.CombinedOutput()
			_, _, got := w.run(t, Request{Code: code, Filename: file})
			if got != string(want) {
				t.Errorf("%s %q:\n--- python:\n%s--- worker:\n%s", name, code, want, got)
			}
		}
	}
}
