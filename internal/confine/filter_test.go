//go:build linux && amd64

package confine

import (
	"fmt"
	"slices"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// deniedSyscalls must never be allowed, whatever the arguments. It is written
// out independently of the allowlist as the specification to check it against.
var deniedSyscalls = map[string]int{
	"mount": unix.SYS_MOUNT, "umount2": unix.SYS_UMOUNT2, "pivot_root": unix.SYS_PIVOT_ROOT,
	"unshare": unix.SYS_UNSHARE, "setns": unix.SYS_SETNS, "clone3": unix.SYS_CLONE3,
	"keyctl": unix.SYS_KEYCTL, "add_key": unix.SYS_ADD_KEY, "request_key": unix.SYS_REQUEST_KEY,
	"bpf": unix.SYS_BPF, "perf_event_open": unix.SYS_PERF_EVENT_OPEN,
	"io_uring_setup": unix.SYS_IO_URING_SETUP, "io_uring_enter": unix.SYS_IO_URING_ENTER,
	"io_uring_register": unix.SYS_IO_URING_REGISTER, "userfaultfd": unix.SYS_USERFAULTFD,
	"kexec_load": unix.SYS_KEXEC_LOAD, "kexec_file_load": unix.SYS_KEXEC_FILE_LOAD,
	"init_module": unix.SYS_INIT_MODULE, "finit_module": unix.SYS_FINIT_MODULE,
	"delete_module": unix.SYS_DELETE_MODULE, "create_module": unix.SYS_CREATE_MODULE,
	"get_kernel_syms": unix.SYS_GET_KERNEL_SYMS, "query_module": unix.SYS_QUERY_MODULE,
	"open_by_handle_at": unix.SYS_OPEN_BY_HANDLE_AT, "name_to_handle_at": unix.SYS_NAME_TO_HANDLE_AT,
	"fsopen": unix.SYS_FSOPEN, "fsmount": unix.SYS_FSMOUNT, "fsconfig": unix.SYS_FSCONFIG,
	"fspick": unix.SYS_FSPICK, "move_mount": unix.SYS_MOVE_MOUNT, "open_tree": unix.SYS_OPEN_TREE,
	"open_tree_attr": unix.SYS_OPEN_TREE_ATTR, "mount_setattr": unix.SYS_MOUNT_SETATTR,
	"statmount": unix.SYS_STATMOUNT, "listmount": unix.SYS_LISTMOUNT, "listns": unix.SYS_LISTNS,
	"swapon": unix.SYS_SWAPON, "swapoff": unix.SYS_SWAPOFF, "reboot": unix.SYS_REBOOT,
	"syslog": unix.SYS_SYSLOG, "acct": unix.SYS_ACCT, "settimeofday": unix.SYS_SETTIMEOFDAY,
	"clock_settime": unix.SYS_CLOCK_SETTIME, "adjtimex": unix.SYS_ADJTIMEX,
	"clock_adjtime": unix.SYS_CLOCK_ADJTIME, "quotactl": unix.SYS_QUOTACTL,
	"quotactl_fd": unix.SYS_QUOTACTL_FD, "lookup_dcookie": unix.SYS_LOOKUP_DCOOKIE,
	"iopl": unix.SYS_IOPL, "ioperm": unix.SYS_IOPERM, "nfsservctl": unix.SYS_NFSSERVCTL,
	"uselib": unix.SYS_USELIB, "_sysctl": unix.SYS__SYSCTL, "ustat": unix.SYS_USTAT,
	"sysfs": unix.SYS_SYSFS, "kcmp": unix.SYS_KCMP, "process_vm_readv": unix.SYS_PROCESS_VM_READV,
	"process_vm_writev": unix.SYS_PROCESS_VM_WRITEV, "pidfd_getfd": unix.SYS_PIDFD_GETFD,
	"process_madvise": unix.SYS_PROCESS_MADVISE, "fanotify_init": unix.SYS_FANOTIFY_INIT,
	"sethostname": unix.SYS_SETHOSTNAME, "setdomainname": unix.SYS_SETDOMAINNAME,
	"vhangup": unix.SYS_VHANGUP, "mbind": unix.SYS_MBIND, "set_mempolicy": unix.SYS_SET_MEMPOLICY,
	"get_mempolicy": unix.SYS_GET_MEMPOLICY, "migrate_pages": unix.SYS_MIGRATE_PAGES,
	"move_pages": unix.SYS_MOVE_PAGES, "set_mempolicy_home_node": unix.SYS_SET_MEMPOLICY_HOME_NODE,
	"lsm_set_self_attr": unix.SYS_LSM_SET_SELF_ATTR, "afs_syscall": unix.SYS_AFS_SYSCALL,
	"tuxcall": unix.SYS_TUXCALL, "security": unix.SYS_SECURITY, "vserver": unix.SYS_VSERVER,
	"getpmsg": unix.SYS_GETPMSG, "putpmsg": unix.SYS_PUTPMSG, "uretprobe": unix.SYS_URETPROBE,
}

// goRuntimeSyscalls are made by the Go runtime and syscall.ForkExec on the
// launcher thread, and by the dynamic loader and libc of the programs it
// starts; they must stay allowed for any arguments those use.
var goRuntimeSyscalls = map[string]int{
	"read": unix.SYS_READ, "write": unix.SYS_WRITE, "openat": unix.SYS_OPENAT, "close": unix.SYS_CLOSE,
	"mmap": unix.SYS_MMAP, "munmap": unix.SYS_MUNMAP, "mprotect": unix.SYS_MPROTECT,
	"madvise": unix.SYS_MADVISE, "brk": unix.SYS_BRK, "futex": unix.SYS_FUTEX,
	"rt_sigaction": unix.SYS_RT_SIGACTION, "rt_sigprocmask": unix.SYS_RT_SIGPROCMASK,
	"rt_sigreturn": unix.SYS_RT_SIGRETURN, "sigaltstack": unix.SYS_SIGALTSTACK,
	"sched_yield": unix.SYS_SCHED_YIELD, "sched_getaffinity": unix.SYS_SCHED_GETAFFINITY,
	"gettid": unix.SYS_GETTID, "getpid": unix.SYS_GETPID, "tgkill": unix.SYS_TGKILL,
	"exit": unix.SYS_EXIT, "exit_group": unix.SYS_EXIT_GROUP, "nanosleep": unix.SYS_NANOSLEEP,
	"clock_gettime": unix.SYS_CLOCK_GETTIME, "epoll_create1": unix.SYS_EPOLL_CREATE1,
	"epoll_ctl": unix.SYS_EPOLL_CTL, "epoll_pwait": unix.SYS_EPOLL_PWAIT,
	"eventfd2": unix.SYS_EVENTFD2, "pipe2": unix.SYS_PIPE2, "dup3": unix.SYS_DUP3,
	"fcntl": unix.SYS_FCNTL, "getrandom": unix.SYS_GETRANDOM, "prlimit64": unix.SYS_PRLIMIT64,
	"execve": unix.SYS_EXECVE, "wait4": unix.SYS_WAIT4, "waitid": unix.SYS_WAITID,
	"prctl": unix.SYS_PRCTL, "arch_prctl": unix.SYS_ARCH_PRCTL, "set_tid_address": unix.SYS_SET_TID_ADDRESS,
	"set_robust_list": unix.SYS_SET_ROBUST_LIST, "rseq": unix.SYS_RSEQ, "newfstatat": unix.SYS_NEWFSTATAT,
	"fstat": unix.SYS_FSTAT, "pread64": unix.SYS_PREAD64, "setpgid": unix.SYS_SETPGID,
	"setsid": unix.SYS_SETSID, "ioctl": unix.SYS_IOCTL, "chdir": unix.SYS_CHDIR,
	"setresuid": unix.SYS_SETRESUID, "setresgid": unix.SYS_SETRESGID, "setgroups": unix.SYS_SETGROUPS,
	"kill": unix.SYS_KILL, "getppid": unix.SYS_GETPPID, "pidfd_open": unix.SYS_PIDFD_OPEN,
	"pidfd_send_signal": unix.SYS_PIDFD_SEND_SIGNAL, "timer_create": unix.SYS_TIMER_CREATE,
	"timer_settime": unix.SYS_TIMER_SETTIME, "timer_delete": unix.SYS_TIMER_DELETE,
	"getdents64": unix.SYS_GETDENTS64, "lseek": unix.SYS_LSEEK, "uname": unix.SYS_UNAME,
	"ptrace": unix.SYS_PTRACE, "chroot": unix.SYS_CHROOT, "capget": unix.SYS_CAPGET,
	"statx": unix.SYS_STATX, "faccessat2": unix.SYS_FACCESSAT2, "fchmodat2": unix.SYS_FCHMODAT2,
	"close_range": unix.SYS_CLOSE_RANGE, "membarrier": unix.SYS_MEMBARRIER,
}

var filterOnce = sync.OnceValues(Filter)

func mustFilter(t testing.TB) []unix.SockFilter {
	t.Helper()
	prog, err := filterOnce()
	if err != nil {
		t.Fatalf("Filter: %v", err)
	}
	return prog
}

func eval(t testing.TB, prog []unix.SockFilter, d seccompData) uint32 {
	t.Helper()
	r, err := runBPF(prog, d.bytes())
	if err != nil {
		t.Fatalf("running filter on %+v: %v", d, err)
	}
	return r
}

func x86(nr int, args ...uint64) seccompData {
	d := seccompData{nr: uint32(nr), arch: unix.AUDIT_ARCH_X86_64, ip: 0x401000}
	copy(d.args[:], args)
	return d
}

func actionName(r uint32) string {
	switch {
	case r == retAllow:
		return "ALLOW"
	case r == retKillProcess:
		return "KILL_PROCESS"
	case r&unix.SECCOMP_RET_ACTION_FULL == unix.SECCOMP_RET_ERRNO:
		return fmt.Sprintf("ERRNO(%s)", unix.ErrnoName(unix.Errno(r&unix.SECCOMP_RET_DATA)))
	}
	return fmt.Sprintf("%#x", r)
}

// reference is the filter's specification written as plain Go; the fuzz test
// checks the compiled BPF against it.
func reference(d seccompData, allowed map[int]bool) uint32 {
	if d.arch != unix.AUDIT_ARCH_X86_64 {
		return retKillProcess
	}
	if d.nr&0x40000000 != 0 {
		return retEPERM
	}
	if d.nr > maxKnownSyscall {
		return retENOSYS
	}
	lo, hi := uint32(d.args[0]), uint32(d.args[0]>>32)
	switch int(d.nr) {
	case unix.SYS_CLONE:
		if lo&0x7E020000 != 0 {
			return retEPERM
		}
		return retAllow
	case unix.SYS_CLONE3:
		return retENOSYS
	case unix.SYS_SOCKET:
		if lo == 40 {
			return retEPERM
		}
		return retAllow
	case unix.SYS_PERSONALITY:
		if hi == 0 && slices.Contains([]uint32{0, 8, 0x20000, 0x20008, 0xffffffff}, lo) {
			return retAllow
		}
		return retEPERM
	}
	if allowed[int(d.nr)] {
		return retAllow
	}
	return retEPERM
}

func allowedSet() map[int]bool {
	m := map[int]bool{}
	for _, nr := range AllowedSyscalls() {
		m[nr] = true
	}
	return m
}

func TestFilterShape(t *testing.T) {
	prog := mustFilter(t)
	if len(prog) == 0 || len(prog) > bpfMaxInsns {
		t.Fatalf("program length %d outside 1..%d", len(prog), bpfMaxInsns)
	}
	// The kernel (bpf_check_classic) rejects a program whose last
	// instruction is not a return and jumps that leave the program.
	if last := prog[len(prog)-1]; last.Code != unix.BPF_RET|unix.BPF_K {
		t.Errorf("last instruction %+v is not BPF_RET|BPF_K", last)
	}
	for pc, ins := range prog {
		if ins.Code&0x07 != unix.BPF_JMP {
			continue
		}
		targets := []int{pc + 1 + int(ins.Jt), pc + 1 + int(ins.Jf)}
		if ins.Code == unix.BPF_JMP|unix.BPF_JA {
			targets = []int{pc + 1 + int(ins.K)}
		}
		for _, tg := range targets {
			if tg >= len(prog) {
				t.Errorf("instruction %d %+v jumps to %d, past the end (%d)", pc, ins, tg, len(prog))
			}
		}
	}
	allowed := AllowedSyscalls()
	t.Logf("filter: %d BPF instructions, %d syscalls allowed unconditionally, %d conditionally (clone, socket, personality)",
		len(prog), len(allowed), 3)
	if len(allowed) < 250 {
		t.Errorf("only %d syscalls allowed; the allowlist looks truncated", len(allowed))
	}
}

func TestFilterDecisions(t *testing.T) {
	prog := mustFilter(t)
	const (
		sigchld  = uint64(unix.SIGCHLD)
		goThread = uint64(unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND |
			unix.CLONE_SYSVSEM | unix.CLONE_THREAD)
		forkExec = uint64(unix.CLONE_VFORK|unix.CLONE_VM|unix.CLONE_PIDFD) | sigchld
	)
	cases := []struct {
		name string
		in   seccompData
		want uint32
	}{
		{"read", x86(unix.SYS_READ, 0, 0, 0), retAllow},
		{"openat", x86(unix.SYS_OPENAT), retAllow},
		{"execve", x86(unix.SYS_EXECVE), retAllow},
		{"mseal", x86(unix.SYS_MSEAL), retAllow},
		{"file_setattr", x86(unix.SYS_FILE_SETATTR), retAllow},
		{"number 0", x86(0), retAllow},
		{"mount", x86(unix.SYS_MOUNT), retEPERM},
		{"bpf", x86(unix.SYS_BPF), retEPERM},
		{"io_uring_setup", x86(unix.SYS_IO_URING_SETUP, 8, 0), retEPERM},
		{"unassigned 400", x86(400), retEPERM},
		{"beyond newest syscall", x86(maxKnownSyscall + 1), retENOSYS},
		{"huge number", x86(0x3fffffff), retENOSYS},
		{"i386 arch", seccompData{nr: unix.SYS_READ, arch: unix.AUDIT_ARCH_I386}, retKillProcess},
		{"i386 mount", seccompData{nr: 21, arch: unix.AUDIT_ARCH_I386}, retKillProcess},
		{"aarch64 arch", seccompData{nr: unix.SYS_READ, arch: unix.AUDIT_ARCH_AARCH64}, retKillProcess},
		{"zero arch", seccompData{nr: unix.SYS_READ}, retKillProcess},
		{"x32 read", x86(0x40000000 | unix.SYS_READ), retEPERM},
		{"x32 mount", x86(0x40000000 | unix.SYS_MOUNT), retEPERM},
		{"negative nr", x86(-1), retEPERM},
		{"clone fork", x86(unix.SYS_CLONE, sigchld), retAllow},
		{"clone go thread", x86(unix.SYS_CLONE, goThread), retAllow},
		{"clone forkexec pidfd", x86(unix.SYS_CLONE, forkExec), retAllow},
		{"clone high bits only", x86(unix.SYS_CLONE, 1<<32|sigchld), retAllow},
		{"clone newns", x86(unix.SYS_CLONE, unix.CLONE_NEWNS|sigchld), retEPERM},
		{"clone newuser", x86(unix.SYS_CLONE, unix.CLONE_NEWUSER|sigchld), retEPERM},
		{"clone newpid", x86(unix.SYS_CLONE, unix.CLONE_NEWPID), retEPERM},
		{"clone newnet", x86(unix.SYS_CLONE, unix.CLONE_NEWNET), retEPERM},
		{"clone newuts", x86(unix.SYS_CLONE, unix.CLONE_NEWUTS), retEPERM},
		{"clone newipc", x86(unix.SYS_CLONE, unix.CLONE_NEWIPC), retEPERM},
		{"clone newcgroup", x86(unix.SYS_CLONE, unix.CLONE_NEWCGROUP), retEPERM},
		{"clone newns with high bits", x86(unix.SYS_CLONE, 0xffffffff00000000|unix.CLONE_NEWNS), retEPERM},
		{"clone flags in arg1 ignored", x86(unix.SYS_CLONE, sigchld, unix.CLONE_NEWUSER), retAllow},
		{"clone3", x86(unix.SYS_CLONE3, 0, 88), retENOSYS},
		{"socket inet", x86(unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_STREAM), retAllow},
		{"socket unix", x86(unix.SYS_SOCKET, unix.AF_UNIX, unix.SOCK_DGRAM), retAllow},
		{"socket netlink", x86(unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_RAW), retAllow},
		{"socket vsock", x86(unix.SYS_SOCKET, unix.AF_VSOCK, unix.SOCK_STREAM), retEPERM},
		{"socket vsock high garbage", x86(unix.SYS_SOCKET, 1<<40|unix.AF_VSOCK), retEPERM},
		{"personality 0", x86(unix.SYS_PERSONALITY, 0), retAllow},
		{"personality linux32", x86(unix.SYS_PERSONALITY, 8), retAllow},
		{"personality uname26", x86(unix.SYS_PERSONALITY, 0x20000), retAllow},
		{"personality uname26|linux32", x86(unix.SYS_PERSONALITY, 0x20008), retAllow},
		{"personality query", x86(unix.SYS_PERSONALITY, 0xffffffff), retAllow},
		{"personality addr_no_randomize", x86(unix.SYS_PERSONALITY, 0x40000), retEPERM},
		{"personality read_implies_exec", x86(unix.SYS_PERSONALITY, 0x400000), retEPERM},
		{"personality 0 with high bits", x86(unix.SYS_PERSONALITY, 1<<32), retEPERM},
		{"personality -1 as 64-bit", x86(unix.SYS_PERSONALITY, ^uint64(0)), retEPERM},
	}
	for _, c := range cases {
		if got := eval(t, prog, c.in); got != c.want {
			t.Errorf("%s: nr=%d arch=%#x args=%#x: got %s, want %s",
				c.name, int32(c.in.nr), c.in.arch, c.in.args, actionName(got), actionName(c.want))
		}
	}
}

func TestFilterDeniesDenyList(t *testing.T) {
	prog := mustFilter(t)
	allowed := allowedSet()
	argSets := [][]uint64{{}, {0xffffffffffffffff, 1, 2}, {unix.AF_INET, uint64(unix.SIGCHLD)}}
	for name, nr := range deniedSyscalls {
		if allowed[nr] {
			t.Errorf("%s (%d) is in AllowedSyscalls", name, nr)
		}
		want := retEPERM
		if nr == unix.SYS_CLONE3 {
			want = retENOSYS
		}
		for _, args := range argSets {
			if got := eval(t, prog, x86(nr, args...)); got != want {
				t.Errorf("%s (%d) args %#x: got %s, want %s", name, nr, args, actionName(got), actionName(want))
			}
		}
	}
}

func TestFilterAllowsRuntimeSyscalls(t *testing.T) {
	prog := mustFilter(t)
	for name, nr := range goRuntimeSyscalls {
		if got := eval(t, prog, x86(nr, 3, 0, 0)); got != retAllow {
			t.Errorf("%s (%d): got %s, want ALLOW", name, nr, actionName(got))
		}
	}
	for _, nr := range AllowedSyscalls() {
		if got := eval(t, prog, x86(nr, 0x1234)); got != retAllow {
			t.Errorf("allowlisted %d: got %s, want ALLOW", nr, actionName(got))
		}
	}
}

// TestFilterMatchesReferenceEverywhere evaluates every syscall number the
// filter distinguishes, with a few argument patterns, against reference.
func TestFilterMatchesReferenceEverywhere(t *testing.T) {
	prog := mustFilter(t)
	allowed := allowedSet()
	argSets := [][]uint64{{0}, {unix.CLONE_NEWNS}, {40}, {0x40000}, {0xffffffff}}
	for nr := 0; nr <= maxKnownSyscall+8; nr++ {
		for _, args := range argSets {
			d := x86(nr, args...)
			if got, want := eval(t, prog, d), reference(d, allowed); got != want {
				t.Errorf("nr %d args %#x: got %s, reference %s", nr, args, actionName(got), actionName(want))
			}
		}
	}
}

// TestSearchRangesLongJumps checks the BPF_JA trampolines the search tree uses
// when a subtree is longer than a conditional jump can skip.
func TestSearchRangesLongJumps(t *testing.T) {
	var nrs []int
	for i := 0; i < 600; i++ {
		nrs = append(nrs, 3*i) // no two adjacent: 600 separate ranges
	}
	var b builder
	b.stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offNr)
	b.append(searchRanges(toRanges(nrs)))
	if b.err != nil {
		t.Fatal(b.err)
	}
	hasJA := false
	for _, ins := range b.prog {
		if ins.Code == unix.BPF_JMP|unix.BPF_JA {
			hasJA = true
		}
	}
	if !hasJA {
		t.Errorf("a %d-instruction tree used no BPF_JA", len(b.prog))
	}
	for nr := 0; nr < 1810; nr++ {
		want := retEPERM
		if nr%3 == 0 && nr < 1800 {
			want = retAllow
		}
		if got := eval(t, b.prog, x86(nr)); got != want {
			t.Fatalf("nr %d: got %s, want %s", nr, actionName(got), actionName(want))
		}
	}
}

