package cli

import (
	"flag"
	"strings"

	"github.com/pysandbox/pysandbox/internal/profiles"
	"github.com/pysandbox/pysandbox/internal/tools"
)

// profileFlags are serve's --tools and the peers' flags that map onto
// pysandbox (see internal/profiles).
type profileFlags struct {
	tools          string
	deps           commaList
	maxOutputBytes int
}

func (p *profileFlags) add(fs *flag.FlagSet, o *options) {
	fs.StringVar(&p.tools, "tools", profiles.Native, "the tools to serve, by profile: "+strings.Join(profiles.Names(), ", ")+
		"; several, separated by commas, when their tool names do not clash (each profile has another server's tool names and result formats, in pysandbox's sandbox and under its policy)")
	fs.Var(&p.deps, "deps", "mcp-run-python: packages every run_python_code call can import (comma-separated PEP 508 requirements), installed on first use and cached")
	fs.Var(&p.deps, "dependencies", "alias of --deps")
	fs.IntVar(&p.maxOutputBytes, "max-output-bytes", 102400, "mcp-python-exec-sandbox: bytes of stdout and of stderr execute_python shows, each (the runs keep --max-output)")
	fs.Var(&o.timeout, "default-timeout", "alias of --timeout (mcp-python-exec-sandbox's name)")
	fs.StringVar(&o.python, "python-version", "", "alias of --python, e.g. 3.12 (mcp-python-exec-sandbox's name)")
}

func (p *profileFlags) selectProfiles() ([]tools.Profile, bool, error) {
	return profiles.Select(p.tools, profiles.Options{Deps: p.deps, MaxOutputBytes: p.maxOutputBytes})
}

// commaList is a repeatable flag of comma-separated values.
type commaList []string

func (l *commaList) String() string { return strings.Join(*l, ",") }
func (l *commaList) Set(v string) error {
	for _, x := range strings.Split(v, ",") {
		if x = strings.TrimSpace(x); x != "" {
			*l = append(*l, x)
		}
	}
	return nil
}
