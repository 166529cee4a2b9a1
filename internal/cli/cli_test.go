package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestSizeFlag(t *testing.T) {
	for in, want := range map[string]int64{"512MiB": 512 << 20, "1g": 1 << 30, "64k": 64 << 10, "100": 100, "2 GiB": 2 << 30, "10MB": 10 << 20} {
		var s size
		if err := s.Set(in); err != nil || int64(s) != want {
			t.Errorf("%q: %d %v, want %d", in, s, err, want)
		}
	}
	for _, in := range []string{"", "lots", "-1M", "1.5G", "99999999999999999G"} {
		var s size
		if err := s.Set(in); err == nil {
			t.Errorf("%q accepted as %d", in, s)
		}
	}
	s := size(512 << 20)
	if s.String() != "512MiB" {
		t.Errorf("String %q", s.String())
	}
}

func TestDurationFlag(t *testing.T) {
	for in, want := range map[string]time.Duration{"30": 30 * time.Second, "2m": 2 * time.Minute, "1.5": 1500 * time.Millisecond} {
		var d duration
		if err := d.Set(in); err != nil || time.Duration(d) != want {
			t.Errorf("%q: %v %v", in, d, err)
		}
	}
	var d duration
	if err := d.Set("soon"); err == nil {
		t.Error("junk accepted")
	}
}

func TestCheckExposure(t *testing.T) {
	for _, ok := range []string{"127.0.0.1:8080", "[::1]:80", "localhost:9", "127.5.5.5:1"} {
		if err := checkExposure(ok, false, false); err != nil {
			t.Errorf("%s refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"0.0.0.0:8080", ":8080", "[::]:80", "10.0.0.1:80", "example.com:80", "127.0.0.1"} {
		if err := checkExposure(bad, false, false); err == nil {
			t.Errorf("%s accepted without auth", bad)
		}
	}
	// With tokens, or with the explicit opt-out, any address may be used.
	for _, addr := range []string{"0.0.0.0:8080", "10.0.0.1:80"} {
		if err := checkExposure(addr, true, false); err != nil {
			t.Errorf("%s with auth: %v", addr, err)
		}
		if err := checkExposure(addr, false, true); err != nil {
			t.Errorf("%s with --insecure-no-auth: %v", addr, err)
		}
	}
	if err := checkExposure("10.0.0.1:80", false, false); err == nil || !strings.Contains(err.Error(), "--auth-token-file") {
		t.Errorf("the refusal should say how to authenticate: %v", err)
	}
}

func TestMainUsage(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Main(nil, nil, &out, &errb); code != 2 || !strings.Contains(errb.String(), "Usage") {
		t.Errorf("no args: %d %q", code, errb.String())
	}
	out.Reset()
	if code := Main([]string{"help"}, nil, &out, &errb); code != 0 || !strings.Contains(out.String(), "pysandbox serve") {
		t.Errorf("help: %d", code)
	}
	errb.Reset()
	if code := Main([]string{"run", "-h"}, nil, &out, &errb); code != 0 || !strings.Contains(errb.String(), "--max-output") && !strings.Contains(errb.String(), "-max-output") {
		t.Errorf("run -h: %d %q", code, errb.String())
	}
}
