package deps

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/interp"
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

func TestInstallSpec(t *testing.T) {
	t.Parallel()
	py := &interp.Interpreter{Path: "/usr/bin/python3.11", Version: "3.11.2", Major: 3, Minor: 11, Prefix: "/usr"}
	wheels := t.TempDir()
	os.Chmod(wheels, 0o755)
	bdir := t.TempDir()
	reqs := []string{"pysbx-alpha"}
	for _, tc := range []struct {
		name    string
		ix      IndexConfig
		network bool
		flags   []string
		absent  []string
	}{
		{"offline", IndexConfig{NoIndex: true, FindLinks: []string{wheels}}, false,
			[]string{"--no-index", "--find-links " + findLinksMount + "/0", "--only-binary :all:"}, []string{"--index-url"}},
		{"default index", IndexConfig{}, true, []string{"--only-binary :all:"}, []string{"--index-url", "--no-index"}},
		{"custom index", IndexConfig{IndexURL: "https://example.org/simple/", ExtraIndexURLs: []string{"https://a/simple/", "https://b/simple/"}}, true,
			[]string{"--index-url https://example.org/simple/", "--extra-index-url https://a/simple/", "--extra-index-url https://b/simple/"}, nil},
		{"find-links and index", IndexConfig{IndexURL: "https://example.org/simple/", FindLinks: []string{wheels}}, true, []string{"--find-links " + findLinksMount + "/0"}, nil},
		{"offline with a URL find-links", IndexConfig{NoIndex: true, FindLinks: []string{"https://example.org/wheels/"}}, true, []string{"--find-links https://example.org/wheels/"}, nil},
		{"sdists", IndexConfig{AllowSdist: true}, true, nil, []string{"--only-binary"}},
	} {
		c := newCache(t, tc.ix)
		c.uv = "" // the pip form, whatever this host has
		spec, err := c.installSpec(py, reqs, bdir)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if spec.Proxy != tc.network {
			t.Errorf("%s: Proxy = %v, want %v", tc.name, spec.Proxy, tc.network)
		}
		args := strings.Join(spec.Args, " ")
		wrapped := "-I -S -c " + scratchWrapper + " " + py.Path + " -I -m pip install --target " + scratchSite + " "
		if spec.Python != py.Path || spec.Prefix != py.Prefix || !strings.HasPrefix(args, wrapped) || !strings.HasSuffix(args, " -- pysbx-alpha") {
			t.Errorf("%s: %s %s", tc.name, spec.Python, args)
		}
		for _, f := range tc.flags {
			if !strings.Contains(args, " "+f+" ") {
				t.Errorf("%s: args lack %q: %s", tc.name, f, args)
			}
		}
		for _, f := range tc.absent {
			if strings.Contains(args, f) {
				t.Errorf("%s: args have %q: %s", tc.name, f, args)
			}
		}
		// Nothing of the host is writable: the install goes to scratch.
		for _, b := range spec.Binds {
			if b.Writable || b.Source != wheels || b.Target != findLinksMount+"/0" {
				t.Errorf("%s: find-links bind %+v", tc.name, b)
			}
		}
		if !slices.Contains(spec.Env, "HOME=/tmp") || spec.Limits != c.cfg.Limits {
			t.Errorf("%s: env %q limits %+v", tc.name, spec.Env, spec.Limits)
		}
	}

	// uv, when the host has it under /usr.
	c := newCache(t, IndexConfig{NoIndex: true, FindLinks: []string{wheels}})
	c.uv = "/usr/bin/uv"
	spec, err := c.installSpec(py, reqs, bdir)
	if err != nil {
		t.Fatal(err)
	}
	if args := strings.Join(spec.Args, " "); spec.Python != py.Path || !strings.HasPrefix(args, "-I -S -c "+scratchWrapper+" /usr/bin/uv pip install --target "+scratchSite+" --python "+py.Path+" --no-cache ") {
		t.Errorf("uv: %s %s", spec.Python, args)
	}
}

