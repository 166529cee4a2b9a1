package deps

import (
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/sandbox"
)

// newTestCache is a cache that installs nothing, for the bookkeeping.
func newTestCache(t *testing.T, maxBytes int64) *Cache {
	t.Helper()
	c, err := New(Config{
		Dir:      filepath.Join(t.TempDir(), "cache"),
		MaxBytes: maxBytes,
		Backend:  sandbox.NewNative(),
		Logger:   slog.New(slog.NewTextHandler(&testLog{t: t, ok: true}, nil)),
	})
	must(t, err)
	return c
}

// fakeEnv publishes an env charged size bytes, last used at used.
func fakeEnv(t *testing.T, c *Cache, key string, size int64, used time.Time) {
	t.Helper()
	dir := c.envDir(key)
	must(t, os.MkdirAll(filepath.Join(dir, "site"), 0o755))
	data, err := json.Marshal(Env{Key: key, SizeBytes: size, Accounting: diskAccounting, Requirements: []string{key}})
	must(t, err)
	must(t, os.WriteFile(filepath.Join(dir, metaName), data, 0o644))
	must(t, os.Chtimes(filepath.Join(dir, metaName), used, used))
}

func keys(t *testing.T, c *Cache) string {
	t.Helper()
	list, err := c.List()
	must(t, err)
	var ks []string
	for _, e := range list {
		ks = append(ks, e.Key)
	}
	slices.Sort(ks)
	return strings.Join(ks, " ")
}

// TestReserveEvictsOrRefuses: a reservation evicts the least recently used
// envs no one uses to make room, and when even that is not enough it
// evicts nothing and says why.
func TestReserveEvictsOrRefuses(t *testing.T) {
	t.Parallel()
	const mb = 1 << 20
	c := newTestCache(t, 10*mb)
	now := time.Now()
	fakeEnv(t, c, "old", 3*mb, now.Add(-3*time.Hour))
	fakeEnv(t, c, "mid", 3*mb, now.Add(-2*time.Hour))
	fakeEnv(t, c, "new", 3*mb, now.Add(-time.Hour))

	r1 := c.newReservation()
	must(t, r1.ensure(4*mb))
	if got := keys(t, c); got != "mid new" {
		t.Errorf("after reserving 4 MiB: envs %q, want the oldest gone", got)
	}
	// mid in use; only new could go, and it is not enough.
	_, release, err := c.acquire("mid")
	must(t, err)
	r2 := c.newReservation()
	err = r2.ensure(4 * mb)
	var ie *InstallError
	if !errors.As(err, &ie) || !strings.Contains(err.Error(), "the dependency cache is full: this install needs 4.0 MiB on disk, and of the cache's 10.0 MiB (--cache-size) environments in use hold 3.0 MiB and other installs in progress have reserved 4.0 MiB") {
		t.Errorf("err = %v", err)
	}
	if got := keys(t, c); got != "mid new" {
		t.Errorf("a refused reservation evicted: envs %q", got)
	}
	// The first install is done with less than it reserved.
	must(t, r1.settle(2*mb))
	must(t, r2.ensure(4*mb))
	if got := keys(t, c); got != "mid" || c.reserved != 6*mb {
		t.Errorf("envs %q, reserved %d", got, c.reserved)
	}
	release()
	r1.release()
	r1.release()
	r2.release()
	if c.reserved != 0 || c.trashing != 0 {
		t.Errorf("reserved %d, trashing %d after releasing all", c.reserved, c.trashing)
	}
	if err := c.newReservation().ensure(11 * mb); err == nil || !strings.Contains(err.Error(), "more than the whole cache may hold (10.0 MiB)") {
		t.Errorf("over the cap: %v", err)
	}
}

// TestConcurrentReservations: however many installs reserve at once, what
// they hold together stays within the cap.
func TestConcurrentReservations(t *testing.T) {
	t.Parallel()
	const mb = 1 << 20
	c := newTestCache(t, 10*mb)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var held []*reservation
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := c.newReservation()
			for range 3 {
				if r.charge(mb) != nil {
					r.release()
					return
				}
			}
			mu.Lock()
			held = append(held, r)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if len(held) != 3 || c.reserved != 9*mb {
		t.Errorf("%d reservations hold %d bytes (cap 10 MiB)", len(held), c.reserved)
	}
	for _, r := range held {
		r.release()
	}
	if c.reserved != 0 {
		t.Errorf("reserved %d after release", c.reserved)
	}
}

// TestOlderEnvMeasured: an env written before disk accounting, whose
// meta.json has its apparent size, is listed (and pruned) at what it
// takes on disk.
func TestOlderEnvMeasured(t *testing.T) {
	t.Parallel()
	c := newTestCache(t, 1<<30)
	dir := c.envDir("older")
	must(t, os.MkdirAll(filepath.Join(dir, "site", "pkg"), 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "site", "pkg", "x"), make([]byte, 100<<10), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, metaName), []byte(`{"key":"older","size_bytes":10}`), 0o644))
	list, err := c.List()
	must(t, err)
	want, _ := diskUsage(dir)
	if len(list) != 1 || list[0].SizeBytes != want || want < 100<<10+4*InodeCost {
		t.Errorf("listed %+v, want %d bytes", list, want)
	}
	evicted, err := c.Prune(0)
	if err != nil || len(evicted) != 1 || evicted[0].SizeBytes != want {
		t.Errorf("Prune: %+v %v", evicted, err)
	}
	if len(c.measured) != 0 {
		t.Errorf("measured %v after eviction", c.measured)
	}
}
