package bench

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pysandbox/pysandbox/internal/testutil"
)

func TestParseNetOutput(t *testing.T) {
	for _, tc := range []struct {
		out  string
		want netResult
		ok   bool
	}{
		{"523456789.5 0.00123\n", netResult{523456789.5, 0.00123}, true},
		{"1e9 2e-3", netResult{1e9, 2e-3}, true},
		{"", netResult{}, false},
		{"1 2 3", netResult{}, false},
		{"fast 0.1", netResult{}, false},
		{"1 slow", netResult{}, false},
	} {
		got, err := parseNetOutput(tc.out)
		if got != tc.want || (err == nil) != tc.ok {
			t.Errorf("%q: %+v %v", tc.out, got, err)
		}
	}
}

func TestNetCodeFor(t *testing.T) {
	code := netCodeFor("http://bench.test:8080", 20)
	for _, want := range []string{`get("http://bench.test:8080/big")`, `get("http://bench.test:8080/small")`, "range(20)", "/ 20)"} {
		if !strings.Contains(code, want) {
			t.Errorf("no %s in\n%s", want, code)
		}
	}
	if strings.Contains(code, "BIG") || strings.Contains(code, "COUNT") {
		t.Errorf("a placeholder is left:\n%s", code)
	}
}

// TestServeDownload: netSize bytes at /big, with their length; "ok"
// anywhere else.
func TestServeDownload(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(serveDownload))
	defer srv.Close()
	for path, want := range map[string]int{"/big": netSize, "/small": 2} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || n != int64(want) || path == "/big" && resp.ContentLength != netSize {
			t.Errorf("%s: %d bytes (length %d), %v", path, n, resp.ContentLength, err)
		}
	}
}

func TestNetworkReport(t *testing.T) {
	var b bytes.Buffer
	writeNetwork(&b, 20, netResult{rate: 412.5e6, conn: 0.00181}, netResult{rate: 498.1e6, conn: 0.00094})
	testutil.Golden(t, filepath.Join("testdata", "network.golden"), b.Bytes(), *update)
}
