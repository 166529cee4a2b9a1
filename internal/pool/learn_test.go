package pool

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/testutil"
)

func newLearningPool(t *testing.T, budget int64) (*engine.Engine, *Pool) {
	t.Helper()
	cold, _ := newPooledEngine(t, 0, nil)
	p, err := New(context.Background(), Config{Backend: nativeOf(t), Spec: cold.Config().Backend.(*Pool).cfg.Spec, Size: 1, MaxConcurrent: 16,
		MemoryBudget: budget, Learn: 2, LearnWindow: 10, LearnMin: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return engineWith(t, p), p
}

func waitLearned(t *testing.T, p *Pool, m string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !slices.Contains(p.Info().Learned, m) {
		if time.Now().After(deadline) {
			t.Fatalf("%s was not learned; learned %v, preloaded %v", m, p.Info().Learned, p.Info().Preloaded)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestLearnHotModules: modules recent runs keep importing get preloaded,
// runs in flight on the replaced zygote finish normally, and a module
// that does not exist is tried once and never breaks the pool.
func TestLearnHotModules(t *testing.T) {
	e, p := newLearningPool(t, 2<<30)
	for _, m := range []string{"sqlite3", "xml"} {
		if p.hasModule(m) {
			t.Skipf("the worker already imports %s", m)
		}
	}
	probe := "import sys\npre = sorted(m for m in ('sqlite3', 'xml') if m in sys.modules)\nimport sqlite3, xml.dom.minidom\npre"
	for range 3 {
		run(t, e, "import sqlite3\ntry:\n    import pysbx_no_such_module\nexcept ImportError:\n    pass")
	}
	waitLearned(t, p, "sqlite3")
	if r := run(t, e, probe); r.ReturnValue == nil || !slices.Contains(testutil.Strings(r.ReturnValue), "sqlite3") {
		t.Fatalf("after learning, sqlite3 is not preloaded in a run: %v %s", r.ReturnValue, r.Stderr)
	}

	// A long run on the current preloading zygote, while the pool learns
	// a second module and replaces that zygote.
	var wg sync.WaitGroup
	wg.Add(1)
	var long *engine.Result
	go func() {
		defer wg.Done()
		long = run(t, e, "import sqlite3, time\ntime.sleep(2)\nprint('long run done')")
	}()
	time.Sleep(300 * time.Millisecond)
	for range 3 {
		run(t, e, "import xml.dom.minidom")
	}
	waitLearned(t, p, "xml")
	wg.Wait()
	if long.Status != engine.StatusSuccess || long.Stdout != "long run done\n" {
		t.Fatalf("the run on the replaced zygote: %s %q %s", long.Status, long.Stdout, long.Stderr)
	}
	r := run(t, e, probe)
	if got := testutil.Strings(r.ReturnValue); !slices.Equal(got, []string{"sqlite3", "xml"}) {
		t.Errorf("preloaded in a run: %v, want both", got)
	}
	if l := p.Info().Learned; len(l) != 2 || slices.Contains(l, "pysbx_no_such_module") {
		t.Errorf("learned %v", l)
	}
	p.learn.mu.Lock()
	tried := p.learn.tried["pysbx_no_such_module"]
	p.learn.mu.Unlock()
	if !tried {
		t.Error("the missing module was never tried")
	}
	// Learn is 2: nothing more is added, however hot.
	for range 4 {
		run(t, e, "import json, fractions")
	}
	time.Sleep(500 * time.Millisecond)
	if l := p.Info().Learned; len(l) != 2 {
		t.Errorf("learned beyond the limit: %v", l)
	}
}

// TestLearnWithinBudget: a module whose zygote would not fit the memory
// budget is not preloaded, and runs go on.
func TestLearnWithinBudget(t *testing.T) {
	// A budget that fits the light zygote but not a second one of about
	// the same size.
	_, probe := newLearningPool(t, 2<<30)
	light := probe.light.z.Ready.RSSBytes
	probe.Close()
	e, p := newLearningPool(t, light+light/2)
	for range 3 {
		run(t, e, "import sqlite3")
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		p.learn.mu.Lock()
		done := p.learn.tried["sqlite3"] && !p.learn.pending
		p.learn.mu.Unlock()
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the learner never decided")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if l := p.Info().Learned; len(l) != 0 {
		t.Errorf("learned %v beyond the budget", l)
	}
	if r := run(t, e, "import sqlite3\n'ok'"); r.ReturnValue != "ok" {
		t.Errorf("run after a refused preload: %s %s", r.Status, r.Stderr)
	}
}

func TestLearnerNames(t *testing.T) {
	l := newLearner(5, 4, 2, []string{"pandas"})
	none := func(string) bool { return false }
	for _, imports := range [][]string{{"this", "_private", "pandas.core", "os.path"}, {"this", "_private", "pandas", "os"}} {
		if m := l.observe(imports, func(m string) bool { return m == "os" }); m != "" {
			t.Errorf("observe %v offered %q", imports, m)
		}
	}
	// The window forgets: two hits far apart are not hot.
	l.observe([]string{"numpy"}, none)
	for range 4 {
		l.observe(nil, none)
	}
	if m := l.observe([]string{"numpy"}, none); m != "" {
		t.Errorf("numpy offered after its first hit left the window: %q", m)
	}
	if m := l.observe([]string{"numpy.linalg"}, none); m != "numpy" {
		t.Errorf("numpy not offered: %q", m)
	}
	// One at a time, each once.
	if m := l.observe([]string{"numpy", "scipy"}, none); m != "" {
		t.Errorf("offered %q while numpy is pending", m)
	}
	l.done("numpy", false, none)
	if m := l.observe([]string{"numpy"}, none); m != "" {
		t.Errorf("numpy offered twice: %q", m)
	}
}

// TestLearnerBoundsHostileNames: code that imports hundreds of names that
// never import cannot make the pool start zygotes without end: a run
// counts for at most maxNamesPerRun names, and failed tries use up the
// learner's attempts as successful ones do.
func TestLearnerBoundsHostileNames(t *testing.T) {
	l := newLearner(2, 50, 2, nil)
	none := func(string) bool { return false }
	var names []string
	for i := range 300 {
		names = append(names, fmt.Sprintf("zz%d", i))
	}
	started := 0
	for range 200 {
		// As the pool does: each try ends with done, which may name the
		// next module to try.
		for m := l.observe(names, none); m != ""; m = l.done(m, false, none) {
			started++
		}
	}
	if want := max(2*attemptsPerSlot, minLearnAttempts); started != want {
		t.Errorf("%d zygotes started for names that never import, want %d", started, want)
	}
	if n := len(l.counts); n > maxNamesPerRun {
		t.Errorf("%d names counted from runs of 300 imports each", n)
	}
}
