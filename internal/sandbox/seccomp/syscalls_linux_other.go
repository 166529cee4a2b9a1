//go:build linux && !amd64 && !arm64

package seccomp

// native is left zero: Program and Install report the architecture as
// unsupported instead of installing a filter with unchecked numbers.
var native archInfo
