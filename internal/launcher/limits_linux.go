package launcher

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Podman's (runc's) default limits in a container: a host whose hard
// limits are lower (no CAP_SYS_RESOURCE to raise them) cannot start a
// container with them.
const (
	runtimeNofile = 1 << 20
	runtimeNproc  = 4194304
)

// Ulimits are --ulimit values for this host's limits that are below the
// runtime's defaults: sane values the runtime can set, within the
// host's (open files: the host's, up to 65536; processes: 4096, as
// docs/commands.md says; the host's own can still be refused by runc).
func Ulimits() []string {
	var out []string
	for _, l := range []struct {
		name     string
		resource int
		def, max uint64
	}{{"nofile", unix.RLIMIT_NOFILE, runtimeNofile, 65536}, {"nproc", unix.RLIMIT_NPROC, runtimeNproc, 4096}} {
		var r unix.Rlimit
		if unix.Getrlimit(l.resource, &r) != nil || r.Max >= l.def {
			continue
		}
		hard := min(r.Max, l.max)
		soft := min(r.Cur, hard)
		if l.name == "nproc" {
			soft = hard
		}
		out = append(out, fmt.Sprintf("%s=%d:%d", l.name, soft, hard))
	}
	return out
}