func TestToRanges(t *testing.T) {
	got := toRanges([]int{0, 1, 2, 5, 7, 8, 10})
	want := []span{{0, 2}, {5, 5}, {7, 8}, {10, 10}}
	if !slices.Equal(got, want) {
		t.Errorf("toRanges = %v, want %v", got, want)
	}
}

func FuzzFilter(f *testing.F) {
	prog, err := Filter()
	if err != nil {
		f.Fatal(err)
	}
	allowed := allowedSet()
	denied := map[uint32]bool{}
	for _, nr := range deniedSyscalls {
		denied[uint32(nr)] = true
	}
	f.Add(uint32(unix.SYS_READ), uint32(unix.AUDIT_ARCH_X86_64), uint64(0), uint64(0), uint64(0))
	f.Add(uint32(unix.SYS_CLONE), uint32(unix.AUDIT_ARCH_X86_64), uint64(unix.CLONE_NEWUSER), uint64(0), uint64(0))
	f.Add(uint32(unix.SYS_SOCKET), uint32(unix.AUDIT_ARCH_X86_64), uint64(40), uint64(1), uint64(0))
	f.Add(uint32(unix.SYS_PERSONALITY), uint32(unix.AUDIT_ARCH_X86_64), uint64(0xffffffff), uint64(0), uint64(0))
	f.Add(uint32(unix.SYS_MOUNT), uint32(unix.AUDIT_ARCH_I386), uint64(0), uint64(0), uint64(0))
	f.Add(uint32(0x40000000|unix.SYS_READ), uint32(unix.AUDIT_ARCH_X86_64), uint64(0), uint64(0), uint64(0))
	f.Fuzz(func(t *testing.T, nr, arch uint32, a0, a1, a2 uint64) {
		d := seccompData{nr: nr, arch: arch, args: [6]uint64{a0, a1, a2, a0 ^ a1, a1 ^ a2, a2 ^ a0}}
		got, err := runBPF(prog, d.bytes())
		if err != nil {
			t.Fatalf("%+v: %v", d, err)
		}
		if arch != unix.AUDIT_ARCH_X86_64 && got != retKillProcess {
			t.Fatalf("foreign arch %#x nr %d: got %s, want KILL_PROCESS", arch, nr, actionName(got))
		}
		if got == retAllow && denied[nr] {
			t.Fatalf("denied syscall %d allowed with args %#x", nr, d.args)
		}
		if got == retAllow && nr&0x40000000 != 0 {
			t.Fatalf("x32 syscall %#x allowed", nr)
		}
		if got == retAllow && nr == unix.SYS_CLONE && uint32(a0)&cloneNamespaceFlags != 0 {
			t.Fatalf("clone with namespace flags %#x allowed", a0)
		}
		if got == retAllow && nr == unix.SYS_SOCKET && uint32(a0) == unix.AF_VSOCK {
			t.Fatalf("AF_VSOCK socket allowed (arg0 %#x)", a0)
		}
		switch got {
		case retAllow, retKillProcess, retEPERM, retENOSYS:
		default:
			t.Fatalf("unexpected action %#x", got)
		}
		if want := reference(d, allowed); got != want {
			t.Fatalf("nr %d arch %#x args %#x: got %s, reference %s", nr, arch, d.args, actionName(got), actionName(want))
		}
	})
}
