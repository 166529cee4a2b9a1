package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestRelease builds a release the way scripts/release.sh does (one
// target, to keep the suite quick): a static binary that says its
// version, commit and build date, its checksum, and its SBOM.
func TestRelease(t *testing.T) {
	dist := t.TempDir()
	cmd := exec.Command("bash", "../../scripts/release.sh", "v9.9.9-test")
	cmd.Env = append(os.Environ(), "DIST="+dist, "RELEASE_TARGETS=linux/amd64")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("release.sh: %v\n%s", err, out)
	}
	bin := filepath.Join(dist, "pysandbox-v9.9.9-test-linux-amd64")
	out, err := exec.Command(bin, "version").Output()
	if err != nil || !strings.Contains(string(out), "pysandbox v9.9.9-test") || strings.Contains(string(out), "commit: unknown") || strings.Contains(string(out), "built: unknown") {
		t.Errorf("version: %v %s", err, out)
	}
	if out, err := exec.Command("file", bin).Output(); err == nil && !strings.Contains(string(out), "statically linked") {
		t.Errorf("not static: %s", out)
	}
	check := exec.Command("sha256sum", "-c", "SHA256SUMS")
	check.Dir = dist
	if out, err := check.CombinedOutput(); err != nil {
		t.Errorf("checksums: %v %s", err, out)
	}
	data, err := os.ReadFile(bin + ".cdx.json")
	var sbom struct {
		BOMFormat string `json:"bomFormat"`
		Metadata  struct {
			Component struct{ Version, Purl string }
		}
		Components []struct{ Name string }
	}
	if err != nil || json.Unmarshal(data, &sbom) != nil || sbom.BOMFormat != "CycloneDX" || len(sbom.Components) < 5 {
		t.Errorf("SBOM: %v %.300s", err, data)
	}
	// The version released, not a pseudo-version from git.
	if c := sbom.Metadata.Component; c.Version != "v9.9.9-test" || !strings.Contains(c.Purl, "@v9.9.9-test") {
		t.Errorf("SBOM: the main component is %q (%s), want v9.9.9-test", c.Version, c.Purl)
	}
	names := ""
	for _, c := range sbom.Components {
		names += c.Name + " "
	}
	if !strings.Contains(names, "go-sdk") {
		t.Errorf("the SBOM does not list the MCP SDK: %s", names)
	}
}
