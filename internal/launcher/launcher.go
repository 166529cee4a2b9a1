// Package launcher runs `pysandbox serve` inside pysandbox's OCI image
// under a container runtime (Podman or Docker), for hosts where the
// sandbox cannot run natively (macOS, Windows) or when asked to on Linux
// (serve --container RUNTIME). It finds the runtime, makes sure the image
// is there (loading the archive shipped next to the binary if not),
// builds the `RUNTIME run -i --rm` line with the capabilities, seccomp
// profile and unmasked /proc the server needs (docs/commands.md, "In a
// container"), bind-mounts the files the serve flags name, and runs it
// with stdio passed through and signals forwarded.
//
// It is OS-agnostic: it builds on every GOOS and imports nothing of the
// Linux server.
package launcher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	seccompprofile "github.com/pysandbox/pysandbox/deploy/kubernetes/seccomp"
)

// ArchiveName is the image archive the launcher loads when the image is
// not in the runtime's store, looked for next to the pysandbox binary
// (as is the release's pysandbox-VERSION-image.tar).
const ArchiveName = "pysandbox-image.tar"

// Runtimes are the container runtimes looked for on PATH, in order.
var Runtimes = []string{"podman", "docker"}

// Capabilities are those the server needs in its container: user
// namespaces' setup and the sandbox's mounts (SYS_ADMIN), its network
// namespace (NET_ADMIN), the sandbox's uid/gid maps (SETUID, SETGID),
// pivot_root (SYS_CHROOT), its root's setup (DAC_OVERRIDE), dropping
// capabilities (SETPCAP) and killing runs (KILL). As in
// deploy/kubernetes and docs/commands.md.
var Capabilities = []string{"SYS_ADMIN", "NET_ADMIN", "SETUID", "SETGID", "SYS_CHROOT", "DAC_OVERRIDE", "SETPCAP", "KILL"}

// CacheVolume is the named volume that keeps the dependency cache
// (/var/cache/pysandbox in the container) from one launch to the next,
// unless --cache-dir names a host directory.
const CacheVolume = "pysandbox-cache"

// Config is one launch.
type Config struct {
	// Runtime is --container: a name on PATH or a path; "" finds one of
	// Runtimes.
	Runtime string
	// Image is --image; "" is DefaultImage.
	Image string
	// DefaultImage is the image of this build (pysandbox:VERSION).
	DefaultImage string
	// Archive is the image archive to load when the image is missing; ""
	// is ArchiveName next to the running executable.
	Archive string
	// ServeArgs are serve's flags, without --container and --image.
	ServeArgs []string
	// GOOS is the host's OS ("" is runtime.GOOS): how host paths are
	// translated for the container.
	GOOS string
	// Stdin, Stdout and Stderr are the container's stdio (os.Std* if nil:
	// then the runtime inherits them directly).
	Stdin          io.Reader
	Stdout, Stderr io.Writer
}

// SplitArgs takes --container and --image out of serve's flags (in any of
// the flag package's forms), up to where flag parsing stops.
func SplitArgs(args []string) (runtime, image string, rest []string, err error) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" || len(a) < 2 || a[0] != '-' {
			rest = append(rest, args[i:]...)
			break
		}
		name, value, inline := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if name != "container" && name != "image" {
			rest = append(rest, a)
			if !inline && !BoolFlags[name] && i+1 < len(args) {
				i++
				rest = append(rest, args[i])
			}
			continue
		}
		if !inline {
			if i+1 >= len(args) {
				return "", "", nil, fmt.Errorf("flag needs an argument: %s", a)
			}
			i++
			value = args[i]
		}
		if name == "container" {
			runtime = value
		} else {
			image = value
		}
	}
	return runtime, image, rest, nil
}

// FindRuntime is the runtime's path: name (a name on PATH or a path), or
// the first of Runtimes on PATH.
func FindRuntime(name string) (string, error) {
	if name != "" {
		p, err := exec.LookPath(name)
		if err != nil {
			return "", fmt.Errorf("--container %s: %w", name, err)
		}
		return p, nil
	}
	for _, r := range Runtimes {
		if p, err := exec.LookPath(r); err == nil {
			return p, nil
		}
	}
	return "", errors.New("no container runtime: install Podman (https://podman.io) or Docker Desktop, or name one with --container PATH")
}

