package interp

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/pysandbox/pysandbox/internal/pep"
)

// maxSiteEntries bounds the directory entries read from one interpreter's
// site directories: a tree with more is read no further.
const maxSiteEntries = 50_000

// sitesCode asks for the site directories without running the site
// module's startup (-S), so that no .pth file's code runs on the host.
const sitesCode = `import site, json; print(json.dumps(site.getsitepackages()))`

// Distributions lists the distributions installed in the interpreter's
// own site directories, by PEP 503 normalised name, with their versions.
// They come from the names of the .dist-info and .egg-info entries
// (NAME-VERSION.dist-info, NAME-VERSION[-pyX.Y].egg-info, as Debian's
// packages install them); nothing of theirs is read or run. The first
// directory that has a name wins, as on sys.path.
func (i *Interpreter) Distributions(ctx context.Context) (map[string]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, i.Path, "-I", "-S", "-c", sitesCode)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8"}
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("interp: %s: its site directories: %w", i.Path, err)
	}
	var dirs []string
	if err := json.Unmarshal(out, &dirs); err != nil {
		return nil, fmt.Errorf("interp: %s: unexpected answer %q", i.Path, out)
	}
	dists := map[string]string{}
	read := 0
	for _, dir := range dirs {
		if !filepath.IsAbs(dir) {
			continue
		}
		f, err := os.Open(dir)
		if err != nil {
			continue // a site directory that does not exist holds nothing
		}
		names, _ := f.Readdirnames(maxSiteEntries - read)
		f.Close()
		read += len(names)
		for _, n := range names {
			if name, version, py, ok := distName(n); ok && (py == "" || py == i.MajorMinor()) {
				if _, seen := dists[name]; !seen {
					dists[name] = version
				}
			}
		}
		if read >= maxSiteEntries {
			break
		}
	}
	return dists, nil
}

// distName splits a metadata entry's name into the distribution's
// normalised name, its version and, for an egg built for one Python, that
// Python ("3.11"; an egg of another is not the interpreter's).
func distName(entry string) (name, version, py string, ok bool) {
	base, ok := strings.CutSuffix(entry, ".dist-info")
	if !ok {
		if base, ok = strings.CutSuffix(entry, ".egg-info"); !ok {
			return "", "", "", false
		}
		if i := strings.LastIndex(base, "-py"); i > 0 && strings.Count(base, "-") >= 2 {
			base, py = base[:i], base[i+len("-py"):]
		}
	}
	// The name has no '-' (it is escaped to '_'), so it ends at the first.
	name, version, ok = strings.Cut(base, "-")
	if !ok || name == "" || version == "" || strings.Contains(version, "-") {
		return "", "", "", false
	}
	if _, err := pep.ParseVersion(version); err != nil {
		return "", "", "", false
	}
	return pep.NormalizeName(name), version, py, true
}
