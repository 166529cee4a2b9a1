// Package cgroup puts each sandboxed run into its own Linux control group so
// that its memory (swap included) and its number of tasks are limited, its
// usage can be read back, and everything it started can be killed and
// cleaned up as a unit.
//
// Both cgroup versions are handled, using github.com/containerd/cgroups/v3
// (cgroup1 and cgroup2) wherever that library does the job:
//
//   - v1 (legacy, or the v1/v2 "hybrid" layout): a group is a directory
//     <own>/pysandbox/<name> in each of the memory, pids, cpuacct and freezer
//     hierarchies, where <own> is this process's group in that hierarchy
//     (/proc/self/cgroup). The memory limit is written to both
//     memory.limit_in_bytes and memory.memsw.limit_in_bytes (when swap
//     accounting exists), so RAM plus swap together stay under the limit.
//
//   - v2 (unified): a group is <own>/pysandbox/<name> with memory.max,
//     memory.swap.max = 0 (so the whole limit is RAM; nothing can hide in
//     swap) and pids.max. This works as root and, unprivileged, under a
//     delegated subtree (systemd Delegate=yes, e.g. systemd-run --user
//     -p Delegate=yes ...), because everything is created below our own group.
//
// The v2 "no internal processes" rule says that a non-root cgroup which holds
// processes cannot hand controllers to its children. When our own group holds
// processes (it always holds us) and memory/pids are not yet enabled in its
// cgroup.subtree_control, the package does what crun and systemd do: it moves
// every process of our own group into the leaf <own>/pysandbox-server, then
// enables +memory +pids in <own>/cgroup.subtree_control and in
// <own>/pysandbox/cgroup.subtree_control. This happens once, the first time
// Detect or New needs it, and is visible in /proc/self/cgroup afterwards; a
// server restarted inside that leaf recognises it and keeps using <own>.
//
// Detect measures rather than assumes: it creates and removes a probe group
// with real limits. When something is missing, Info.Reason says so in words
// an operator can act on; callers then fall back to rlimits.
//
// Nothing here is specific to Python; the package only deals in pids.
package cgroup
