// Command pause is the sandbox ("pause") container of the test cluster's
// pods (scripts/k8s/cluster.sh): it holds the pod's namespaces, reaps the
// orphans its pid namespace hands it, and exits on SIGTERM or SIGINT. No
// registry is reachable here, so the cluster cannot pull Kubernetes' own.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var st syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &st, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
