package seccomp

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"runtime"
	"slices"
	"sort"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// archInfo describes the native system-call ABI of one architecture. Each
// syscalls_linux_<arch>.go file defines the variable native.
type archInfo struct {
	audit uint32 // AUDIT_ARCH_* value seccomp_data.arch holds for native calls
	x32   bool   // refuse numbers with the x32 bit set (amd64 only)

	// denied maps every unconditionally refused syscall to its number.
	denied map[string]uint32

	// Syscalls whose verdict depends on an argument, or that get a special errno.
	clone, clone3, ioctl, fcntl, personality, socket uint32
}

// Offsets into struct seccomp_data (include/uapi/linux/seccomp.h):
//
//	struct seccomp_data {
//		int   nr;                   // offset 0
//		__u32 arch;                 // offset 4
//		__u64 instruction_pointer;  // offset 8
//		__u64 args[6];              // offset 16
//	};
//
// The kernel loads 32-bit words from it in native byte order.
const (
	offNr   = 0
	offArch = 4
	offArgs = 16
)

// argLow is the offset of the low 32 bits of args[i]. amd64 and arm64 are
// little-endian, so the low word comes first and the high word is at +4.
//
// Every argument this filter inspects (clone flags, ioctl request, socket
// family, personality) is truncated to 32 bits by the kernel before use:
// ioctl's cmd, socket's family and personality's persona are declared int or
// unsigned int, and clone does lower_32_bits(clone_flags) (kernel/fork.c).
// So the low word is exactly what the kernel acts on, and the high word must
// be ignored, not required to be zero: checking "high == 0 && low == TIOCSTI"
// would let 0x1_00005412 through while the kernel still runs TIOCSTI, and
// requiring a zero high word for clone would break callers whose int flags
// get sign-extended (CLONE_IO is bit 31).
func argLow(i int) uint32 { return offArgs + 8*uint32(i) }

// x32Bit is __X32_SYSCALL_BIT. x32 programs run with AUDIT_ARCH_X86_64 too, so
// the arch check alone does not stop them; they are told apart by this bit in
// the syscall number. Python never uses x32, and it gives access to a second
// syscall table that a deny-list written for x86_64 numbers would miss.
const x32Bit = 0x40000000

// nsFlags are the clone flags that create namespaces. Creating namespaces is
// the first step of most container escapes (a fresh user namespace grants
// capabilities over new mount, net, ... namespaces), and the sandbox has
// already placed the process in the namespaces it should have.
//
// CLONE_NEWTIME (0x80) lies inside CSIGNAL for clone(2), where the kernel reads
// it as part of the exit signal (any value >= 128 is invalid and fails with
// EINVAL); it is listed anyway so a kernel that ever honoured it is covered.
const nsFlags = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS |
	unix.CLONE_NEWIPC | unix.CLONE_NEWUSER | unix.CLONE_NEWPID |
	unix.CLONE_NEWNET | unix.CLONE_NEWTIME

// Filter results.
const (
	retAllow = unix.SECCOMP_RET_ALLOW
	// Python and Go never make foreign-ABI or x32 calls; one means someone is
	// trying to get around the filter. KILL_PROCESS rather than KILL_THREAD,
	// which would leave the other threads running in an unknown state.
	retKill  = unix.SECCOMP_RET_KILL_PROCESS
	retEPERM = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	// clone3 passes its flags in a struct in user memory, which seccomp cannot
	// read, so it cannot be filtered by flags. ENOSYS (as Docker does) makes
	// glibc >= 2.34 fall back to clone(2), whose flags are checked below.
	retENOSYS = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
)

// allowedPersonalities are the personality(2) arguments that are let through,
// as in Docker: 0 (PER_LINUX), 0xffffffff (query only), PER_LINUX32, and both
// with UNAME26. Everything else is refused because it changes how the kernel
// treats the process and its exec'd children; ADDR_NO_RANDOMIZE turns off
// ASLR and READ_IMPLIES_EXEC makes readable memory executable.
var allowedPersonalities = []uint32{
	perLinux,
	perLinux32,
	uname26,
	uname26 | perLinux32,
	perQuery,
}

// Values from include/uapi/linux/personality.h; x/sys/unix does not have them.
const (
	perLinux   = 0x0000000
	perLinux32 = 0x0000008
	uname26    = 0x0020000
	perQuery   = 0xffffffff
)

