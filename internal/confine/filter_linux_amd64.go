//go:build linux && amd64

package confine

import (
	"fmt"
	"slices"

	"golang.org/x/sys/unix"
)

// Return values of the filter.
const (
	retAllow       = unix.SECCOMP_RET_ALLOW
	retKillProcess = unix.SECCOMP_RET_KILL_PROCESS
	retEPERM       = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	retENOSYS      = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
)

// Offsets into struct seccomp_data (little-endian).
const (
	offNr       = 0
	offArch     = 4
	offArg0Low  = 16
	offArg0High = 20
)

const (
	// x32ABIBit marks x32 syscalls, which reach the same kernel entry points
	// under different numbers and would otherwise evade the allowlist.
	x32ABIBit = 0x40000000

	// maxKnownSyscall is the newest x86_64 syscall this allowlist was
	// reviewed against. Numbers above it get ENOSYS instead of EPERM, so a
	// libc built for a newer kernel falls back to the older syscall as it
	// does on an older kernel (the faccessat2/glibc 2.33 breakage).
	maxKnownSyscall = unix.SYS_RSEQ_SLICE_YIELD

	// cloneNamespaceFlags is CLONE_NEWNS|CLONE_NEWCGROUP|CLONE_NEWUTS|
	// CLONE_NEWIPC|CLONE_NEWUSER|CLONE_NEWPID|CLONE_NEWNET, Docker's mask.
	cloneNamespaceFlags = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS |
		unix.CLONE_NEWIPC | unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET

	afVsock = unix.AF_VSOCK

	// bpfMaxInsns is BPF_MAXINSNS, the kernel's limit on a classic BPF program.
	bpfMaxInsns = 4096
)

// personalityAllowed are the personality(2) arguments Docker allows. Others,
// such as ADDR_NO_RANDOMIZE (0x40000) or READ_IMPLIES_EXEC, weaken exploit
// mitigations for the children and are refused.
var personalityAllowed = []uint32{
	0x0,        // PER_LINUX
	0x8,        // PER_LINUX32
	0x20000,    // UNAME26
	0x20008,    // UNAME26|PER_LINUX32
	0xffffffff, // query the current persona
}

