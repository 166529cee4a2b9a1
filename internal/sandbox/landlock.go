package sandbox

// Landlock is one more layer where the kernel has it (5.13+): whatever a
// mount or a permission might let through by mistake, a sandboxed process
// can write only beneath these paths (and its writable binds), and, from
// Landlock ABI 6 (6.12+), cannot reach abstract Unix sockets or signal
// processes outside its own sandbox. Reads are left to the mounts: every
// path the sandbox shows is meant to be read.
//
// Landlock is applied by the native init in Go (restrictWrites) and by each
// warm-pool child in Python (the zygote receives LandlockWritable and
// prepares the calls' arguments once); the zygote itself is not
// restricted, since a Landlock domain forbids the mounts its children
// make. Rules hold inodes, and Landlock ignores directories hidden under a
// mount, so each child builds its ruleset after mounting its own /tmp,
// /work and /dev/shm. Measured cost per pooled run: within noise
// (BenchmarkPooledHello A/B, 39.8 vs 40.7 ms on a slow moment of this
// machine). bwrap has no option for it.
var landlockWritable = []string{"/tmp", "/work", "/dev/shm", "/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"}

// LandlockWritable lists the paths a sandbox may write beneath.
func LandlockWritable() []string { return landlockWritable }
