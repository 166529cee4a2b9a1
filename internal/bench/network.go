package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strconv"
	"strings"

	"github.com/pysandbox/pysandbox/internal/egress"
	"github.com/pysandbox/pysandbox/internal/engine"
)

// netSize is the download the throughput is measured on; three of them
// stay under a run's default 256 MiB bytes_in limit.
const netSize = 48 << 20

// netCode downloads BIG three times and fetches SMALL N times, each over
// a new connection (urllib closes it), and prints the best throughput in
// bytes/s and the mean time of a small fetch in seconds.
const netCode = `
import time, urllib.request
def get(u):
    n = 0
    with urllib.request.urlopen(u, timeout=120) as r:
        while True:
            b = r.read(1 << 20)
            if not b:
                break
            n += len(b)
    return n
best = 0
for _ in range(3):
    t = time.perf_counter()
    n = get("BIG")
    best = max(best, n / (time.perf_counter() - t))
get("SMALL")
t = time.perf_counter()
for _ in range(COUNT):
    get("SMALL")
print(best, (time.perf_counter() - t) / COUNT)
`

// netResult is one client's figures: its best download rate in bytes/s
// and the mean time of a new connection with a small GET, in seconds.
type netResult struct{ rate, conn float64 }

// parseNetOutput reads what netCode prints.
func parseNetOutput(s string) (netResult, error) {
	f := strings.Fields(s)
	if len(f) != 2 {
		return netResult{}, fmt.Errorf("bench: unexpected output %q", s)
	}
	a, err1 := strconv.ParseFloat(f[0], 64)
	b, err2 := strconv.ParseFloat(f[1], 64)
	if err1 != nil || err2 != nil {
		return netResult{}, fmt.Errorf("bench: unexpected output %q", s)
	}
	return netResult{a, b}, nil
}

// writeNetwork compares the proxied client with the direct one; count is
// the small GETs each made.
func writeNetwork(w io.Writer, count int, proxied, direct netResult) {
	fmt.Fprintf(w, "\nnetwork, the same urllib client (best of 3 downloads of %d MiB; %d new connections with a small GET):\n", netSize>>20, count)
	x, added := proxied.rate/direct.rate, (proxied.conn-direct.conn)*1e3
	fmt.Fprintf(w, "  download: through the proxy from a sandbox %.0f MB/s, directly on the host %.0f MB/s: %.2fx of direct%s\n",
		proxied.rate/1e6, direct.rate/1e6, x, goalNote(">= 0.8x", x, 0))
	fmt.Fprintf(w, "  a new connection + small GET: through the proxy %.2fms, direct %.2fms: %.2fms added per connection%s\n",
		proxied.conn*1e3, direct.conn*1e3, added, goalNote("<= 0.5ms", 0, added))
}

// netCodeFor is netCode against base, with count small GETs.
func netCodeFor(base string, count int) string {
	return strings.NewReplacer("BIG", base+"/big", "SMALL", base+"/small", "COUNT", strconv.Itoa(count)).Replace(netCode)
}

// network compares, in one run, the same Python client downloading from
// a host web server directly (a process on the host) and through the
// proxy from inside a sandbox: throughput, and the time a new connection
// with a small request takes.
func network(ctx context.Context, cfg Config) error {
	srv := httptest.NewServer(http.HandlerFunc(serveDownload))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
	name := "bench.test:" + port
	eng, err := cfg.Engine(ctx, Variant{AllowNet: []string{name + "=127.0.0.1"}})
	if err != nil {
		return err
	}
	defer eng.Release()
	if !eng.Config().Network {
		fmt.Fprintf(cfg.Out, "\n(network: the %s backend has no network proxy; skipped)\n", cfg.Sandbox)
		return nil
	}
	count := max(cfg.N, 20)
	// Direct: a process on the host, with no proxy in its environment.
	cmd := exec.CommandContext(ctx, cfg.Baseline, "-I", "-c", netCodeFor(srv.URL, count))
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8"}
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("bench: direct download: %w", err)
	}
	direct, err := parseNetOutput(string(out))
	if err != nil {
		return err
	}
	res, err := eng.Run(ctx, engine.RunRequest{Code: netCodeFor("http://"+name, count), Timeout: eng.Config().MaxTimeout, Network: func(l net.Listener) func() {
		g := eng.Proxy.NewGrant(egress.GrantConfig{Info: egress.Info{Identity: "bench", Tool: "bench"}})
		g.Serve(l)
		return g.Close
	}})
	if err != nil {
		return err
	}
	if res.Status != engine.StatusSuccess {
		return fmt.Errorf("bench: download through the proxy: %s: %s", res.Status, res.Stderr)
	}
	proxied, err := parseNetOutput(res.Stdout)
	if err != nil {
		return err
	}
	writeNetwork(cfg.Out, count, proxied, direct)
	return nil
}

// serveDownload serves netSize bytes at /big and "ok" anywhere else.
func serveDownload(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/big" {
		io.WriteString(w, "ok")
		return
	}
	chunk := make([]byte, 1<<20)
	w.Header().Set("Content-Length", strconv.Itoa(netSize))
	for sent := 0; sent < netSize; sent += len(chunk) {
		if _, err := w.Write(chunk); err != nil {
			return
		}
	}
}
