package tools

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/pysandbox/pysandbox/internal/worker"
)

// TestFigureStoreShares: one owner's figures cannot push another's out of
// the store; an owner over its share loses its own oldest; the store's
// bound holds; a figure is its owner's alone.
func TestFigureStoreShares(t *testing.T) {
	f := newFigureStore()
	alice := f.put([]byte("alice's plot"), "alice", "")
	var bobs []string
	for i := 0; i < 3*maxStoredFigures; i++ {
		bobs = append(bobs, f.put([]byte(fmt.Sprint("bob's plot ", i)), "bob", ""))
	}
	if png, ok := f.get(alice, "alice"); !ok || !bytes.Equal(png, []byte("alice's plot")) {
		t.Errorf("alice's figure was pushed out by bob's")
	}
	if _, ok := f.get(alice, "bob"); ok {
		t.Error("bob read alice's figure")
	}
	for i, uri := range bobs {
		_, ok := f.get(uri, "bob")
		if want := i >= len(bobs)-maxFiguresPerOwner; ok != want {
			t.Errorf("bob's figure %d kept: %v, want %v", i, ok, want)
		}
	}
	// Many owners together: the store's own bound, and those holding the
	// most lose theirs first (alice's one stays).
	for i := 0; i < 2*maxStoredFigures; i++ {
		f.put([]byte("x"), fmt.Sprint("owner", i%8), "")
	}
	if len(f.order) > maxStoredFigures || len(f.byID) != len(f.order) {
		t.Errorf("%d figures stored (%d named), bound %d", len(f.order), len(f.byID), maxStoredFigures)
	}
	if _, ok := f.get(alice, "alice"); !ok {
		t.Error("alice's one figure went before the big holders'")
	}
	// Large figures: an owner's bytes are bounded too.
	g := newFigureStore()
	big := bytes.Repeat([]byte("p"), maxFigureBytesPerOwner/2+1)
	first := g.put(big, "carol", "")
	g.put(big, "carol", "")
	if _, ok := g.get(first, "carol"); ok || g.bytes > maxFigureBytesPerOwner {
		t.Errorf("carol holds %d bytes, share %d", g.bytes, maxFigureBytesPerOwner)
	}
}

// TestFiguresOmitted: figures beyond the most a run returns are counted,
// and the reply says so and what to do, rather than dropping them unsaid.
func TestFiguresOmitted(t *testing.T) {
	cs := connect(t, nil)
	code := "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\nfor i in range(" + fmt.Sprint(worker.MaxFigures+3) + "):\n    plt.figure(figsize=(1, 1), dpi=20)\n"
	res, out := call(t, cs, "run_python", map[string]any{"code": code, "timeout_seconds": 60})
	figs, _ := out["figures"].([]any)
	if res.IsError || len(figs) != worker.MaxFigures || out["figures_omitted"] != 3.0 || !strings.Contains(text(res), "3 more figure(s) were left open and not returned") {
		t.Errorf("%d figures, %v omitted: %.500s", len(figs), out["figures_omitted"], text(res))
	}
}
