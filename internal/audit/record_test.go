package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/pysandbox/pysandbox/internal/testutil"
)

var update = flag.Bool("update", false, "update golden files")

// TestLineFormatGolden pins the bytes on disk: other tools verify logs
// written by this package, so any change to the format must be deliberate.
func TestLineFormatGolden(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	w, err := Open(path, Options{Now: clock()})
	if err != nil {
		t.Fatal(err)
	}
	deny := call(1)
	deny.Decision, deny.Reason, deny.Status, deny.ExitCode, deny.DurationMS, deny.PeakMemoryBytes, deny.CPUTimeMS = "deny", "tool not allowed for this token", "", nil, 0, 0, 0
	for _, r := range []*Record{
		{Event: EventStart, Detail: map[string]string{"version": "0.1.0", "policy_sha256": strings.Repeat("ab", 32)}},
		call(0),
		deny,
	} {
		if err := w.Append(r); err != nil {
			t.Fatal(err)
		}
	}
	w.Close()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "chain.log")
	testutil.Golden(t, golden, got, *update)
	if *update {
		return
	}
	verifyOK(t, golden)
}

func TestLineHashesBodyBytes(t *testing.T) {
	// The hash covers the object without the hash member, byte for byte,
	// so anyone can check a line with sha256sum and sed.
	r := call(0)
	r.Seq = 1
	line, hash, err := encodeLine(r)
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.LastIndex(line, []byte(hashSep))
	body := append(bytes.Clone(line[:i]), '}')
	sum := sha256.Sum256(body)
	if hex.EncodeToString(sum[:]) != hash || string(line[i:]) != hashSep+hash+"\"}\n" {
		t.Errorf("line %s: hash %s is not of its body", line, hash)
	}
	var m map[string]any
	if err := json.Unmarshal(line, &m); err != nil || m["hash"] != hash {
		t.Errorf("line is not JSON with the hash member: %v", err)
	}
	if _, h, err := parseLine(line[:len(line)-1]); err != nil || h != hash {
		t.Errorf("parseLine: %q %v", h, err)
	}
}

func TestCapError(t *testing.T) {
	if s := capError("short"); s != "short" {
		t.Errorf("short error changed to %q", s)
	}
	for _, s := range []string{strings.Repeat("x", 5000), strings.Repeat("€", 2000), strings.Repeat("x", 4095) + "€€"} {
		c := capError(s)
		if len(c) > MaxErrorBytes || !utf8.ValidString(c) || !strings.HasSuffix(c, " [truncated]") {
			t.Errorf("capError(%d bytes) = %d bytes, valid %v", len(s), len(c), utf8.ValidString(c))
		}
	}
}
