// Package seccomp builds and installs the seccomp-bpf system-call filter
// that the sandbox puts on the untrusted Python process.
//
// The filter is a deny-list modelled on Docker's default profile: it refuses
// the system calls an unprivileged Python program never needs but a sandbox
// escape often does (namespaces, mounts, tracing, keyrings, kernel modules,
// eBPF, io_uring, ...) and allows everything else. It is one layer among
// several; namespaces, cgroups and rlimits do the rest. Denials return EPERM
// rather than killing the process so that Python sees an ordinary OSError.
//
// Only linux/amd64 and linux/arm64 are supported. The filter is assembled in
// pure Go with golang.org/x/net/bpf; no cgo or libseccomp is involved.
package seccomp
