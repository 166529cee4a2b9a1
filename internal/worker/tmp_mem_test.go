package worker

import ("testing"; "os")

func TestTmpSmallObjects(t *testing.T) {
	for _, py := range interpreters(t) {
		argv := append([]string{"/bin/sh", "-c", `ulimit -v 150000 && exec "$@"`, "sh"}, Command(py, "WORKER_PY", false)...)
		w := startWorker(t, argv)
		for i := 0; i < 3; i++ {
			res, err := w.conn.Run(testContext(t), Request{Code: "x = []\nwhile True:\n    x.append(str(len(x)) * 3)\n"})
			if err != nil {
				b, _ := os.ReadFile(w.stderr)
				t.Errorf("%s: %v %s", py, err, b)
				break
			}
			_, stderr := w.output(t)
			if res.Error == nil || res.Error.Type != "MemoryError" || res.Error.Traceback == "" {
			t.Errorf("%s: %+v %+v %q", py, res, res.Error, stderr[max(0, len(stderr)-100):])
			}
		}
	}
}
