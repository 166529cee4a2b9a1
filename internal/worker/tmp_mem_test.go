package worker

import "testing"

func TestTmpSmallObjects(t *testing.T) {
	for _, py := range interpreters(t) {
		argv := append([]string{"/bin/sh", "-c", `ulimit -v 150000 && exec "$@"`, "sh"}, Command(py, "WORKER_PY", false)...)
		w := startWorker(t, argv)
		for i := 0; i < 3; i++ {
			res, _, stderr := w.run(t, Request{Code: "x = []\nwhile True:\n    x.append(str(len(x)) * 3)\n"})
			if res.Error == nil || res.Error.Type != "MemoryError" || res.Error.Traceback == "" {
			t.Errorf("%s: %+v %+v %q", py, res, res.Error, stderr[max(0, len(stderr)-100):])
			}
		}
	}
}
