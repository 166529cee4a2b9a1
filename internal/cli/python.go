package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pysandbox/pysandbox/internal/audit"
	"github.com/pysandbox/pysandbox/internal/deps"
	"github.com/pysandbox/pysandbox/internal/egress"
	"github.com/pysandbox/pysandbox/internal/interp"
	"github.com/pysandbox/pysandbox/internal/pydist"
	"github.com/pysandbox/pysandbox/internal/sandbox"
)

// envOr is an environment variable's value, or def when it is unset.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// checkPythonDownloads refuses --python-downloads* values that cannot
// work (they may come from uv's environment variables: the message says
// which).
func (o *options) checkPythonDownloads() error {
	if _, err := pydist.ParseMode(o.pyDownloads); err != nil {
		return usageError{fmt.Errorf("--python-downloads (or $UV_PYTHON_DOWNLOADS): %w", err)}
	}
	if _, err := pydist.ParsePreference(o.pyPreference); err != nil {
		return usageError{fmt.Errorf("--python-preference (or $UV_PYTHON_PREFERENCE): %w", err)}
	}
	if o.pyMirror != "" && !isHTTPURL(o.pyMirror) {
		return usageError{fmt.Errorf("--python-install-mirror (or $UV_PYTHON_INSTALL_MIRROR) %q: want an http(s) URL", o.pyMirror)}
	}
	if m := o.pyMetadata; m != "" && !isHTTPURL(m) {
		if strings.Contains(m, "://") {
			return usageError{fmt.Errorf("--python-downloads-json-url (or $UV_PYTHON_DOWNLOADS_JSON_URL) %q: want a file or an http(s) URL", m)}
		}
		if _, err := os.Stat(m); err != nil {
			return usageError{fmt.Errorf("--python-downloads-json-url (or $UV_PYTHON_DOWNLOADS_JSON_URL): %w", err)}
		}
	}
	return nil
}

func isHTTPURL(s string) bool {
	return strings.HasPrefix(s, "http://") || strings.HasPrefix(s, "https://")
}

// pythons is the manager of managed interpreters, stored in cache and
// checked in backend's sandboxes; downloads go through the proxy.
func (o *options) pythons(cache *deps.Cache, backend sandbox.Backend, log *slog.Logger) (*pydist.Manager, error) {
	mode, _ := pydist.ParseMode(o.pyDownloads)
	proxy := o.proxy
	return pydist.New(pydist.Config{
		Cache:    cache,
		Metadata: o.pyMetadata,
		Mirror:   o.pyMirror,
		Mode:     mode,
		Backend:  backend,
		Limits:   o.limits(),
		Network: func(l net.Listener, trusted []string, who pydist.Who) func() {
			return proxy.Download(l, trusted, egress.Info{Identity: who.Identity, Tool: "python-download"})
		},
		OnEvent: o.onPython,
		Logger:  log,
	})
}

// pythonRecord is the audit record of an install or a removal.
func pythonRecord(e pydist.Event) *audit.Record {
	r := &audit.Record{
		Event: audit.EventPython, Identity: e.Who.Identity, Tool: e.Who.Tool, Decision: e.Outcome,
		DurationMS: e.Duration.Milliseconds(), Error: e.Error,
		Detail: map[string]string{"action": e.Action, "version": e.Version, "url": e.URL, "sha256": e.SHA256, "bytes": strconv.FormatInt(e.Bytes, 10)},
	}
	if len(r.Error) > audit.MaxErrorBytes {
		r.Error = r.Error[:audit.MaxErrorBytes]
	}
	return r
}

const pythonUsage = `Usage: pysandbox python list [flags]              the Pythons runs can use: the host's, the managed ones installed, and the versions that can be downloaded
       pysandbox python install [flags] VERSION   download, verify and unpack a managed Python (e.g. 3.13), as automatic mode does on demand
       pysandbox python remove [flags] VERSION    delete an installed managed Python (refused while a server runs on it)

Managed Pythons are python-build-standalone's install_only builds, as uv installs them,
kept in the dependency cache (--cache-dir, under --cache-size; 'pysandbox cache prune' covers them).
Run 'pysandbox python list -h' for the flags.
`

