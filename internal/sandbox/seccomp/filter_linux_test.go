package seccomp

import (
	"encoding/binary"
	"fmt"
	"slices"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// seccompData lays out struct seccomp_data exactly as the kernel does on a
// little-endian machine: nr, arch, instruction_pointer, args[6].
func seccompData(arch, nr uint32, args ...uint64) []byte {
	b := make([]byte, 64)
	binary.LittleEndian.PutUint32(b[0:], nr)
	binary.LittleEndian.PutUint32(b[4:], arch)
	binary.LittleEndian.PutUint64(b[8:], 0x7f0000001000)
	for i, a := range args {
		binary.LittleEndian.PutUint64(b[16+8*i:], a)
	}
	return b
}

type filterVM struct{ vm *bpf.VM }

// newFilterVM loads the assembled program, as it would be handed to the
// kernel, into x/net/bpf's interpreter.
func newFilterVM(t *testing.T) filterVM {
	t.Helper()
	raw, err := Program()
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) > 4096 { // BPF_MAXINSNS
		t.Fatalf("program has %d instructions, kernel limit is 4096", len(raw))
	}
	insns, ok := bpf.Disassemble(raw)
	if !ok {
		t.Fatal("program contains instructions that do not disassemble")
	}
	for i, ins := range insns {
		// seccomp only accepts aligned 32-bit loads inside seccomp_data.
		if ld, ok := ins.(bpf.LoadAbsolute); ok && (ld.Size != 4 || ld.Off%4 != 0 || ld.Off >= 64) {
			t.Fatalf("instruction %d: load %+v is not valid for seccomp", i, ld)
		}
	}
	vm, err := bpf.NewVM(insns)
	if err != nil {
		t.Fatal(err)
	}
	return filterVM{vm}
}

// run returns the filter's verdict. The kernel reads seccomp_data in native
// (little-endian) order, but the x/net/bpf VM was written for packets and
// reads big-endian, so each 32-bit word is byte-swapped before running. That
// keeps every offset pointing at the same field, so a wrong offset (say, the
// high word of an argument instead of the low one) still shows up.
func (f filterVM) run(t *testing.T, data []byte) uint32 {
	t.Helper()
	swapped := make([]byte, len(data))
	for i := 0; i < len(data); i += 4 {
		binary.BigEndian.PutUint32(swapped[i:], binary.LittleEndian.Uint32(data[i:]))
	}
	v, err := f.vm.Run(swapped)
	if err != nil {
		t.Fatal(err)
	}
	return uint32(v)
}

func (f filterVM) call(t *testing.T, nr uint32, args ...uint64) uint32 {
	t.Helper()
	return f.run(t, seccompData(native.audit, nr, args...))
}

func verdict(v uint32) string {
	switch v & unix.SECCOMP_RET_ACTION_FULL {
	case unix.SECCOMP_RET_ALLOW:
		return "ALLOW"
	case unix.SECCOMP_RET_KILL_PROCESS:
		return "KILL_PROCESS"
	case unix.SECCOMP_RET_ERRNO:
		return "ERRNO(" + unix.ErrnoName(unix.Errno(v&unix.SECCOMP_RET_DATA)) + ")"
	}
	return fmt.Sprintf("%#x", v)
}

func expect(t *testing.T, what string, got, want uint32) {
	t.Helper()
	if got != want {
		t.Errorf("%s: got %s, want %s", what, verdict(got), verdict(want))
	}
}

func TestAllowed(t *testing.T) {
	f := newFilterVM(t)
	// Calls Python, glibc and the Go runtime make all the time, plus the
	// sandboxing calls the brief wants left open (landlock, seccomp).
	for _, nr := range []uint32{
		unix.SYS_READ, unix.SYS_WRITE, unix.SYS_OPENAT, unix.SYS_CLOSE,
		unix.SYS_MMAP, unix.SYS_MPROTECT, unix.SYS_FUTEX, unix.SYS_EXECVE,
		unix.SYS_WAIT4, unix.SYS_EXIT_GROUP, unix.SYS_RT_SIGACTION,
		unix.SYS_GETRANDOM, unix.SYS_PRCTL, unix.SYS_SECCOMP, unix.SYS_RSEQ,
		unix.SYS_PIDFD_OPEN, unix.SYS_MAP_SHADOW_STACK, unix.SYS_PRLIMIT64,
		unix.SYS_LANDLOCK_CREATE_RULESET, unix.SYS_LANDLOCK_ADD_RULE,
		unix.SYS_LANDLOCK_RESTRICT_SELF,
	} {
		expect(t, fmt.Sprintf("syscall %d", nr), f.call(t, nr, 3, 0xffffffff00000000, 1<<63), retAllow)
	}
}

