// Command gen writes deploy/kubernetes/seccomp/pysandbox.json: the seccomp
// profile pysandbox's pods need. It is the runtime default — Docker's
// (github.com/moby/profiles/seccomp), which containerd's default follows —
// expanded for the capabilities the pod adds (its CAP_SYS_ADMIN rules
// included), plus the one call the sandbox's setup needs that no default
// allows: pivot_root. Nothing else is added; every run then installs its
// own, far stricter filter (internal/sandbox/seccomp).
//
// Usage, from this directory: go run . > ../pysandbox.json
//
// A module of its own, so that the project does not depend on the
// generator's libraries.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// caps are the capabilities the StatefulSet adds (base/statefulset.yaml)
// on top of the runtime's defaults.
var caps = []string{
	// containerd's defaults
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID",
	"CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
	// added for the sandbox's setup
	"CAP_SYS_ADMIN", "CAP_NET_ADMIN",
}

func main() {
	spec := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps}}}
	profile, err := seccomp.GetDefaultProfile(spec)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	profile.Syscalls = append(profile.Syscalls, specs.LinuxSyscall{
		Names:  []string{"pivot_root"},
		Action: specs.ActAllow,
	})
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(profile); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
