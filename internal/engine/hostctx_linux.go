package engine

import (
	"os"
	"strconv"
	"strings"
)

// ServerContext is where the server itself runs: what stands between a
// process that escaped a run's sandbox and the machine. The layers say
// what each run gets; this says what is around them.
type ServerContext struct {
	// Kubernetes is set in a pod (the kubelet sets KUBERNETES_SERVICE_HOST
	// in every container).
	Kubernetes bool `json:"kubernetes"`
	// UserNamespace: the server runs in a user namespace of its own (a
	// user-namespaced pod, rootless), so its root is not the machine's.
	UserNamespace bool `json:"user_namespace"`
	// SysAdmin: the server holds CAP_SYS_ADMIN (a privileged container,
	// or root on a host; in its own user namespace, that is its own).
	SysAdmin bool `json:"sys_admin"`
	// Note says what this means, in a sentence.
	Note string `json:"note"`
}

// serverContext reads the server's own situation from /proc/self.
func serverContext() *ServerContext {
	c := &ServerContext{Kubernetes: os.Getenv("KUBERNETES_SERVICE_HOST") != ""}
	if m, err := os.ReadFile("/proc/self/uid_map"); err == nil {
		f := strings.Fields(string(m))
		// The initial namespace maps all ids to themselves: 0 0 4294967295.
		c.UserNamespace = !(len(f) == 3 && f[0] == "0" && f[1] == "0" && f[2] == "4294967295")
	}
	if st, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, line := range strings.Split(string(st), "\n") {
			if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
				// Not "every capability": a machine's root may itself lack
				// some (this VM's lacks CAP_SYS_RESOURCE).
				n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
				c.SysAdmin = err == nil && n&(1<<21) != 0
			}
		}
	}
	root := os.Geteuid() == 0
	switch {
	case c.Kubernetes && c.UserNamespace:
		c.Note = "a user-namespaced pod: the server's root is not the node's"
	case c.Kubernetes && c.SysAdmin && root:
		c.Note = "a privileged pod: every run's layers hold, but the server itself is root on the node (use hostUsers: false where the runtime supports it)"
	case c.Kubernetes:
		c.Note = "a pod without a user namespace of its own"
	case c.UserNamespace:
		c.Note = "in a user namespace of its own (rootless)"
	case root:
		c.Note = "root on this machine"
	default:
		c.Note = "an unprivileged user on this machine"
	}
	return c
}