func TestDenied(t *testing.T) {
	f := newFilterVM(t)
	names := Denied()
	if !slices.IsSorted(names) || len(slices.Compact(slices.Clone(names))) != len(names) {
		t.Fatalf("Denied() not sorted and unique: %v", names)
	}
	for _, name := range names {
		if name == "clone3" {
			expect(t, name, f.call(t, native.clone3), retENOSYS)
			continue
		}
		nr, ok := native.denied[name]
		if !ok {
			t.Fatalf("Denied() lists %s, which has no number", name)
		}
		// Arguments must not matter for these.
		expect(t, name, f.call(t, nr), retEPERM)
		expect(t, name+" with args", f.call(t, nr, 1, 2, 3, 4, 5, 6), retEPERM)
	}

	must := []string{
		"ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
		"mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree",
		"fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "unshare",
		"setns", "keyctl", "add_key", "request_key", "bpf", "perf_event_open",
		"userfaultfd", "kexec_load", "kexec_file_load", "init_module",
		"finit_module", "delete_module", "reboot", "settimeofday",
		"clock_settime", "clock_adjtime", "adjtimex", "swapon", "swapoff", "acct",
		"quotactl", "quotactl_fd", "open_by_handle_at", "name_to_handle_at",
		"lookup_dcookie", "syslog", "vhangup", "sethostname", "setdomainname",
		"nfsservctl", "io_uring_setup", "io_uring_enter", "io_uring_register",
		"fanotify_init", "get_mempolicy", "set_mempolicy", "mbind", "move_pages",
		"migrate_pages", "lsm_get_self_attr", "lsm_set_self_attr",
		"lsm_list_modules", "clone3",
	}
	if native.x32 { // x86-only calls
		must = append(must, "iopl", "ioperm", "uselib", "ustat", "sysfs", "_sysctl")
	}
	for _, name := range must {
		if !slices.Contains(names, name) {
			t.Errorf("%s is not denied", name)
		}
	}
	for _, name := range []string{"clone", "ioctl", "fcntl", "socket", "personality", "landlock_create_ruleset", "seccomp"} {
		if slices.Contains(names, name) {
			t.Errorf("%s must not be denied outright", name)
		}
	}
}

func TestClone(t *testing.T) {
	f := newFilterVM(t)
	const sigchld = uint64(unix.SIGCHLD)
	allowed := map[string]uint64{
		"fork (glibc)":      unix.CLONE_CHILD_SETTID | unix.CLONE_CHILD_CLEARTID | sigchld,
		"plain SIGCHLD":     sigchld,
		"vfork/posix_spawn": unix.CLONE_VM | unix.CLONE_VFORK | sigchld,
		"pthread": unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND |
			unix.CLONE_THREAD | unix.CLONE_SYSVSEM | unix.CLONE_SETTLS |
			unix.CLONE_PARENT_SETTID | unix.CLONE_CHILD_CLEARTID,
		"go runtime thread": unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES |
			unix.CLONE_SIGHAND | unix.CLONE_SYSVSEM | unix.CLONE_THREAD,
		"go os/exec with pidfd": unix.CLONE_VM | unix.CLONE_VFORK | unix.CLONE_PIDFD | sigchld,
		// int flags with bit 31 set, sign-extended into the high word; the
		// kernel ignores the high word, so must the filter.
		"CLONE_IO sign-extended": 0xffffffff_00000000 | unix.CLONE_IO | sigchld,
	}
	for name, flags := range allowed {
		expect(t, name, f.call(t, native.clone, flags), retAllow)
	}
	for _, ns := range []uint64{
		unix.CLONE_NEWUSER, unix.CLONE_NEWNS, unix.CLONE_NEWPID, unix.CLONE_NEWNET,
		unix.CLONE_NEWIPC, unix.CLONE_NEWUTS, unix.CLONE_NEWCGROUP, unix.CLONE_NEWTIME,
	} {
		expect(t, fmt.Sprintf("clone(%#x|SIGCHLD)", ns), f.call(t, native.clone, ns|sigchld), retEPERM)
		expect(t, fmt.Sprintf("clone(%#x) as a thread", ns),
			f.call(t, native.clone, ns|unix.CLONE_VM|unix.CLONE_THREAD|unix.CLONE_SIGHAND), retEPERM)
		// Garbage in the high word must not hide the flag.
		expect(t, fmt.Sprintf("clone(%#x) with high bits", ns),
			f.call(t, native.clone, 0xdeadbeef_00000000|ns|sigchld), retEPERM)
	}
	// Only args[0] holds flags; namespace bits elsewhere are a stack pointer
	// or a TID pointer and mean nothing.
	expect(t, "ns bits in args[1]", f.call(t, native.clone, sigchld, unix.CLONE_NEWUSER), retAllow)

	expect(t, "clone3", f.call(t, native.clone3, 0x7ffc0000, 88), retENOSYS)
}