func TestSymlinkInside(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "sub", "x"), 0o755))
	must(os.WriteFile(filepath.Join(root, "sub", "f"), nil, 0o644))
	for name, target := range map[string]string{
		"ok-rel":    "sub/f",
		"ok-up":     "sub/x/../f",
		"ok-dangle": "nothing/../../..", // stops at "nothing", as the kernel would
		"abs":       "/etc/passwd",
		"up":        "../outside",
		"d":         "sub/x",
		"trick":     "d/../../..", // lexically "..", really root/sub/x/../../.. = ..
		"trick2":    "d/../..",    // lexically "..", really root/sub: inside
		"loop":      "loop",
	} {
		must(os.Symlink(target, filepath.Join(root, name)))
	}
	must(os.Symlink("../../sub/f", filepath.Join(root, "sub", "x", "deep")))
	must(os.Symlink("../../../f", filepath.Join(root, "sub", "x", "deepout")))
	for name, want := range map[string]bool{
		"ok-rel": true, "ok-up": true, "ok-dangle": true, "d": true, "trick2": true, "sub/x/deep": true,
		"abs": false, "up": false, "trick": false, "loop": false, "sub/x/deepout": false,
	} {
		if got := symlinkInside(root, filepath.Join(root, name)); got != want {
			t.Errorf("%s: inside = %v, want %v", name, got, want)
		}
	}
}

func TestSanitize(t *testing.T) {
	t.Parallel()
	bdir := t.TempDir()
	site := filepath.Join(bdir, "site")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(site, "pkg", "locked"), 0o777))
	must(os.WriteFile(filepath.Join(site, "pkg", "__init__.py"), []byte("VALUE = 1\n"), 0o666))
	must(os.WriteFile(filepath.Join(site, "pkg", "tool"), []byte("#!/bin/sh\n"), 0o4777))
	must(os.WriteFile(filepath.Join(site, "pkg", "locked", "f"), []byte("x"), 0o600))
	must(os.Chmod(filepath.Join(site, "pkg", "locked"), 0o000))
	must(os.Symlink("/etc/passwd", filepath.Join(site, "pkg", "passwd")))
	must(os.Symlink("__init__.py", filepath.Join(site, "pkg", "alias.py")))
	must(os.Link(filepath.Join(site, "pkg", "__init__.py"), filepath.Join(site, "pkg", "same.py")))
	must(os.WriteFile(filepath.Join(bdir, "meta.json"), []byte("{}"), 0o666))
	must(os.Symlink("/etc", filepath.Join(bdir, "junk")))
	log := slog.New(slog.NewTextHandler(&testLog{t: t, ok: true}, nil))
	size, err := sanitize(bdir, os.Getuid(), os.Getgid(), log)
	if err != nil {
		t.Fatal(err)
	}
	// Three directories, three files (one with two names, charged once)
	// and a symlink: seven inodes, each charged with its blocks.
	if want, _ := diskUsage(site); size != want || size < 7*InodeCost {
		t.Errorf("size = %d, want %d (7 inodes and their blocks)", size, want)
	}
	modes := map[string]fs.FileMode{
		"site":                 0o755 | fs.ModeDir,
		"site/pkg":             0o755 | fs.ModeDir,
		"site/pkg/locked":      0o755 | fs.ModeDir,
		"site/pkg/locked/f":    0o644,
		"site/pkg/__init__.py": 0o644,
		"site/pkg/tool":        0o755,
	}
	for p, want := range modes {
		fi, err := os.Lstat(filepath.Join(bdir, p))
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		if fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v", p, fi.Mode(), want)
		}
	}
	for _, gone := range []string{"site/pkg/passwd", "meta.json", "junk"} {
		if _, err := os.Lstat(filepath.Join(bdir, gone)); !os.IsNotExist(err) {
			t.Errorf("%s survived: %v", gone, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(site, "pkg", "alias.py")); err != nil {
		t.Errorf("inside symlink removed: %v", err)
	}

	// A FIFO (or socket, or device) is refused: no package needs one.
	must(syscall.Mkfifo(filepath.Join(site, "pkg", "fifo"), 0o666))
	_, err = sanitize(bdir, os.Getuid(), os.Getgid(), log)
	var ie *InstallError
	if !errors.As(err, &ie) || !strings.Contains(err.Error(), `a FIFO at "pkg/fifo": refused`) {
		t.Errorf("a FIFO: %v", err)
	}
}
