// Package seccomp holds pysandbox.json, the seccomp profile pysandbox's
// containers need (see gen/main.go for what it is and how it is made),
// for the launcher, which hands it to a container runtime. The file stays
// here, where the Kubernetes manifests expect it.
package seccomp

import _ "embed"

// Profile is pysandbox.json.
//
//go:embed pysandbox.json
var Profile []byte
