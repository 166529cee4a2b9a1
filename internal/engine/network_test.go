package engine

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/egress"
	"github.com/pysandbox/pysandbox/internal/testutil/webhost"
)

func newNetFixture(t *testing.T) *webhost.Host {
	return webhost.New(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "a,b\n1,2\n3,4\n")
	}))
}

func TestNetworkThroughProxy(t *testing.T) {
	f := newNetFixture(t)
	e := newEngine(t, func(c *Config) { c.Network = true })
	url := "http://" + f.PlainName + "/data.csv"
	code := `
import os, socket, urllib.request, errno
out = {}
out["body"] = urllib.request.urlopen(` + strconv.Quote(url) + `, timeout=10).read().decode()
out["proxy"] = os.environ.get("HTTPS_PROXY")
# Around the proxy there is no route: the host's loopback is not ours.
s = socket.socket()
s.settimeout(5)
try:
    s.connect(("127.0.0.1", ` + strconv.Itoa(webhost.Port(f.HTTP)) + `))
    out["direct"] = "connected"
except OSError as e:
    out["direct"] = errno.errorcode.get(e.errno, str(e))
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    u.sendto(b"x", ("8.8.8.8", 53))
    out["udp"] = "sent"
except OSError as e:
    out["udp"] = errno.errorcode.get(e.errno, str(e))
# The port is the server's: nothing here can listen on it instead.
b = socket.socket()
b.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    b.bind(("127.0.0.1", 3128))
    out["bind"] = "bound"
except OSError as e:
    out["bind"] = errno.errorcode.get(e.errno, str(e))
out["fds"] = sorted(int(x) for x in os.listdir("/proc/self/fd"))
out
`
	r, err := e.Run(context.Background(), RunRequest{Code: code, Network: f.Attach(egress.Info{CallID: "run-1"})})
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != StatusSuccess {
		t.Fatalf("%s: %s %s", r.Status, r.Stderr, r.Message)
	}
	got := r.ReturnValue.(map[string]any)
	if got["body"] != "a,b\n1,2\n3,4\n" || got["proxy"] != "http://127.0.0.1:3128" {
		t.Errorf("through the proxy: %v", got)
	}
	if got["direct"] != "ECONNREFUSED" {
		t.Errorf("a direct connection to the host's loopback: %v", got["direct"])
	}
	if got["udp"] != "ENETUNREACH" {
		t.Errorf("UDP to the outside: %v", got["udp"])
	}
	if got["bind"] != "EADDRINUSE" {
		t.Errorf("binding the proxy port: %v", got["bind"])
	}
	recs := f.Records()
	if len(recs) != 1 || recs[0].Decision != egress.Allowed || recs[0].CallID != "run-1" || recs[0].BytesIn == 0 {
		t.Errorf("records %+v", recs)
	}

	// A run without a grant has no network, even on a server with one.
	r, err = e.Run(context.Background(), RunRequest{Code: `
import urllib.request
try:
    urllib.request.urlopen(` + strconv.Quote(url) + `, timeout=10)
    res = "fetched"
except OSError as e:
    res = type(e).__name__ + ": " + str(e)
res
`})
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := r.ReturnValue.(string); !strings.Contains(s, "Connection refused") {
		t.Errorf("no grant: %v (%s)", r.ReturnValue, r.Stderr)
	}
}

func TestNoNetworkByDefault(t *testing.T) {
	e := newEngine(t, nil)
	r, err := e.Run(context.Background(), RunRequest{Code: `
import os, socket
s = socket.socket()
s.settimeout(5)
try:
    s.connect(("127.0.0.1", 3128))
    res = "connected"
except OSError as e:
    res = e.errno
[res, sorted(k for k in os.environ if "proxy" in k.lower())]
`})
	if err != nil {
		t.Fatal(err)
	}
	got := r.ReturnValue.([]any)
	if fmt.Sprint(got[0]) != "111" || len(got[1].([]any)) != 0 {
		t.Errorf("a server without network: %v", got)
	}
}

// TestNoRunUsesAnothersProxy: while one run holds a grant, a concurrent
// run without one finds its own 127.0.0.1:3128 closed: each run's proxy
// socket lives in that run's network namespace.
func TestNoRunUsesAnothersProxy(t *testing.T) {
	f := newNetFixture(t)
	e := newEngine(t, func(c *Config) { c.Network = true })
	url := "http://" + f.PlainName + "/x"
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r, err := e.Run(context.Background(), RunRequest{Network: f.Attach(egress.Info{CallID: "holder"}), Code: `
import time, urllib.request
urllib.request.urlopen(` + strconv.Quote(url) + `, timeout=20).read()
open("/tmp/go", "w")
time.sleep(2)
urllib.request.urlopen(` + strconv.Quote(url) + `, timeout=20).read().decode()
`})
		if err != nil || r.Status != StatusSuccess {
			t.Errorf("the run with a grant: %v %+v", err, r)
		}
	}()
	// Wait until the first run is using its proxy.
	deadline := time.Now().Add(30 * time.Second)
	for len(f.Records()) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	r, err := e.Run(context.Background(), RunRequest{Code: `
import socket, urllib.request
try:
    urllib.request.urlopen(` + strconv.Quote(url) + `, timeout=10)
    a = "fetched"
except OSError as e:
    a = str(e)
s = socket.socket()
try:
    s.connect(("127.0.0.1", 3128))
    b = "connected"
except OSError as e:
    b = e.errno
[a, b]
`})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := r.ReturnValue.([]any)
	if len(got) != 2 || !strings.Contains(fmt.Sprint(got[0]), "Connection refused") || fmt.Sprint(got[1]) != "111" {
		t.Errorf("a run without a grant next to one with: %v (%s)", r.ReturnValue, r.Stderr)
	}
	wg.Wait()
	for _, rec := range f.Records() {
		if rec.CallID != "holder" {
			t.Errorf("a connection recorded for another run: %+v", rec)
		}
	}
}
