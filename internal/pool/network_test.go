package pool

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/pysandbox/pysandbox/internal/egress"
	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/testutil/pypi"
	"github.com/pysandbox/pysandbox/internal/testutil/webhost"
)

// TestRealClientsThroughProxy runs the HTTP clients people use, unchanged,
// in pooled runs: urllib, requests over HTTPS, pandas.read_csv(url) and
// pip download, each reaching a host server only through the proxy.
func TestRealClientsThroughProxy(t *testing.T) {
	ix := pypi.NewIndex(t, pypi.Package{Name: "pysbx-net", Version: "1.0"})
	mux := http.NewServeMux()
	mux.HandleFunc("/data.csv", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "a,b\n1,2\n3,4\n") })
	mux.Handle("/simple/", ix.Handler())
	mux.Handle("/files/", ix.Handler())
	h := webhost.New(t, mux)
	e, _ := newPooledEngine(t, 2, []string{"pandas"}, func(c *engine.Config) { c.Network = true })
	code := `
import json, os, subprocess, sys, urllib.request
out = {}
out["urllib"] = urllib.request.urlopen("http://PLAIN/data.csv", timeout=20).read().decode()
open("/tmp/ca.pem", "w").write(CA)
try:
    import requests
    out["requests"] = requests.get("https://TLS/data.csv", verify="/tmp/ca.pem", timeout=20).text
except ImportError:
    out["requests"] = "no requests"
import pandas as pd
out["pandas"] = int(pd.read_csv("http://PLAIN/data.csv")["b"].sum())
p = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "--disable-pip-version-check",
                    "-d", "/tmp/dl", "--index-url", "http://PLAIN/simple/", "--trusted-host", "PLAIN", "pysbx-net"], capture_output=True, text=True)
out["pip"] = sorted(os.listdir("/tmp/dl")) if p.returncode == 0 else p.stderr[-2000:]
out
`
	code = strings.NewReplacer("PLAIN", h.PlainName, "TLS", h.TLSName, "CA", "'''"+h.CAPEM+"'''").Replace(code)
	r, err := e.Run(context.Background(), engine.RunRequest{Code: code, Timeout: 120e9, Network: h.Attach(egress.Info{CallID: "c"})})
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != engine.StatusSuccess {
		t.Fatalf("%s: %s %s", r.Status, r.Stderr, r.Message)
	}
	got := r.ReturnValue.(map[string]any)
	csv := "a,b\n1,2\n3,4\n"
	if got["urllib"] != csv || fmt.Sprint(got["pandas"]) != "6" {
		t.Errorf("urllib, pandas: %v", got)
	}
	if got["requests"] != csv && got["requests"] != "no requests" {
		t.Errorf("requests over HTTPS: %v", got["requests"])
	}
	if got["requests"] == "no requests" {
		t.Log("python3-requests is not installed: requests not tried")
	}
	if files, ok := got["pip"].([]any); !ok || len(files) != 1 || !strings.HasPrefix(files[0].(string), "pysbx_net-1.0") {
		t.Errorf("pip download: %v", got["pip"])
	}
	methods := map[string]int{}
	for _, rec := range h.Records() {
		if rec.Decision != egress.Allowed {
			t.Errorf("record %+v", rec)
		}
		methods[rec.Method]++
	}
	if methods["CONNECT"] != 1 || methods["GET"] < 4 {
		t.Errorf("records by method: %v", methods)
	}
}