// Sockets are allowed: network isolation is the job of the network namespace,
// and Python needs AF_UNIX, AF_INET(6) and AF_NETLINK (getifaddrs) sockets for
// ordinary work. The one exception, as in Docker, is AF_VSOCK: it talks to the
// hypervisor or host rather than to a network, so it can reach a VM's host
// agent from inside an otherwise empty network namespace.
var deniedSocketFamilies = []uint32{unix.AF_VSOCK}

// deniedIoctls are terminal requests that push data into another process's
// input: TIOCSTI fakes keystrokes on a controlling terminal shared with the
// parent, and TIOCLINUX can do the same through the console selection buffer.
var deniedIoctls = []uint32{unix.TIOCSTI, unix.TIOCLINUX}

// deniedFcntls: F_NOTIFY (dnotify) would let a run watch, as it happens,
// which files other runs read in the shared read-only trees, just as
// inotify and fanotify would.
var deniedFcntls = []uint32{unix.F_NOTIFY}

// Denied returns the sorted names of the system calls the filter refuses
// whatever their arguments: all with EPERM except clone3, which gets ENOSYS.
// clone, ioctl, personality and socket are refused only for some arguments
// and are not listed. It returns nil on an unsupported architecture.
func Denied() []string {
	if native.audit == 0 {
		return nil
	}
	names := make([]string, 0, len(native.denied)+1)
	for name := range native.denied {
		names = append(names, name)
	}
	names = append(names, "clone3")
	sort.Strings(names)
	return names
}

// Profile selects a filter.
type Profile int

const (
	// Strict is the filter every piece of user code runs under.
	Strict Profile = iota
	// Zygote is Strict minus the calls a warm-pool zygote needs to give each
	// child its own sandbox: unshare (new namespaces), setns (back to its
	// own pid namespace after forking a child into a new one), mount and
	// umount2 (a fresh /tmp and /proc), and sethostname. The zygote never runs user
	// code, and every child installs Strict on top before it does: filters
	// stack, and the most restrictive verdict wins.
	Zygote
)

// zygoteAllowed are the calls Zygote lets through.
var zygoteAllowed = map[string]bool{"unshare": true, "setns": true, "mount": true, "umount2": true, "sethostname": true}

// Program returns the Strict filter for the architecture the program runs
// on, ready to be handed to seccomp(2).
func Program() ([]bpf.RawInstruction, error) { return ProgramFor(Strict) }

// ProgramFor returns the filter of a profile.
func ProgramFor(p Profile) ([]bpf.RawInstruction, error) {
	insns, err := instructions(p)
	if err != nil {
		return nil, err
	}
	raw, err := bpf.Assemble(insns)
	if err != nil {
		return nil, fmt.Errorf("seccomp: assemble filter: %w", err)
	}
	return raw, nil
}

func instructions(p Profile) ([]bpf.Instruction, error) {
	if native.audit == 0 {
		return nil, fmt.Errorf("seccomp: unsupported architecture %s", runtime.GOARCH)
	}
	prog := prelude()

	// Each rule below checks nr itself and falls through when it is
	// another call: A still holds nr when it starts, and a block that
	// loads an argument always ends in a return. They are reached by a
	// binary search on nr, not one after another: an allowed call, the
	// common case, then meets about a dozen comparisons instead of one
	// per denied call, and so does the kernel, which runs the filter for
	// every syscall number when it is installed (to cache the calls it
	// always allows) and on every call the filter does not allow outright.
	rules := make([]rule, 0, len(native.denied)+6)
	for name, nr := range native.denied {
		if p == Zygote && zygoteAllowed[name] {
			continue
		}
		rules = append(rules, rule{nr, []bpf.Instruction{
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: nr, SkipFalse: 1},
			bpf.RetConstant{Val: retEPERM},
		}})
	}
	rules = append(rules,
		rule{native.clone3, []bpf.Instruction{
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: native.clone3, SkipFalse: 1},
			bpf.RetConstant{Val: retENOSYS},
		}},
		// clone: flags are args[0] on both amd64 and arm64.
		rule{native.clone, []bpf.Instruction{
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: native.clone, SkipFalse: 4},
			bpf.LoadAbsolute{Off: argLow(0), Size: 4},
			bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: nsFlags, SkipFalse: 1},
			bpf.RetConstant{Val: retEPERM},
			bpf.RetConstant{Val: retAllow},
		}},
		rule{native.ioctl, argIn(native.ioctl, 1, deniedIoctls, retEPERM, retAllow)},
		rule{native.fcntl, argIn(native.fcntl, 1, deniedFcntls, retEPERM, retAllow)},
		rule{native.socket, argIn(native.socket, 0, deniedSocketFamilies, retEPERM, retAllow)},
		rule{native.personality, argIn(native.personality, 0, allowedPersonalities, retAllow, retEPERM)},
	)
	// Sorted, which also makes it the same program every time.
	slices.SortFunc(rules, func(a, b rule) int { return cmp.Compare(a.nr, b.nr) })
	for i := 1; i < len(rules); i++ {
		if rules[i].nr == rules[i-1].nr {
			return nil, fmt.Errorf("seccomp: two rules for syscall %d", rules[i].nr)
		}
	}
	return append(prog, search(rules)...), nil
}