// allowedSyscalls are allowed whatever their arguments. It is Docker's
// default x86_64 allowlist for a container without CAP_SYS_ADMIN,
// CAP_SYS_PTRACE, CAP_SYS_TIME, CAP_SYS_NICE, CAP_SYS_BOOT, ..., minus
// adjtimex, clock_adjtime, name_to_handle_at and io_uring_*, plus ptrace
// (Docker allows it on kernels >= 4.8), chroot (Docker allows it with
// CAP_SYS_CHROOT, which Default keeps) and syscalls newer than Docker's list
// that only do what already allowed syscalls do.
var allowedSyscalls = []int{
	// files and directories
	unix.SYS_READ, unix.SYS_WRITE, unix.SYS_OPEN, unix.SYS_CLOSE, unix.SYS_STAT,
	unix.SYS_FSTAT, unix.SYS_LSTAT, unix.SYS_POLL, unix.SYS_LSEEK,
	unix.SYS_PREAD64, unix.SYS_PWRITE64, unix.SYS_READV, unix.SYS_WRITEV,
	unix.SYS_ACCESS, unix.SYS_PIPE, unix.SYS_SELECT, unix.SYS_DUP, unix.SYS_DUP2,
	unix.SYS_FCNTL, unix.SYS_FLOCK, unix.SYS_FSYNC, unix.SYS_FDATASYNC,
	unix.SYS_TRUNCATE, unix.SYS_FTRUNCATE, unix.SYS_GETDENTS, unix.SYS_GETCWD,
	unix.SYS_CHDIR, unix.SYS_FCHDIR, unix.SYS_RENAME, unix.SYS_MKDIR,
	unix.SYS_RMDIR, unix.SYS_CREAT, unix.SYS_LINK, unix.SYS_UNLINK,
	unix.SYS_SYMLINK, unix.SYS_READLINK, unix.SYS_CHMOD, unix.SYS_FCHMOD,
	unix.SYS_CHOWN, unix.SYS_FCHOWN, unix.SYS_LCHOWN, unix.SYS_UMASK,
	unix.SYS_UTIME, unix.SYS_MKNOD, unix.SYS_STATFS, unix.SYS_FSTATFS,
	unix.SYS_CHROOT, unix.SYS_SYNC, unix.SYS_READAHEAD,
	unix.SYS_SETXATTR, unix.SYS_LSETXATTR, unix.SYS_FSETXATTR,
	unix.SYS_GETXATTR, unix.SYS_LGETXATTR, unix.SYS_FGETXATTR,
	unix.SYS_LISTXATTR, unix.SYS_LLISTXATTR, unix.SYS_FLISTXATTR,
	unix.SYS_REMOVEXATTR, unix.SYS_LREMOVEXATTR, unix.SYS_FREMOVEXATTR,
	unix.SYS_GETDENTS64, unix.SYS_FADVISE64, unix.SYS_UTIMES,
	unix.SYS_OPENAT, unix.SYS_MKDIRAT, unix.SYS_MKNODAT, unix.SYS_FCHOWNAT,
	unix.SYS_FUTIMESAT, unix.SYS_NEWFSTATAT, unix.SYS_UNLINKAT,
	unix.SYS_RENAMEAT, unix.SYS_LINKAT, unix.SYS_SYMLINKAT,
	unix.SYS_READLINKAT, unix.SYS_FCHMODAT, unix.SYS_FACCESSAT,
	unix.SYS_PSELECT6, unix.SYS_PPOLL, unix.SYS_SPLICE, unix.SYS_TEE,
	unix.SYS_SYNC_FILE_RANGE, unix.SYS_VMSPLICE, unix.SYS_UTIMENSAT,
	unix.SYS_FALLOCATE, unix.SYS_DUP3, unix.SYS_PIPE2, unix.SYS_PREADV,
	unix.SYS_PWRITEV, unix.SYS_SYNCFS, unix.SYS_RENAMEAT2,
	unix.SYS_COPY_FILE_RANGE, unix.SYS_PREADV2, unix.SYS_PWRITEV2,
	unix.SYS_STATX, unix.SYS_CLOSE_RANGE, unix.SYS_OPENAT2,
	unix.SYS_FACCESSAT2, unix.SYS_FCHMODAT2, unix.SYS_CACHESTAT,
	unix.SYS_SETXATTRAT, unix.SYS_GETXATTRAT, unix.SYS_LISTXATTRAT,
	unix.SYS_REMOVEXATTRAT, unix.SYS_FILE_GETATTR, unix.SYS_FILE_SETATTR,
	unix.SYS_IOCTL, unix.SYS_SENDFILE,
	unix.SYS_INOTIFY_INIT, unix.SYS_INOTIFY_ADD_WATCH, unix.SYS_INOTIFY_RM_WATCH,
	unix.SYS_INOTIFY_INIT1, unix.SYS_FANOTIFY_MARK,

	// asynchronous I/O (io_uring is deliberately absent)
	unix.SYS_IO_SETUP, unix.SYS_IO_DESTROY, unix.SYS_IO_GETEVENTS,
	unix.SYS_IO_SUBMIT, unix.SYS_IO_CANCEL, unix.SYS_IO_PGETEVENTS,
	unix.SYS_IOPRIO_SET, unix.SYS_IOPRIO_GET,

	// event notification
	unix.SYS_EPOLL_CREATE, unix.SYS_EPOLL_CTL_OLD, unix.SYS_EPOLL_WAIT_OLD,
	unix.SYS_EPOLL_WAIT, unix.SYS_EPOLL_CTL, unix.SYS_EPOLL_PWAIT,
	unix.SYS_EPOLL_CREATE1, unix.SYS_EPOLL_PWAIT2, unix.SYS_SIGNALFD,
	unix.SYS_TIMERFD_CREATE, unix.SYS_EVENTFD, unix.SYS_TIMERFD_SETTIME,
	unix.SYS_TIMERFD_GETTIME, unix.SYS_SIGNALFD4, unix.SYS_EVENTFD2,

	// memory
	unix.SYS_MMAP, unix.SYS_MPROTECT, unix.SYS_MUNMAP, unix.SYS_BRK,
	unix.SYS_MREMAP, unix.SYS_MSYNC, unix.SYS_MINCORE, unix.SYS_MADVISE,
	unix.SYS_MLOCK, unix.SYS_MUNLOCK, unix.SYS_MLOCKALL, unix.SYS_MUNLOCKALL,
	unix.SYS_REMAP_FILE_PAGES, unix.SYS_MLOCK2, unix.SYS_MEMFD_CREATE,
	unix.SYS_MEMBARRIER, unix.SYS_PKEY_MPROTECT, unix.SYS_PKEY_ALLOC,
	unix.SYS_PKEY_FREE, unix.SYS_MEMFD_SECRET, unix.SYS_MAP_SHADOW_STACK,
	unix.SYS_MSEAL,

	// System V and POSIX IPC (scoped by the sandbox's IPC namespace)
	unix.SYS_SHMGET, unix.SYS_SHMAT, unix.SYS_SHMCTL, unix.SYS_SHMDT,
	unix.SYS_SEMGET, unix.SYS_SEMOP, unix.SYS_SEMCTL, unix.SYS_SEMTIMEDOP,
	unix.SYS_MSGGET, unix.SYS_MSGSND, unix.SYS_MSGRCV, unix.SYS_MSGCTL,
	unix.SYS_MQ_OPEN, unix.SYS_MQ_UNLINK, unix.SYS_MQ_TIMEDSEND,
	unix.SYS_MQ_TIMEDRECEIVE, unix.SYS_MQ_NOTIFY, unix.SYS_MQ_GETSETATTR,

	// sockets (socket itself is conditional, see Filter)
	unix.SYS_CONNECT, unix.SYS_ACCEPT, unix.SYS_SENDTO, unix.SYS_RECVFROM,
	unix.SYS_SENDMSG, unix.SYS_RECVMSG, unix.SYS_SHUTDOWN, unix.SYS_BIND,
	unix.SYS_LISTEN, unix.SYS_GETSOCKNAME, unix.SYS_GETPEERNAME,
	unix.SYS_SOCKETPAIR, unix.SYS_SETSOCKOPT, unix.SYS_GETSOCKOPT,
	unix.SYS_ACCEPT4, unix.SYS_RECVMMSG, unix.SYS_SENDMMSG,

	// processes and threads (clone is conditional, clone3 gets ENOSYS)
	unix.SYS_FORK, unix.SYS_VFORK, unix.SYS_EXECVE, unix.SYS_EXECVEAT,
	unix.SYS_EXIT, unix.SYS_EXIT_GROUP, unix.SYS_WAIT4, unix.SYS_WAITID,
	unix.SYS_KILL, unix.SYS_TKILL, unix.SYS_TGKILL, unix.SYS_GETPID,
	unix.SYS_GETPPID, unix.SYS_GETTID, unix.SYS_SET_TID_ADDRESS,
	unix.SYS_SETPGID, unix.SYS_GETPGID, unix.SYS_GETPGRP, unix.SYS_SETSID,
	unix.SYS_GETSID, unix.SYS_PRCTL, unix.SYS_ARCH_PRCTL,
	unix.SYS_MODIFY_LDT, unix.SYS_SET_THREAD_AREA, unix.SYS_GET_THREAD_AREA,
	unix.SYS_SET_ROBUST_LIST, unix.SYS_GET_ROBUST_LIST, unix.SYS_RSEQ,
	unix.SYS_FUTEX, unix.SYS_FUTEX_WAITV, unix.SYS_FUTEX_WAKE,
	unix.SYS_FUTEX_WAIT, unix.SYS_FUTEX_REQUEUE, unix.SYS_RESTART_SYSCALL,
	unix.SYS_PTRACE, unix.SYS_SECCOMP, unix.SYS_PIDFD_OPEN,
	unix.SYS_PIDFD_SEND_SIGNAL, unix.SYS_PROCESS_MRELEASE,
	unix.SYS_LANDLOCK_CREATE_RULESET, unix.SYS_LANDLOCK_ADD_RULE,
	unix.SYS_LANDLOCK_RESTRICT_SELF,

	// signals
	unix.SYS_RT_SIGACTION, unix.SYS_RT_SIGPROCMASK, unix.SYS_RT_SIGRETURN,
	unix.SYS_RT_SIGPENDING, unix.SYS_RT_SIGTIMEDWAIT, unix.SYS_RT_SIGQUEUEINFO,
	unix.SYS_RT_SIGSUSPEND, unix.SYS_SIGALTSTACK, unix.SYS_RT_TGSIGQUEUEINFO,
	unix.SYS_PAUSE,

	// credentials (the kernel still checks CAP_SETUID/CAP_SETGID)
	unix.SYS_GETUID, unix.SYS_GETGID, unix.SYS_SETUID, unix.SYS_SETGID,
	unix.SYS_GETEUID, unix.SYS_GETEGID, unix.SYS_SETREUID, unix.SYS_SETREGID,
	unix.SYS_GETGROUPS, unix.SYS_SETGROUPS, unix.SYS_SETRESUID,
	unix.SYS_GETRESUID, unix.SYS_SETRESGID, unix.SYS_GETRESGID,
	unix.SYS_SETFSUID, unix.SYS_SETFSGID, unix.SYS_CAPGET, unix.SYS_CAPSET,

	// scheduling, limits and resource usage
	unix.SYS_SCHED_YIELD, unix.SYS_SCHED_SETPARAM, unix.SYS_SCHED_GETPARAM,
	unix.SYS_SCHED_SETSCHEDULER, unix.SYS_SCHED_GETSCHEDULER,
	unix.SYS_SCHED_GET_PRIORITY_MAX, unix.SYS_SCHED_GET_PRIORITY_MIN,
	unix.SYS_SCHED_RR_GET_INTERVAL, unix.SYS_SCHED_SETAFFINITY,
	unix.SYS_SCHED_GETAFFINITY, unix.SYS_SCHED_SETATTR, unix.SYS_SCHED_GETATTR,
	unix.SYS_GETPRIORITY, unix.SYS_SETPRIORITY, unix.SYS_GETRLIMIT,
	unix.SYS_SETRLIMIT, unix.SYS_PRLIMIT64, unix.SYS_GETRUSAGE,
	unix.SYS_TIMES, unix.SYS_GETCPU,

	// time and timers (setting the clock is not allowed)
	unix.SYS_NANOSLEEP, unix.SYS_GETITIMER, unix.SYS_ALARM, unix.SYS_SETITIMER,
	unix.SYS_GETTIMEOFDAY, unix.SYS_TIME, unix.SYS_TIMER_CREATE,
	unix.SYS_TIMER_SETTIME, unix.SYS_TIMER_GETTIME, unix.SYS_TIMER_GETOVERRUN,
	unix.SYS_TIMER_DELETE, unix.SYS_CLOCK_GETTIME, unix.SYS_CLOCK_GETRES,
	unix.SYS_CLOCK_NANOSLEEP,

	// system information
	unix.SYS_UNAME, unix.SYS_SYSINFO, unix.SYS_GETRANDOM,
}

