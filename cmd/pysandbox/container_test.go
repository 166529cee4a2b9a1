package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/launcher"
)

// TestServeInContainer: serve --container podman, what serve is on macOS
// and Windows (internal/launcher), driven by a real MCP client over
// stdio. The image is not in podman's store, so the launcher loads the
// archive beside the binary; the code runs in that container (it reads
// a file only the image has), and the audit log, a host file, is written
// through the mount of its directory.
//
// The image is the one scripts/k8s/image.sh builds (cached in
// ~/.cache/pysandbox-image, a few minutes the first time), with this
// test's binary copied in.
func TestServeInContainer(t *testing.T) {
	podman, err := exec.LookPath("podman")
	if err != nil {
		t.Skip("podman is not installed (scripts/test.sh installs it with apt)")
	}
	base := baseImage(t, podman)
	bin := binary(t)

	// The image under test: the base with this binary and a marker only
	// it has, saved as the archive beside the binary, and not in the store.
	marker := rand.Text()
	ref := "localhost/pysandbox-launcher-test:" + strings.ToLower(marker[:12])
	name := "pysandbox-launcher-test-" + strings.ToLower(marker[:12])
	podmanOK(t, podman, "create", "--name", name, base)
	defer exec.Command(podman, "rm", "-f", name).Run()
	mf := filepath.Join(t.TempDir(), "marker")
	os.WriteFile(mf, []byte(marker), 0o644)
	podmanOK(t, podman, "cp", bin, name+":/usr/local/bin/pysandbox")
	podmanOK(t, podman, "cp", mf, name+":/usr/share/pysandbox-launcher-marker")
	podmanOK(t, podman, "commit", "-q", name, ref)
	defer exec.Command(podman, "rmi", "-f", ref).Run()
	archive := filepath.Join(filepath.Dir(bin), "pysandbox-image.tar")
	podmanOK(t, podman, "save", "-o", archive, ref)
	defer os.Remove(archive)
	podmanOK(t, podman, "rmi", ref)

	dir := t.TempDir()
	auditLog := filepath.Join(dir, "audit.log")
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.Command(bin, "serve", "--log-level", "warn", "--container", "podman", "--image", ref, "--audit-log", auditLog, "--pool-size", "1")
	cmd.Stderr = &stderr
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("%v; the launcher said:\n%s", err, stderr.String())
	}
	defer cs.Close()
	t.Logf("image loaded, container started and MCP initialized in %v", time.Since(start).Round(time.Millisecond))
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{
		"code": "print(open('/usr/share/pysandbox-launcher-marker').read())\n6*7"}})
	if err != nil {
		t.Fatal(err)
	}
	out := res.StructuredContent.(map[string]any)
	if res.IsError || out["stdout"] != marker+"\n" || out["return_value"] != 42.0 {
		t.Fatalf("not run in the image's container: %v\n%s", out, stderr.String())
	}
	if _, err := os.Stat("/usr/share/pysandbox-launcher-marker"); err == nil {
		t.Fatal("the marker is on the host too: the test proves nothing")
	}
	cs.Close()
	// The server in the container wrote the audit log on the host.
	deadline := time.Now().Add(10 * time.Second)
	for {
		data, _ := os.ReadFile(auditLog)
		if strings.Contains(string(data), "run_python") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the audit log on the host has no run_python record: %q", data)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The launcher loaded the image from the archive.
	if err := exec.Command(podman, "image", "exists", ref).Run(); err != nil {
		t.Fatalf("the image was not loaded: %v", err)
	}
}

func podmanOK(t *testing.T, podman string, args ...string) string {
	t.Helper()
	out, err := exec.Command(podman, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// baseImage is pysandbox's image as scripts/k8s/image.sh builds it,
// loaded into podman: built once per version of the scripts that make it
// and cached in ~/.cache/pysandbox-image. It skips the test, saying why,
// if podman cannot run a container from it here.
func baseImage(t *testing.T, podman string) string {
	t.Helper()
	h := sha256.New()
	for _, f := range []string{"../../scripts/k8s/image.sh", "../../scripts/k8s/ociarchive.py"} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		h.Write(data)
	}
	key := hex.EncodeToString(h.Sum(nil))[:16]
	ref := "localhost/pysandbox-testbase:" + key
	if exec.Command(podman, "image", "exists", ref).Run() != nil {
		cache, err := os.UserCacheDir()
		if err != nil {
			t.Fatal(err)
		}
		archive := filepath.Join(cache, "pysandbox-image", "base-"+key+".tar")
		if _, err := os.Stat(archive); err != nil {
			os.MkdirAll(filepath.Dir(archive), 0o755)
			t.Logf("building the image with scripts/k8s/image.sh into %s (a few minutes, once)", archive)
			cmd := exec.Command("scripts/k8s/image.sh", archive+".tmp", ref)
			cmd.Dir = "../.."
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("scripts/k8s/image.sh: %v\n%s", err, out)
			}
			if err := os.Rename(archive+".tmp", archive); err != nil {
				t.Fatal(err)
			}
		}
		podmanOK(t, podman, "load", "-q", "-i", archive)
		if exec.Command(podman, "image", "exists", ref).Run() != nil {
			loaded := strings.TrimSpace(lastLoaded(t, podman, archive))
			podmanOK(t, podman, "tag", loaded, ref)
			podmanOK(t, podman, "untag", ref, loaded) // only ref names it now
		}
	}
	if err := exec.Command(podman, "image", "exists", ref).Run(); err != nil {
		t.Fatalf("the image %s is not in podman's store after loading it", ref)
	}
	// Can podman run a container here at all? With the same limits as
	// the launcher's, which it sets when the host's are low.
	args := []string{"run", "--rm", "--pull", "never"}
	for _, u := range launcher.Ulimits() {
		args = append(args, "--ulimit", u)
	}
	if out, err := exec.Command(podman, append(args, "--entrypoint", "/bin/true", ref)...).CombinedOutput(); err != nil {
		t.Skipf("podman cannot run a container on this machine: %v: %s", err, out)
	}
	return ref
}

// lastLoaded is the name podman gave the archive's image, for an archive
// built under another name.
func lastLoaded(t *testing.T, podman, archive string) string {
	out := podmanOK(t, podman, "load", "-i", archive)
	for _, l := range strings.Split(out, "\n") {
		if n, ok := strings.CutPrefix(l, "Loaded image: "); ok {
			return n
		}
		if n, ok := strings.CutPrefix(l, "Loaded image(s): "); ok {
			return strings.Split(n, ",")[0]
		}
	}
	t.Fatalf("podman load said no name: %s", out)
	return ""
}
