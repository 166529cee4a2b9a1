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

// ulimits are --ulimit values for the limits of this host that are below
// the runtime's defaults: the host's own, which the runtime can set.
func ulimits() []string {
	var out []string
	for _, l := range []struct {
		name     string
		resource int
		def      uint64
	}{{"nofile", unix.RLIMIT_NOFILE, runtimeNofile}, {"nproc", unix.RLIMIT_NPROC, runtimeNproc}} {
		var r unix.Rlimit
		if unix.Getrlimit(l.resource, &r) != nil || r.Max >= l.def {
			continue
		}
		out = append(out, fmt.Sprintf("%s=%d:%d", l.name, r.Cur, r.Max))
	}
	return out
}