func TestIoctl(t *testing.T) {
	f := newFilterVM(t)
	expect(t, "TIOCSTI", f.call(t, native.ioctl, 0, unix.TIOCSTI, 0x7ffc0000), retEPERM)
	expect(t, "TIOCLINUX", f.call(t, native.ioctl, 0, unix.TIOCLINUX, 0x7ffc0000), retEPERM)
	// The kernel takes cmd as unsigned int, so this is TIOCSTI to it.
	expect(t, "TIOCSTI with high bits", f.call(t, native.ioctl, 0, 1<<32|unix.TIOCSTI), retEPERM)
	expect(t, "TCGETS", f.call(t, native.ioctl, 0, unix.TCGETS, 0x7ffc0000), retAllow)
	expect(t, "F_NOTIFY", f.call(t, native.fcntl, 3, unix.F_NOTIFY, 0x80000000), retEPERM)
	expect(t, "F_GETFL", f.call(t, native.fcntl, 3, unix.F_GETFL), retAllow)
	expect(t, "F_SETLK", f.call(t, native.fcntl, 3, unix.F_SETLK, 0x7ffc0000), retAllow)
	expect(t, "FIONREAD (TIOCINQ)", f.call(t, native.ioctl, 5, unix.TIOCINQ, 0x7ffc0000), retAllow)
	// TIOCSTI's value as the fd or the pointer is harmless.
	expect(t, "TIOCSTI in args[0]", f.call(t, native.ioctl, unix.TIOCSTI, unix.TCGETS), retAllow)
}

func TestSocket(t *testing.T) {
	f := newFilterVM(t)
	for _, fam := range []uint64{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6, unix.AF_NETLINK} {
		expect(t, fmt.Sprintf("socket(%d)", fam), f.call(t, native.socket, fam, unix.SOCK_STREAM, 0), retAllow)
	}
	expect(t, "socket(AF_VSOCK)", f.call(t, native.socket, unix.AF_VSOCK, unix.SOCK_STREAM, 0), retEPERM)
	expect(t, "socket(AF_VSOCK) with high bits", f.call(t, native.socket, 1<<40|unix.AF_VSOCK, unix.SOCK_STREAM, 0), retEPERM)
}

func TestPersonality(t *testing.T) {
	f := newFilterVM(t)
	for _, p := range []uint64{0, 8, 0x20000, 0x20008, 0xffffffff} {
		expect(t, fmt.Sprintf("personality(%#x)", p), f.call(t, native.personality, p), retAllow)
	}
	for _, p := range []uint64{
		0x0040000, // ADDR_NO_RANDOMIZE
		0x0400000, // READ_IMPLIES_EXEC
		0x0040008,
	} {
		expect(t, fmt.Sprintf("personality(%#x)", p), f.call(t, native.personality, p), retEPERM)
	}
}

func TestForeignArch(t *testing.T) {
	f := newFilterVM(t)
	for _, arch := range []uint32{
		unix.AUDIT_ARCH_I386, unix.AUDIT_ARCH_X86_64, unix.AUDIT_ARCH_ARM,
		unix.AUDIT_ARCH_AARCH64, unix.AUDIT_ARCH_RISCV64, 0,
	} {
		if arch == native.audit {
			continue
		}
		// Even a call that is allowed natively: numbers differ between ABIs.
		expect(t, fmt.Sprintf("read on arch %#x", arch), f.run(t, seccompData(arch, unix.SYS_READ)), retKill)
		expect(t, fmt.Sprintf("nr 0 on arch %#x", arch), f.run(t, seccompData(arch, 0)), retKill)
	}
}

func TestX32(t *testing.T) {
	f := newFilterVM(t)
	if !native.x32 {
		// No x32 ABI here: the bit is just part of an unknown number.
		expect(t, "nr with bit 30", f.call(t, x32Bit|unix.SYS_READ), retAllow)
		return
	}
	// x32 read (0), x32 getpid (39) and an x32-only number (512, rt_sigaction).
	for _, nr := range []uint32{x32Bit, x32Bit | 39, x32Bit | 512, 0x7fffffff} {
		expect(t, fmt.Sprintf("nr %#x", nr), f.call(t, nr), retKill)
	}
	expect(t, "nr -1", f.call(t, 0xffffffff), retAllow)
}

