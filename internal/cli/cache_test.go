package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestCacheLsAndPrune: cache ls shows, and prune frees, what the
// environments take on disk, including one written before disk accounting
// whose meta.json holds its apparent size.
func TestCacheLsAndPrune(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	env := func(key, meta string, data int) {
		site := filepath.Join(dir, "envs", key, "site")
		if err := os.MkdirAll(site, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(site, "blob"), make([]byte, data), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "envs", key, "meta.json"), []byte(meta), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	env("0123456789abcdef0123456789abcdef", `{"python":"3.11.2","requirements":["a"],"size_bytes":3250585,"accounting":"disk/1"}`, 3<<20)
	env("fedcba9876543210fedcba9876543210", `{"python":"3.11.2","requirements":["b"],"size_bytes":10}`, 2<<20)
	var out, errb bytes.Buffer
	if err := cacheCmd([]string{"ls", "--cache-dir", dir, "--cache-size", "64MiB"}, &out, &errb); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	t.Logf("\n%s", out.String())
	for _, want := range []string{
		`(?m)^0123456789abcdef0123456789abcdef 3\.11\.2 +3\.1M  .* a$`,
		// 2 MiB of blocks, and the inodes: measured, not the 10 bytes
		// its meta.json says.
		`(?m)^fedcba9876543210fedcba9876543210 3\.11\.2 +2\.0M  .* b$`,
		`(?m)^2 environments, 5\.1 MiB on disk \(cap 64\.0 MiB\) in ` + regexp.QuoteMeta(dir) + `$`,
		`(?m)^KEY +PYTHON +DISK +LAST USED +REQUIREMENTS$`,
	} {
		if !regexp.MustCompile(want).MatchString(out.String()) {
			t.Errorf("output lacks %s", want)
		}
	}
	out.Reset()
	if err := cacheCmd([]string{"prune", "--all", "--cache-dir", dir}, &out, &errb); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	if got := strings.TrimSpace(out.String()); got != "removed 2 environments (5.1 MiB on disk)" {
		t.Errorf("prune: %q", got)
	}
}