// conditional rules; their syscalls must not appear in allowedSyscalls.
var conditionalSyscalls = []int{unix.SYS_CLONE, unix.SYS_CLONE3, unix.SYS_SOCKET, unix.SYS_PERSONALITY}

// AllowedSyscalls returns the numbers of the x86_64 syscalls the filter allows
// unconditionally, sorted. clone, socket and personality are allowed only for
// some arguments and are not included.
func AllowedSyscalls() []int {
	s := slices.Clone(allowedSyscalls)
	slices.Sort(s)
	return slices.Compact(s)
}

// Filter returns the seccomp-BPF program Apply installs, for linux/amd64:
//
//   - a foreign audit arch (i386 via int 0x80, ...) kills the process;
//   - x32 syscall numbers (bit 30 set) get EPERM;
//   - numbers above the newest reviewed syscall get ENOSYS;
//   - clone is allowed unless its flags (arg 0) request a new namespace;
//   - clone3 gets ENOSYS, so libc falls back to clone, whose flags the filter
//     can inspect (clone3 passes them in memory);
//   - socket is allowed except for AF_VSOCK (arg 0), which gets EPERM;
//   - personality is allowed only for 0x0, 0x8, 0x20000, 0x20008 and
//     0xffffffff, as in Docker;
//   - AllowedSyscalls are allowed, found by a binary search over ranges;
//   - everything else gets EPERM.
func Filter() ([]SockFilter, error) {
	allowed := AllowedSyscalls()
	for _, nr := range allowed {
		if slices.Contains(conditionalSyscalls, nr) {
			return nil, fmt.Errorf("syscall %d is both conditional and unconditionally allowed", nr)
		}
		if nr < 0 || nr > maxKnownSyscall {
			return nil, fmt.Errorf("allowed syscall %d outside 0..%d", nr, maxKnownSyscall)
		}
	}

	var b builder
	// Architecture check: kill anything that is not the x86_64 ABI.
	b.stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offArch)
	b.jump(unix.BPF_JEQ, unix.AUDIT_ARCH_X86_64, 1, 0)
	b.ret(retKillProcess)
	// Syscall number checks.
	b.stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offNr)
	b.jump(unix.BPF_JSET, x32ABIBit, 0, 1)
	b.ret(retEPERM)
	b.jump(unix.BPF_JGT, maxKnownSyscall, 0, 1)
	b.ret(retENOSYS)

	// clone: allowed without namespace flags. On x86_64 the flags are arg 0;
	// the kernel only uses their low 32 bits.
	b.rule(unix.SYS_CLONE, func(r *builder) {
		r.stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offArg0Low)
		r.jump(unix.BPF_JSET, cloneNamespaceFlags, 0, 1)
		r.ret(retEPERM)
		r.ret(retAllow)
	})
	// clone3: ENOSYS so that glibc and others fall back to clone.
	b.rule(unix.SYS_CLONE3, func(r *builder) {
		r.ret(retENOSYS)
	})
	// socket: everything but AF_VSOCK. The kernel takes the family as an
	// int, so only the low 32 bits are compared: high garbage cannot hide it.
	b.rule(unix.SYS_SOCKET, func(r *builder) {
		r.stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offArg0Low)
		r.jump(unix.BPF_JEQ, afVsock, 0, 1)
		r.ret(retEPERM)
		r.ret(retAllow)
	})
	// personality: only Docker's values, compared as full 64-bit values.
	b.rule(unix.SYS_PERSONALITY, func(r *builder) {
		n := len(personalityAllowed)
		// Layout: 0 ld hi; 1 jeq 0; 2 ld lo; 3..3+n-1 jeq v; 3+n deny; 4+n allow.
		deny, allow := 3+n, 4+n
		r.stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offArg0High)
		r.jump(unix.BPF_JEQ, 0, 0, deny-2)
		r.stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offArg0Low)
		for i, v := range personalityAllowed {
			at := 3 + i
			r.jump(unix.BPF_JEQ, v, allow-(at+1), 0)
		}
		r.ret(retEPERM)
		r.ret(retAllow)
	})

	// The unconditional allowlist. The accumulator still holds the number.
	b.append(searchRanges(toRanges(allowed)))
	if b.err != nil {
		return nil, b.err
	}
	if len(b.prog) > bpfMaxInsns {
		return nil, fmt.Errorf("seccomp program has %d instructions, limit is %d", len(b.prog), bpfMaxInsns)
	}
	return b.prog, nil
}

