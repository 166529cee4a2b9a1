package sandbox

import (
	"os"
	"strings"
)

// userNSHint explains why this machine may refuse unprivileged user
// namespaces, from the knobs that distributions use to restrict them.
func userNSHint() string {
	return userNSHintFrom(func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			return ""
		}
		return strings.TrimSpace(string(b))
	})
}

// userNSHintFrom is userNSHint with the sysctl reader passed in, so every
// branch can be tested on any machine.
func userNSHintFrom(read func(string) string) string {
	switch {
	case read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1":
		return "AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns=1, as on Ubuntu 24.04): " +
			"install an AppArmor profile granting 'userns' to pysandbox, or use --sandbox bwrap (bwrap ships such a profile)"
	case read("/proc/sys/kernel/unprivileged_userns_clone") == "0":
		return "unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone=0): enable them or use --sandbox bwrap with a setuid bwrap"
	case read("/proc/sys/user/max_user_namespaces") == "0":
		return "user namespaces are disabled (user.max_user_namespaces=0)"
	}
	return "the kernel refused to create the sandbox's namespaces; run 'pysandbox check' for details"
}
