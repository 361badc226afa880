// Package confine drops privileges on the calling OS thread so that every
// process the thread forks afterwards inherits the same confinement: a reduced
// capability bounding/permitted/effective set (Docker's default set minus
// CAP_NET_RAW), cleared ambient capabilities, no_new_privs (so setuid binaries
// and file capabilities cannot raise privileges again), and a seccomp-BPF
// allowlist at least as strict as Docker's default profile for x86_64. Together
// these stop the classic container escapes and kernel attack surface a sandboxed
// agent command could reach: mounting or remounting file systems (mount,
// fsopen/fsmount, open_tree, pivot_root), creating or joining namespaces
// (unshare, setns, clone with CLONE_NEW* flags, clone3) to regain capabilities
// in a fresh user namespace, kernel keyrings (keyctl, add_key, request_key),
// eBPF and perf events (bpf, perf_event_open), io_uring, userfaultfd, AF_VSOCK
// sockets to the hypervisor, raw sockets (CAP_NET_RAW), loading kernel modules
// or kernels (init_module, finit_module, kexec_*), handle-based file access
// outside the root (open_by_handle_at), cross-process memory access
// (process_vm_readv/writev), clock and system-wide administration (settimeofday,
// adjtimex, swapon, reboot, syslog, acct, quotactl), and 32-bit or x32 syscall
// entry points that would bypass the x86_64 filter.
//
// Apply acts on the calling thread only: it never uses SECCOMP_FILTER_FLAG_TSYNC
// or syscall.AllThreadsSyscall, so the rest of the Go runtime stays privileged.
// The caller must therefore call runtime.LockOSThread first, never unlock, and
// fork (syscall.ForkExec, os/exec) only from that goroutine:
//
//	runtime.LockOSThread() // this thread becomes the launcher
//	if err := confine.Apply(confine.Default()); err != nil { ... }
//	// syscall.ForkExec / exec.Cmd.Start from this goroutine only
//
// Because clone3 is answered with ENOSYS, SysProcAttr.UseCgroupFD (which makes
// Go use clone3) cannot be used from a confined thread; Cloneflags or
// Unshareflags with namespace bits fail with EPERM.
//
// Seccomp filtering is implemented for linux/amd64 only; on other platforms
// Apply and Filter return an error wrapping errors.ErrUnsupported.
package confine

// Policy describes the confinement Apply installs on the calling thread.
type Policy struct {
	// Caps lists the capabilities kept in the bounding, permitted and
	// effective sets; every other capability is dropped from all of them.
	// A capability the thread does not hold already cannot be gained, so
	// the permitted and effective sets become Caps ∩ (current permitted).
	Caps []Cap
	// Inheritable also places Caps in the inheritable set. Default leaves
	// it off, like Docker since CVE-2022-24769: an inheritable capability
	// would let a non-root user gain it by executing a file that carries
	// inheritable file capabilities.
	Inheritable bool
	// NoNewPrivs sets PR_SET_NO_NEW_PRIVS, so execve can never grant more
	// privileges (setuid/setgid bits and file capabilities are ignored).
	NoNewPrivs bool
	// Seccomp installs the allowlist returned by Filter.
	Seccomp bool
}

// Default returns Docker's default capability set minus CAP_NET_RAW, with
// no_new_privs and the seccomp filter enabled.
func Default() Policy {
	return Policy{
		Caps: []Cap{
			CapChown, CapDacOverride, CapFowner, CapFsetid, CapKill,
			CapSetgid, CapSetuid, CapSetpcap, CapNetBindService,
			CapSysChroot, CapMknod, CapAuditWrite, CapSetfcap,
		},
		NoNewPrivs: true,
		Seccomp:    true,
	}
}