// prelude kills a call made through another ABI, and leaves the syscall
// number in A for the rules.
func prelude() []bpf.Instruction {
	prog := []bpf.Instruction{
		// A syscall made through another ABI (int 0x80 on amd64, AArch32 on
		// arm64) has different numbers, so nothing below would apply to it.
		bpf.LoadAbsolute{Off: offArch, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: native.audit, SkipTrue: 1},
		bpf.RetConstant{Val: retKill},
		bpf.LoadAbsolute{Off: offNr, Size: 4},
	}
	if native.x32 {
		prog = append(prog,
			bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: x32Bit, SkipFalse: 2},
			// nr == -1 also has the bit set; it is what a tracer uses to skip
			// a call and the kernel answers it with ENOSYS, so let it through.
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: 0xffffffff, SkipTrue: 1},
			bpf.RetConstant{Val: retKill},
		)
	}
	return prog
}

// rule is the check of one syscall number: a block that returns a verdict
// for nr and falls through for any other number.
type rule struct {
	nr    uint32
	block []bpf.Instruction
}

// leafRules is how many rules a search ends in, checked in turn.
const leafRules = 4

// search returns a binary search over rules (sorted by nr) that ends in
// the rules of nr's leaf, then allows: each of their blocks returns for
// its own number and falls through for the others. A conditional jump
// reaches at most 255 instructions ahead; an unconditional one (ja) has
// 32 bits, so the jump over the lower half is one of those.
func search(rules []rule) []bpf.Instruction {
	if len(rules) <= leafRules {
		var out []bpf.Instruction
		for _, r := range rules {
			out = append(out, r.block...)
		}
		return append(out, bpf.RetConstant{Val: retAllow})
	}
	mid := len(rules) / 2
	low, high := search(rules[:mid]), search(rules[mid:])
	return slices.Concat([]bpf.Instruction{
		// nr >= the upper half's first: on to the jump over the lower half.
		bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: rules[mid].nr, SkipFalse: 1},
		bpf.Jump{Skip: uint32(len(low))},
	}, low, high)
}

// argIn returns a block that, for syscall nr, returns match when the low 32
// bits of args[arg] equal one of vals and other when they do not. For any
// other syscall it falls through to the next instruction. See argLow for why
// the high word is ignored.
func argIn(nr uint32, arg int, vals []uint32, match, other uint32) []bpf.Instruction {
	n := len(vals)
	block := []bpf.Instruction{
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: nr, SkipFalse: uint8(n + 3)},
		bpf.LoadAbsolute{Off: argLow(arg), Size: 4},
	}
	for i, v := range vals {
		// On a hit, skip the remaining comparisons and the "other" return.
		block = append(block, bpf.JumpIf{Cond: bpf.JumpEqual, Val: v, SkipTrue: uint8(n - i)})
	}
	return append(block, bpf.RetConstant{Val: other}, bpf.RetConstant{Val: match})
}

// Encode lays a program out as the kernel's struct sock_filter array
// (u16 code, u8 jt, u8 jf, u32 k, in native byte order), for a process that
// installs it itself with prctl(PR_SET_SECCOMP): the pool's forked workers.
func Encode(prog []bpf.RawInstruction) []byte {
	out := make([]byte, 0, 8*len(prog))
	for _, in := range prog {
		out = binary.NativeEndian.AppendUint16(out, in.Op)
		out = append(out, in.Jt, in.Jf)
		out = binary.NativeEndian.AppendUint32(out, in.K)
	}
	return out
}
