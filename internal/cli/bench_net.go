package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strconv"
	"strings"

	"github.com/pysandbox/pysandbox/internal/egress"
	"github.com/pysandbox/pysandbox/internal/engine"
)

// benchNetSize is the download the throughput is measured on; three of
// them stay under a run's default 256 MiB bytes_in limit.
const benchNetSize = 48 << 20

// benchNetCode downloads BIG three times and fetches SMALL N times, each
// over a new connection (urllib closes it), and prints the best
// throughput in bytes/s and the mean time of a small fetch in seconds.
const benchNetCode = `
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

// benchNetwork compares, in one run, the same Python client downloading
// from a host web server directly (a process on the host) and through the
// proxy from inside a sandbox: throughput, and the time a new connection
// with a small request takes.
func benchNetwork(ctx context.Context, o *options, log *slog.Logger, baselinePy string, n int, out io.Writer) error {
	chunk := make([]byte, 1<<20)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/big" {
			io.WriteString(w, "ok")
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(benchNetSize))
		for sent := 0; sent < benchNetSize; sent += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
	name := "bench.test:" + port
	lo := *o
	lo.allowNet = []string{name + "=127.0.0.1"}
	lo.netRules = nil
	lo.poolSize, lo.preload, lo.learnPreload = 0, "", 0
	lo.trace, lo.onPool = nil, nil
	eng, release, err := lo.engine(ctx, log)
	if err != nil {
		return err
	}
	defer release()
	if !eng.Config().Network {
		fmt.Fprintf(out, "\n(network: the %s backend has no network proxy; skipped)\n", o.sandbox)
		return nil
	}
	count := max(n, 20)
	code := func(base string) string {
		return strings.NewReplacer("BIG", base+"/big", "SMALL", base+"/small", "COUNT", strconv.Itoa(count)).Replace(benchNetCode)
	}
	parse := func(s string) (float64, float64, error) {
		f := strings.Fields(s)
		if len(f) != 2 {
			return 0, 0, fmt.Errorf("bench: unexpected output %q", s)
		}
		a, err1 := strconv.ParseFloat(f[0], 64)
		b, err2 := strconv.ParseFloat(f[1], 64)
		if err1 != nil || err2 != nil {
			return 0, 0, fmt.Errorf("bench: unexpected output %q", s)
		}
		return a, b, nil
	}
	// Direct: a process on the host, with no proxy in its environment.
	cmd := exec.CommandContext(ctx, baselinePy, "-I", "-c", code(srv.URL))
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8"}
	direct, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("bench: direct download: %w", err)
	}
	dRate, dConn, err := parse(string(direct))
	if err != nil {
		return err
	}
	res, err := eng.Run(ctx, engine.RunRequest{Code: code("http://" + name), Timeout: eng.Config().MaxTimeout, Network: func(l net.Listener) func() {
		g := lo.proxy.NewGrant(egress.GrantConfig{Info: egress.Info{Identity: "bench", Tool: "bench"}})
		g.Serve(l)
		return g.Close
	}})
	if err != nil {
		return err
	}
	if res.Status != engine.StatusSuccess {
		return fmt.Errorf("bench: download through the proxy: %s: %s", res.Status, res.Stderr)
	}
	pRate, pConn, err := parse(res.Stdout)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\nnetwork, the same urllib client (best of 3 downloads of %d MiB; %d new connections with a small GET):\n", benchNetSize>>20, count)
	fmt.Fprintf(out, "  download: through the proxy from a sandbox %.0f MB/s, directly on the host %.0f MB/s: %.2fx of direct (goal >= 0.8x)\n",
		pRate/1e6, dRate/1e6, pRate/dRate)
	fmt.Fprintf(out, "  a new connection + small GET: through the proxy %.2fms, direct %.2fms: %.2fms added per connection (goal < 2ms)\n",
		pConn*1e3, dConn*1e3, (pConn-dConn)*1e3)
	return nil
}