// linearProgram is the filter as it was before its rules were reached by
// a binary search: every rule in turn, after the same prelude. The search
// must decide every call exactly as it does.
func linearProgram(p Profile) []bpf.Instruction {
	prog := prelude()
	for name, nr := range native.denied {
		if p == Zygote && zygoteAllowed[name] {
			continue
		}
		prog = append(prog,
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: nr, SkipFalse: 1},
			bpf.RetConstant{Val: retEPERM},
		)
	}
	prog = append(prog,
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: native.clone3, SkipFalse: 1},
		bpf.RetConstant{Val: retENOSYS},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: native.clone, SkipFalse: 4},
		bpf.LoadAbsolute{Off: argLow(0), Size: 4},
		bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: nsFlags, SkipFalse: 1},
		bpf.RetConstant{Val: retEPERM},
		bpf.RetConstant{Val: retAllow},
	)
	prog = append(prog, argIn(native.ioctl, 1, deniedIoctls, retEPERM, retAllow)...)
	prog = append(prog, argIn(native.fcntl, 1, deniedFcntls, retEPERM, retAllow)...)
	prog = append(prog, argIn(native.socket, 0, deniedSocketFamilies, retEPERM, retAllow)...)
	prog = append(prog, argIn(native.personality, 0, allowedPersonalities, retAllow, retEPERM)...)
	return append(prog, bpf.RetConstant{Val: retAllow})
}

// vmOf assembles insns as the kernel would get them and loads them into
// x/net/bpf's interpreter.
func vmOf(t *testing.T, insns []bpf.Instruction) filterVM {
	t.Helper()
	raw, err := bpf.Assemble(insns)
	if err != nil {
		t.Fatal(err)
	}
	back, ok := bpf.Disassemble(raw)
	if !ok {
		t.Fatal("program does not disassemble")
	}
	vm, err := bpf.NewVM(back)
	if err != nil {
		t.Fatal(err)
	}
	return filterVM{vm}
}

// TestSearchMatchesLinear runs both profiles' filters and the linear
// filter they replaced on every syscall number up to 2048, the x32 and
// other high numbers, a foreign architecture, and arguments around every
// value a rule looks at: every verdict must be the same.
func TestSearchMatchesLinear(t *testing.T) {
	var values []uint64
	for _, list := range [][]uint32{deniedIoctls, deniedFcntls, deniedSocketFamilies, allowedPersonalities} {
		for _, v := range list {
			values = append(values, uint64(v), uint64(v)+1, uint64(v)-1, 1<<32|uint64(v))
		}
	}
	for bit := range 32 {
		if nsFlags&(1<<bit) != 0 {
			values = append(values, 1<<bit, 1<<bit|uint64(unix.SIGCHLD), 0xdeadbeef_00000000|1<<bit)
		}
	}
	values = append(values, 0, 1, uint64(unix.SIGCHLD), 0xffffffff, 0xffffffff_ffffffff)
	argSets := [][]uint64{nil, {1, 2, 3, 4, 5, 6}}
	for _, v := range values {
		argSets = append(argSets, []uint64{v}, []uint64{0, v}, []uint64{v, v, v})
	}
	var nrs []uint32
	for nr := range uint32(2048) {
		nrs = append(nrs, nr)
	}
	for nr := range uint32(1024) {
		nrs = append(nrs, x32Bit|nr)
	}
	nrs = append(nrs, 0x3fffffff, 0x7fffffff, 0x80000000, 0xfffffffe, 0xffffffff)
	for _, p := range []Profile{Strict, Zygote} {
		insns, err := instructions(p)
		if err != nil {
			t.Fatal(err)
		}
		tree, linear := vmOf(t, insns), vmOf(t, linearProgram(p))
		for _, arch := range []uint32{native.audit, unix.AUDIT_ARCH_I386} {
			for _, nr := range nrs {
				for _, args := range argSets {
					data := seccompData(arch, nr, args...)
					if got, want := tree.run(t, data), linear.run(t, data); got != want {
						t.Fatalf("profile %d, arch %#x, nr %d, args %#x: search says %s, the linear filter %s", p, arch, nr, args, verdict(got), verdict(want))
					}
				}
			}
		}
	}
}
