package deps

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/pysandbox/pysandbox/internal/interp"
)

// TestUnreachableIndex: an index nothing listens on is reported as an
// index that could not be reached, not as a package without a wheel.
func TestUnreachableIndex(t *testing.T) {
	t.Parallel()
	py := systemPython(t)
	// A port bound by this test and never listened on: connections are
	// refused, and no other test's server can take it meanwhile (one
	// closed at once was taken by another test's index in a parallel run).
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	port := sa.(*syscall.SockaddrInet4).Port
	// Plain HTTP: the proxy answers pip's GET with an error, and pip keeps
	// quiet about it. HTTPS: the proxy refuses the CONNECT, which pip
	// retries and reports.
	for _, scheme := range []string{"http", "https"} {
		t.Run(scheme, func(t *testing.T) {
			unreachableIndex(t, py, fmt.Sprintf("%s://127.0.0.1:%d/simple/", scheme, port), scheme == "https")
		})
	}
}

func unreachableIndex(t *testing.T, py *interp.Interpreter, url string, retried bool) {
	c := newCache(t, IndexConfig{IndexURL: url})
	_, _, err := ensure(t, c, py, []string{"pysbx-beta"}, nil)
	var ie *InstallError
	if !errors.As(err, &ie) {
		t.Fatalf("err = %v, want an InstallError", err)
	}
	msg := err.Error()
	t.Logf("error: %v\noutput:\n%s", err, ie.Output)
	if !strings.Contains(msg, "the package index could not be reached (") {
		t.Errorf("error does not say the index could not be reached: %q", msg)
	}
	if strings.Contains(msg, "only wheels are accepted") || strings.Contains(msg, "No matching distribution") {
		t.Errorf("error blames the package: %q", msg)
	}
	if n := strings.Count(msg, "\n"); n > 1 {
		t.Errorf("error has %d lines", n+1)
	}
	// The tool's words: no package prefix, and the operator's next step.
	if s := ie.Summary(); strings.HasPrefix(s, "deps:") || !strings.Contains(s, "could not be reached") {
		t.Errorf("Summary() = %q", s)
	}
	if a := ie.Advice(); !strings.Contains(a, "--index-url") || !strings.Contains(a, "--find-links") {
		t.Errorf("Advice() = %q", a)
	}
	// pip's own five retries, with a doubling back-off, kept the caller
	// waiting 8.7 s for this answer; it retries installRetries times.
	if n := strings.Count(ie.Output, "Retrying ("); n > installRetries || retried && n == 0 {
		t.Errorf("the installer retried %d times, want at most %d:\n%s", n, installRetries, ie.Output)
	}
	assertNoBuilds(t, c)
}

// TestUnreachableFromOutput: what pip and uv write when they cannot reach
// an index is recognized without connecting anywhere.
func TestUnreachableFromOutput(t *testing.T) {
	c := &Cache{cfg: Config{Index: IndexConfig{IndexURL: "https://index.example/simple/"}}}
	for text, want := range map[string]string{
		"WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object at 0x7f>: Failed to establish a new connection: [Errno 111] Connection refused')': /simple/x/\nERROR: No matching distribution found for x": "connection refused",
		"WARNING: Retrying (...) after connection broken by 'NewConnectionError(...: Failed to establish a new connection: [Errno -3] Temporary failure in name resolution')': /simple/x/\nERROR: Could not find a version that satisfies the requirement x (from versions: none)":                                                                  "name resolution failed",
		"WARNING: Retrying (...) after connection broken by 'ProxyError('Unable to connect to proxy', OSError('Tunnel connection failed: 502 cannot connect to index.example:443: connection refused'))': /simple/x/\nERROR: No matching distribution found for x":                                                                                  "the proxy could not connect",
		"WARNING: Retrying (...) after connection broken by 'ConnectTimeoutError(...)': /simple/x/\nERROR: No matching distribution found for x":                                                                                                                                                                                                    "timed out",
		"error: Failed to fetch: `https://index.example/simple/x/`\n  Caused by: Request failed after 3 retries\n  Caused by: error sending request for url (https://index.example/simple/x/)\n  Caused by: client error (Connect)\n  Caused by: dns error: failed to lookup address information: Name or service not known":                        "name resolution failed",
		"error: Failed to fetch: `https://index.example/simple/x/`\n  Caused by: tcp connect error: Connection refused (os error 111)":                                                                                                                                                                                                              "connection refused",
	} {
		if !notFound(text) {
			t.Errorf("not taken for a failed install: %q", text)
		}
		if got := c.unreachableIndex(text); got != "https://index.example/simple/: "+want {
			t.Errorf("%q: got %q, want %q", text, got, want)
		}
	}
}

// TestUnreachableHidesCredentials: the index named in a message an agent
// reads carries no user name or password of the operator's.
func TestUnreachableHidesCredentials(t *testing.T) {
	for _, raw := range []string{"https://user:S3CRETTOKEN@index.example/simple/", "https://S3CRETTOKEN@index.example/simple/"} {
		c := &Cache{cfg: Config{Index: IndexConfig{IndexURL: raw}}}
		got := c.unreachableIndex("ERROR: Could not find a version (Connection refused)")
		if strings.Contains(got, "S3CRET") || got != "https://index.example/simple/: connection refused" {
			t.Errorf("%s: %q", raw, got)
		}
		e := &InstallError{Unreachable: got}
		if strings.Contains(e.Summary()+e.Advice(), "S3CRET") {
			t.Errorf("%q", e.Summary())
		}
	}
	if got := withoutCredentials("http://[::1"); got != "the configured index" {
		t.Errorf("unparsable: %q", got)
	}
}
