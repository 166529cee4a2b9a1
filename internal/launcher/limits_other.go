//go:build !linux

package launcher

// ulimits are none: on macOS and Windows the runtime's containers run in
// its own Linux VM, whose limits are its own.
func ulimits() []string { return nil }