// pythonCmd lists, installs and removes managed interpreters.
func pythonCmd(args []string, stdout, stderr io.Writer) error {
	// Ctrl-C stops a download; what it left is deleted.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(args) > 0 && isHelp(args[0]) {
		fmt.Fprint(stderr, pythonUsage)
		return flag.ErrHelp
	}
	if len(args) == 0 || (args[0] != "list" && args[0] != "install" && args[0] != "remove") {
		return usageError{errors.New("usage: pysandbox python list|install VERSION|remove VERSION; pysandbox python -h says more")}
	}
	sub := args[0]
	synopsis := "python " + sub + " [flags]"
	if sub != "list" {
		synopsis = "python " + sub + " [flags] VERSION"
	}
	fs, o := newFlagSet("python "+sub, synopsis, stderr)
	// Its own lines say what happens; the log only what goes wrong.
	fs.Lookup("log-level").DefValue = "warn"
	o.logLevel = "warn"
	if err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	var version string
	// Flags may come after the version too.
	if sub != "list" && fs.NArg() > 1 && strings.HasPrefix(fs.Arg(1), "-") {
		v := fs.Arg(0)
		if err := parseFlags(fs, fs.Args()[1:]); err != nil {
			return err
		}
		if fs.NArg() > 0 {
			return usageError{fmt.Errorf("python %s takes one version, such as 3.13 (got %q and %q)", sub, v, fs.Arg(0))}
		}
		version = v
	}
	switch {
	case sub == "list" && fs.NArg() > 0:
		return usageError{fmt.Errorf("python list takes no arguments (got %q)", fs.Arg(0))}
	case sub != "list" && version == "" && fs.NArg() != 1:
		return usageError{fmt.Errorf("python %s takes one version, such as 3.13 (got %d arguments)", sub, fs.NArg())}
	case sub != "list" && version == "":
		version = fs.Arg(0)
	}
	if sub != "list" && !versionArgRE.MatchString(version) {
		return usageError{fmt.Errorf("%q is not a version such as 3.13 or 3.13.1", version)}
	}
	if err := o.validate(); err != nil {
		return err
	}
	log, err := o.logger(stderr)
	if err != nil {
		return err
	}
	if err := o.buildProxy(log); err != nil {
		return err
	}
	kind, _ := sandbox.ParseKind(o.sandbox)
	backend, err := newBackend(kind)
	if err != nil {
		return err
	}
	cache, err := o.depsCache(backend, log)
	if err != nil {
		return err
	}
	// No event is logged: the command's own result says what happened.
	m, err := o.pythons(cache, backend, log)
	if err != nil {
		return err
	}
	defer m.Close()
	who := pydist.Who{Identity: "cli", Tool: "pysandbox python " + sub}
	switch sub {
	case "install":
		start := time.Now()
		in, fresh, err := m.Install(ctx, version, who, nil, func(line string) { fmt.Fprintln(stderr, line) })
		if err != nil {
			return downloadAdvice(err, o.pyMirror)
		}
		if !fresh {
			fmt.Fprintf(stdout, "Python %s is already installed: %s\n", in.Version, in.Path)
			return nil
		}
		fmt.Fprintf(stdout, "installed Python %s in %s: %s (%.1f MiB on disk), verified against SHA-256 %s\n",
			in.Version, time.Since(start).Round(100*time.Millisecond), in.Path, float64(in.SizeBytes)/(1<<20), in.SHA256)
		return nil
	case "remove":
		removed, err := m.Remove(version, who)
		for _, in := range removed {
			fmt.Fprintf(stdout, "removed Python %s (%.1f MiB)\n", in.Version, float64(in.SizeBytes)/(1<<20))
		}
		return err
	}
	return listPythons(ctx, m, stdout, who)
}

var versionArgRE = regexp.MustCompile(`^3\.[0-9]{1,2}(\.[0-9]{1,3})?$`)

// listPythons prints the host's interpreters, the managed ones and what
// can be downloaded.
func listPythons(ctx context.Context, m *pydist.Manager, stdout io.Writer, who pydist.Who) error {
	fmt.Fprintf(stdout, "%-12s %-10s %s\n", "VERSION", "SOURCE", "WHERE")
	installed := map[string]bool{}
	for _, it := range interp.Discover(ctx) {
		if it.Supported {
			fmt.Fprintf(stdout, "%-12s %-10s %s\n", it.Version, it.Source, it.Path)
		}
	}
	for _, in := range m.Installed() {
		installed[in.Version] = true
		fmt.Fprintf(stdout, "%-12s %-10s %s (%.1f MiB)\n", in.Version, pydist.SourceManaged, in.Path, float64(in.SizeBytes)/(1<<20))
	}
	c, err := m.Catalog(ctx, who)
	if err != nil {
		fmt.Fprintf(stdout, "(the download metadata could not be read: %v)\n", err)
		return nil
	}
	if m.Mode() == pydist.Never {
		fmt.Fprintln(stdout, "(downloads are off: --python-downloads never)")
		return nil
	}
	for _, d := range c.Minors() {
		if !installed[fmt.Sprintf("%d.%d.%d", d.Major, d.Minor, d.Patch)] {
			fmt.Fprintf(stdout, "%-12s %-10s %s\n", d.Version(), "download", m.URL(d))
		}
	}
	return nil
}

// downloadAdvice adds to a failed download what the person at the
// terminal can do about it: the archive host is often what a machine
// cannot reach, and a mirror is the way around it.
func downloadAdvice(err error, mirror string) error {
	var de *pydist.DownloadError
	if !errors.As(err, &de) {
		return err
	}
	if mirror != "" {
		return fmt.Errorf("%w; check that the mirror (--python-install-mirror %s) is reachable from here and serves python-build-standalone's archives under the same paths", err, mirror)
	}
	return fmt.Errorf("%w; if this machine cannot reach the download host, give --python-install-mirror (or $UV_PYTHON_INSTALL_MIRROR) a mirror of python-build-standalone's releases that it can reach, or install that Python on the host itself, where runs use it as it is", err)
}
