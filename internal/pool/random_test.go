package pool

import (
	"encoding/json"
	"fmt"
	"testing"
)

// TestRandomStateNotShared: pooled runs are forks of one zygote, so any
// random state the zygote holds is the same in every run unless it is
// reseeded per child: every run would then draw the same numbers, and one
// run could predict another's. numpy (preloaded here) keeps a global
// generator that does not reseed itself at fork.
func TestRandomStateNotShared(t *testing.T) {
	e, _ := newPooledEngine(t, 2, []string{"numpy"})
	code := `
import random, os, tempfile, sys
out = {"random": random.random(), "bits": random.getrandbits(64), "urandom": os.urandom(8).hex(),
       "tempfile": next(tempfile._get_candidate_names())}
try:
    import numpy
    out["numpy"] = float(numpy.random.random())
    out["numpy_preloaded"] = True
except ImportError:
    pass
print(__import__("json").dumps(out))
`
	seen := map[string]map[string]int{}
	for i := range 6 {
		r := run(t, e, code)
		if r.Status != "success" {
			t.Fatalf("run %d: %s %s", i, r.Status, r.Stderr)
		}
		var out map[string]any
		if err := json.Unmarshal([]byte(r.Stdout), &out); err != nil {
			t.Fatalf("%v: %q", err, r.Stdout)
		}
		for k, v := range out {
			if k == "numpy_preloaded" {
				continue
			}
			if seen[k] == nil {
				seen[k] = map[string]int{}
			}
			seen[k][fmt.Sprint(v)]++
		}
	}
	for gen, values := range seen {
		for v, n := range values {
			if n > 1 {
				t.Errorf("%s: %d pooled runs drew the same value %s", gen, n, v)
			}
		}
	}
	if _, ok := seen["numpy"]; !ok {
		t.Log("numpy is not installed: only the standard library's generators were checked")
	}
}
