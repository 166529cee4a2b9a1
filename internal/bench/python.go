package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/pydist"
	"github.com/pysandbox/pysandbox/internal/pydist/hostbuild"
)

// PythonSource is a measurement's source of managed interpreters, in
// place of the command line's: uv-format metadata, a mirror, a cache.
type PythonSource struct {
	Metadata, Mirror, CacheDir string
}

// managedPython measures a managed interpreter, downloaded from a mirror
// on loopback: its first run (download, digest, unpack, check, zygote,
// run) against fetching and unpacking the same archive with curl | tar
// and running it once; then its warm trivial run, and the system
// interpreter's in the same engine, each as a ratio to python3 -c pass.
// The archive is built from the system's python3 (hostbuild), and the
// engine gives managed builds to runs that name a version (only-managed),
// so the version the host has is downloaded all the same.
func managedPython(ctx context.Context, cfg Config) error {
	work, err := os.MkdirTemp("", "pysandbox-bench-python-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	a, err := hostbuild.System(work)
	if err != nil {
		return fmt.Errorf("bench --python needs a relocatable system python3 to build an archive from: %w", err)
	}
	mirror := hostbuild.NewMirror()
	defer mirror.Close()
	path := "/pbs/bench/" + a.Name()
	mirror.Put(path, a.Path)
	meta := filepath.Join(work, "download-metadata.json")
	if err := os.WriteFile(meta, hostbuild.Metadata(hostbuild.EntryOf(a, pydist.DefaultPrefix+"/bench/"+a.Name())), 0o644); err != nil {
		return err
	}
	// The cache's own directory: below /tmp a sandbox could not mount it.
	if err := os.MkdirAll(cfg.CacheDir, 0o700); err != nil {
		return err
	}
	base, err := measure(cfg.N, func() error { return exec.Command(cfg.Baseline, "-c", "pass").Run() })
	if err != nil {
		return fmt.Errorf("baseline %s -c pass: %w", cfg.Baseline, err)
	}
	rounds := max(cfg.N/10, 3)
	req := engine.RunRequest{Code: "pass", PythonVersion: a.MajorMinor()}
	var first, curlTar, curlTarRun []time.Duration
	var warmManaged, warmSystem []time.Duration
	curl, _ := exec.LookPath("curl")
	for i := range rounds {
		cache, err := os.MkdirTemp(cfg.CacheDir, "bench-python-")
		if err != nil {
			return err
		}
		eng, err := cfg.Engine(ctx, Variant{PoolSize: cfg.Defaults.PoolSize, Python: &PythonSource{Metadata: meta, Mirror: mirror.URL + "/pbs", CacheDir: cache}})
		if err != nil {
			os.RemoveAll(cache)
			return err
		}
		waitPoolFull(eng.Pool, 10*time.Second)
		start := time.Now()
		err = runOK(ctx, eng.Engine, req)
		d := time.Since(start)
		if err == nil {
			first = append(first, d)
			if i == rounds-1 {
				// The last engine's warm runs, managed and default in
				// turn (so that drift in the machine's speed falls on
				// both), each after a pause in which the pool refills, as
				// an agent's thinking gives it.
				warmManaged, warmSystem, err = alternate(cfg.N, func() {
					waitPoolFull(eng.Pool, 10*time.Second)
					time.Sleep(max(20*time.Millisecond, pct(base, 50)))
				}, func() error { return runOK(ctx, eng.Engine, req) }, func() error { return runOK(ctx, eng.Engine, engine.RunRequest{Code: "pass"}) })
			}
		}
		eng.Release()
		os.RemoveAll(cache)
		if err != nil {
			return fmt.Errorf("a run on the downloaded Python: %w", err)
		}
		if curl != "" {
			c, r, err := curlTarOnce(curl, mirror.URL+path, cfg.CacheDir, a)
			if err != nil {
				return err
			}
			curlTar, curlTarRun = append(curlTar, c), append(curlTarRun, c+r)
		}
	}
	for _, l := range [][]time.Duration{first, curlTar, curlTarRun} {
		slices.Sort(l)
	}
	writeManaged(cfg.Out, a, base, first, curlTar, curlTarRun, warmManaged, warmSystem, cfg.Baseline)
	return nil
}

// curlTarOnce fetches and unpacks the archive with curl | tar into a
// directory of dir, then runs its interpreter once (-c pass), and
// returns the two times.
func curlTarOnce(curl, url, dir string, a *hostbuild.Archive) (fetch, run time.Duration, err error) {
	dst, err := os.MkdirTemp(dir, "bench-curl-")
	if err != nil {
		return 0, 0, err
	}
	defer os.RemoveAll(dst)
	start := time.Now()
	cmd := exec.Command("sh", "-c", `"$0" -sSf "$1" | tar -xzf - -C "$2"`, curl, url, dst)
	if out, err := cmd.CombinedOutput(); err != nil {
		return 0, 0, fmt.Errorf("curl | tar: %v: %s", err, out)
	}
	fetch = time.Since(start)
	start = time.Now()
	if out, err := exec.Command(filepath.Join(dst, "python", "bin", "python"+a.MajorMinor()), "-c", "pass").CombinedOutput(); err != nil {
		return 0, 0, fmt.Errorf("the unpacked interpreter: %v: %s", err, out)
	}
	return fetch, time.Since(start), nil
}

func writeManaged(w io.Writer, a *hostbuild.Archive, base, first, curlTar, curlTarRun, warmManaged, warmSystem []time.Duration, baseline string) {
	fmt.Fprintf(w, "managed Python %s: a %.1f MB install_only archive of this machine's python3, from a mirror on loopback\n", a.Version(), float64(a.Size)/1e6)
	fmt.Fprintf(w, "this machine now: %s -c pass takes %s (p50), %s (p99)\n\n", baseline, ms(pct(base, 50)), ms(pct(base, 99)))
	t := table{w}
	t.header()
	if len(curlTar) > 0 {
		t.row("curl | tar of the archive", curlTar, curlTar, "", "")
		t.row("curl | tar, then its python -c pass", curlTarRun, curlTarRun, "", "")
		t.row("first run on it (download, SHA-256, unpack, check, run)", first, curlTarRun, "of curl | tar + run", "")
	} else {
		t.row("first run on it (download, SHA-256, unpack, check, run)", first, base, ofSpawn, "")
		fmt.Fprintln(w, "(no curl on this machine: the curl | tar comparison was left out)")
	}
	rm := ratio(pct(warmManaged, 50), pct(base, 50))
	rs := ratio(pct(warmSystem, 50), pct(base, 50))
	t.row("warm trivial run, managed Python", warmManaged, base, ofSpawn, "")
	t.row("warm trivial run, system Python (same engine)", warmSystem, base, ofSpawn, "")
	t.ratioRow("managed against system, warm", rm/rs, "of the system Python's ratio", "<= 1.10x")
}

// alternate times a and b n times each, in turn, after a warm-up of
// each, with pause (untimed) before every call; both sorted.
func alternate(n int, pause func(), a, b func() error) (da, db []time.Duration, err error) {
	if err := a(); err != nil {
		return nil, nil, err
	}
	if err := b(); err != nil {
		return nil, nil, err
	}
	for range n {
		for _, f := range []struct {
			run func() error
			out *[]time.Duration
		}{{a, &da}, {b, &db}} {
			pause()
			t := time.Now()
			if err := f.run(); err != nil {
				return nil, nil, err
			}
			*f.out = append(*f.out, time.Since(t))
		}
	}
	slices.Sort(da)
	slices.Sort(db)
	return da, db, nil
}