// builder accumulates a BPF program. Every sub-program it builds is
// self-contained: its jumps stay inside it and every path ends in a return,
// so sub-programs can be concatenated without relocation.
type builder struct {
	prog []unix.SockFilter
	err  error
}

func (b *builder) stmt(code uint16, k uint32) {
	b.prog = append(b.prog, unix.SockFilter{Code: code, K: k})
}

func (b *builder) ret(k uint32) {
	b.stmt(unix.BPF_RET|unix.BPF_K, k)
}

// jump appends a conditional jump on the accumulator against k; jt and jf
// count instructions to skip.
func (b *builder) jump(op uint16, k uint32, jt, jf int) {
	if jt < 0 || jt > 255 || jf < 0 || jf > 255 {
		if b.err == nil {
			b.err = fmt.Errorf("bpf jump offset out of range at instruction %d (jt=%d jf=%d)", len(b.prog), jt, jf)
		}
		jt, jf = 0, 0
	}
	b.prog = append(b.prog, unix.SockFilter{Code: unix.BPF_JMP | op | unix.BPF_K, Jt: uint8(jt), Jf: uint8(jf), K: k})
}

// ja appends an unconditional jump, whose offset is 32 bits wide.
func (b *builder) ja(off int) {
	b.prog = append(b.prog, unix.SockFilter{Code: unix.BPF_JMP | unix.BPF_JA, K: uint32(off)})
}