// RunArgs is the runtime's command line, after the runtime itself: run
// the image with the server's capabilities, the seccomp profile at
// seccompPath, an unmasked /proc, the mounts, and serve with args.
func RunArgs(image, seccompPath string, ulimits []string, mounts []Mount, cacheVolume bool, serveArgs []string) []string {
	a := []string{"run", "-i", "--rm", "--pull", "never",
		"--cap-add", strings.Join(Capabilities, ","),
		"--security-opt", "seccomp=" + seccompPath,
		"--security-opt", "systempaths=unconfined",
		"--security-opt", "apparmor=unconfined",
	}
	for _, u := range ulimits {
		a = append(a, "--ulimit", u)
	}
	if cacheVolume {
		a = append(a, "--volume", CacheVolume+":/var/cache/pysandbox")
	}
	for _, m := range mounts {
		a = append(a, "--mount", m.String())
	}
	a = append(a, image, "serve")
	return append(a, serveArgs...)
}

// Run launches the server as cfg says and waits for it; the exit code is
// the runtime's (the server's).
func Run(ctx context.Context, cfg Config) (int, error) {
	rt, err := FindRuntime(cfg.Runtime)
	if err != nil {
		return 0, err
	}
	goos := cfg.GOOS
	if goos == "" {
		goos = hostOS
	}
	serveArgs, mounts, cacheVolume, err := Translate(cfg.ServeArgs, goos)
	if err != nil {
		return 0, err
	}
	image := cfg.Image
	if image == "" {
		image = cfg.DefaultImage
	}
	stderr := cfg.Stderr
	if stderr == nil {
		stderr = os.Stderr
	}
	if err := ensureImage(ctx, rt, image, cfg.Archive, stderr); err != nil {
		return 0, err
	}
	f, err := os.CreateTemp("", "pysandbox-seccomp-*.json")
	if err != nil {
		return 0, err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(seccompprofile.Profile); err != nil {
		f.Close()
		return 0, err
	}
	if err := f.Close(); err != nil {
		return 0, err
	}
	cmd := exec.Command(rt, RunArgs(image, f.Name(), Ulimits(), mounts, cacheVolume, serveArgs)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = cfg.Stdin, cfg.Stdout, cfg.Stderr
	if cmd.Stdin == nil {
		cmd.Stdin = os.Stdin
	}
	if cmd.Stdout == nil {
		cmd.Stdout = os.Stdout
	}
	if cmd.Stderr == nil {
		cmd.Stderr = os.Stderr
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("%s: %w", rt, err)
	}
	done := make(chan struct{})
	go func() {
		for {
			select {
			case s := <-sigs:
				// The runtime passes them on to the server (podman and
				// docker run proxy signals by default).
				_ = cmd.Process.Signal(s)
			case <-ctx.Done():
				_ = cmd.Process.Signal(syscall.SIGTERM)
				<-done
				return
			case <-done:
				return
			}
		}
	}()
	err = cmd.Wait()
	close(done)
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), nil
	}
	if err != nil {
		return 0, err
	}
	return 0, nil
}

// ensureImage makes sure image is in the runtime's store, loading
// archive (or ArchiveName next to this executable) if it is not.
func ensureImage(ctx context.Context, rt, image, archive string, stderr io.Writer) error {
	if exec.CommandContext(ctx, rt, "image", "inspect", image).Run() == nil {
		return nil
	}
	if archive == "" {
		self, err := os.Executable()
		if err != nil {
			return fmt.Errorf("image %s is not in %s, and where this binary is (to find %s beside it) is unknown: %w", image, filepath.Base(rt), ArchiveName, err)
		}
		if s, err := filepath.EvalSymlinks(self); err == nil {
			self = s
		}
		archive = filepath.Join(filepath.Dir(self), ArchiveName)
		// The release's name for it: pysandbox-VERSION-image.tar.
		if tag, ok := strings.CutPrefix(image, "pysandbox:"); ok {
			if rel := filepath.Join(filepath.Dir(self), "pysandbox-"+tag+"-image.tar"); fileExists(rel) && !fileExists(archive) {
				archive = rel
			}
		}
	}
	if _, err := os.Stat(archive); err != nil {
		return fmt.Errorf("image %s is not in %s and there is no image archive to load (%s): put the release's image archive there, or build one with scripts/k8s/image.sh OUT.tar %s and run %s load -i OUT.tar", image, filepath.Base(rt), archive, image, filepath.Base(rt))
	}
	fmt.Fprintf(stderr, "pysandbox: loading %s into %s (once)\n", archive, filepath.Base(rt))
	load := exec.CommandContext(ctx, rt, "load", "-i", archive)
	out, err := load.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s load -i %s: %v: %s", filepath.Base(rt), archive, err, strings.TrimSpace(string(out)))
	}
	if exec.CommandContext(ctx, rt, "image", "inspect", image).Run() != nil {
		return fmt.Errorf("%s holds no image %s (it loaded: %s); name the one it holds with --image", archive, image, strings.TrimSpace(string(out)))
	}
	return nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
