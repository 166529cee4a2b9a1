package deps

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestSizeMeta: meta.json carries the env's charge, its own included,
// also when it is long enough to take a second block.
func TestSizeMeta(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 200} {
		env := Env{Key: "k", Accounting: diskAccounting}
		for i := range n {
			env.Requirements = append(env.Requirements, fmt.Sprintf("package-number-%03d>=1.0", i))
		}
		const base = 123456
		data, err := sizeMeta(&env, base)
		must(t, err)
		var back Env
		must(t, json.Unmarshal(data, &back))
		if want := base + InodeCost + roundBlock(int64(len(data))); env.SizeBytes != want || back.SizeBytes != want {
			t.Errorf("%d requirements: SizeBytes %d (written %d), want %d", n, env.SizeBytes, back.SizeBytes, want)
		}
		p := filepath.Join(t.TempDir(), metaName)
		must(t, writeMeta(p, data))
		if got, _ := diskUsage(p); got > InodeCost+roundBlock(int64(len(data))) {
			t.Errorf("meta.json takes %d bytes, charged %d", got, InodeCost+roundBlock(int64(len(data))))
		}
		if err := writeMeta(p, data); !errors.Is(err, fs.ErrExist) {
			t.Errorf("writeMeta over an existing file: %v", err)
		}
	}
}

// TestPublishHandsOver: a published build stops counting as reserved; one
// that lost the race to another process's env is not published, and
// keeps its reservation until the caller lets it go with its directory.
func TestPublishHandsOver(t *testing.T) {
	t.Parallel()
	c := newTestCache(t, 1<<30)
	fakeEnv(t, c, "taken", 1<<20, time.Now())
	build := func(key string) (bool, *reservation) {
		bdir, err := os.MkdirTemp(c.buildDir, key+"-")
		must(t, err)
		env := Env{Key: key, Accounting: diskAccounting}
		data, err := sizeMeta(&env, 0)
		must(t, err)
		must(t, writeMeta(filepath.Join(bdir, metaName), data))
		res := c.newReservation()
		must(t, res.settle(env.SizeBytes))
		ok, err := c.publish(bdir, key, res)
		must(t, err)
		if !ok {
			removeTree(bdir)
		}
		return ok, res
	}
	ok, res := build("fresh")
	if !ok || res.held != 0 || c.reserved != 0 {
		t.Errorf("published %v, reservation %d, reserved %d", ok, res.held, c.reserved)
	}
	ok, res = build("taken")
	if ok || res.held == 0 || c.reserved != res.held {
		t.Errorf("lost the race: published %v, reservation %d, reserved %d", ok, res.held, c.reserved)
	}
	res.release()
	if c.reserved != 0 {
		t.Errorf("reserved %d after release", c.reserved)
	}
	if ents, _ := os.ReadDir(c.buildDir); len(ents) != 0 {
		t.Errorf("build dirs left: %v", ents)
	}
}