func (b *builder) append(sub builder) {
	if b.err == nil {
		b.err = sub.err
	}
	b.prog = append(b.prog, sub.prog...)
}

// rule appends "if nr == A then body" where body is a self-contained block
// ending in returns; on a mismatch execution continues after the block.
func (b *builder) rule(nr int, body func(*builder)) {
	var r builder
	body(&r)
	b.jump(unix.BPF_JEQ, uint32(nr), 0, len(r.prog))
	b.append(r)
}

// span is an inclusive range of syscall numbers.
type span struct{ lo, hi uint32 }

// toRanges merges sorted, deduplicated numbers into maximal ranges.
func toRanges(nrs []int) []span {
	var out []span
	for _, nr := range nrs {
		n := uint32(nr)
		if len(out) > 0 && out[len(out)-1].hi+1 == n {
			out[len(out)-1].hi = n
			continue
		}
		out = append(out, span{n, n})
	}
	return out
}

// leafRanges is the number of ranges a leaf of the search tree tests linearly.
const leafRanges = 4

// searchRanges returns a self-contained block that allows the syscall number
// in the accumulator if it lies in one of rs (sorted, disjoint) and returns
// EPERM otherwise.
func searchRanges(rs []span) builder {
	var b builder
	if len(rs) <= leafRanges {
		// Count the instructions first so jumps to the returns are known.
		n := 0
		for _, r := range rs {
			if r.lo == r.hi {
				n++
			} else {
				n += 2
			}
		}
		allow := n + 1 // n is the deny return
		for _, r := range rs {
			at := len(b.prog)
			if r.lo == r.hi {
				b.jump(unix.BPF_JEQ, r.lo, allow-(at+1), 0)
				continue
			}
			// A >= lo ? (A > hi ? next : allow) : next
			b.jump(unix.BPF_JGE, r.lo, 0, 1)
			b.jump(unix.BPF_JGT, r.hi, 0, allow-(at+2))
		}
		b.ret(retEPERM)
		b.ret(retAllow)
		return b
	}
	mid := len(rs) / 2
	left, right := searchRanges(rs[:mid]), searchRanges(rs[mid:])
	if len(left.prog) <= 255 {
		b.jump(unix.BPF_JGE, rs[mid].lo, len(left.prog), 0)
	} else {
		b.jump(unix.BPF_JGE, rs[mid].lo, 0, 1)
		b.ja(len(left.prog))
	}
	b.append(left)
	b.append(right)
	return b
}
