package gvisor

import (
	"errors"
	"fmt"
	"io/fs"
	"runtime"
	"unsafe"

	"github.com/den-dev/den/internal/confine"
	"golang.org/x/sys/unix"
)

// confineLauncher runs on the agent's launcher thread: the capability
// set, no_new_privs and the seccomp filter of confine.Default, all of
// which gVisor's kernel implements. (No cgroup namespace: the box's
// cgroupfs is gVisor's own.) confine.Apply reads the highest capability
// from /proc/sys/kernel/cap_last_cap, which gVisor's procfs lacks; then
// the same steps run here with the highest capability found by probing
// PR_CAPBSET_READ.
func confineLauncher() error {
	err := confine.Apply(confine.Default())
	if err != nil && errors.Is(err, fs.ErrNotExist) {
		err = applyProbed(confine.Default())
	}
	if err != nil {
		return fmt.Errorf("confine commands: %w", err)
	}
	return nil
}

// applyProbed is confine.Apply (no_new_privs on, so the filter goes in
// last) with the last capability probed.
func applyProbed(p confine.Policy) error {
	keep, err := confine.CapMask(p.Caps)
	if err != nil {
		return fmt.Errorf("check policy: %w", err)
	}
	var filter []unix.SockFilter
	if p.Seccomp {
		if filter, err = confine.Filter(); err != nil {
			return fmt.Errorf("build seccomp filter: %w", err)
		}
	}
	for c := 0; c < 64; c++ {
		in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0)
		if errors.Is(err, unix.EINVAL) {
			break // past the last capability
		}
		if err != nil {
			return fmt.Errorf("read bounding cap %d: %w", c, err)
		}
		if keep&(1<<uint(c)) != 0 || in == 0 {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			return fmt.Errorf("drop bounding cap %d: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("clear ambient caps: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if _, _, e := unix.RawSyscall(unix.SYS_CAPGET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("capget: %w", e)
	}
	set := keep & (uint64(data[0].Permitted) | uint64(data[1].Permitted)<<32)
	var inh uint64
	if p.Inheritable {
		inh = set
	}
	hdr = unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	data = [2]unix.CapUserData{
		{Effective: uint32(set), Permitted: uint32(set), Inheritable: uint32(inh)},
		{Effective: uint32(set >> 32), Permitted: uint32(set >> 32), Inheritable: uint32(inh >> 32)},
	}
	if _, _, e := unix.RawSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("capset: %w", e)
	}
	if p.NoNewPrivs {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("set no_new_privs: %w", err)
		}
	}
	if p.Seccomp {
		if !p.NoNewPrivs {
			return errors.New("seccomp without no_new_privs is not supported here")
		}
		fprog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
		_, _, e := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog)))
		runtime.KeepAlive(filter)
		if e != 0 {
			return fmt.Errorf("install seccomp filter: %w", e)
		}
	}
	return nil
}
