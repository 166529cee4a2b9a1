//go:build !linux

package launcher

// Ulimits are none: on macOS and Windows the runtime's containers run in
// its own Linux VM, whose limits are its own.
func Ulimits() []string { return nil }
