package sandbox

import (
	"strings"
	"testing"
)

func TestUserNSHint(t *testing.T) {
	for _, tc := range []struct {
		sysctl map[string]string
		want   string
	}{
		{map[string]string{"/proc/sys/kernel/apparmor_restrict_unprivileged_userns": "1"}, "AppArmor"},
		{map[string]string{"/proc/sys/kernel/unprivileged_userns_clone": "0"}, "unprivileged_userns_clone=0"},
		{map[string]string{"/proc/sys/user/max_user_namespaces": "0"}, "max_user_namespaces=0"},
		{map[string]string{}, "pysandbox check"},
	} {
		got := userNSHintFrom(func(p string) string { return tc.sysctl[p] })
		if !strings.Contains(got, tc.want) {
			t.Errorf("%v: %q, want it to mention %q", tc.sysctl, got, tc.want)
		}
	}
}
