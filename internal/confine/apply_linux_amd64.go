//go:build linux && amd64

package confine

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Apply confines the calling OS thread according to p. The caller must have
// called runtime.LockOSThread and must keep the goroutine locked: the
// confinement applies to this thread and to the processes it forks afterwards,
// not to the other threads of the Go runtime.
//
// The steps, in order, are: drop every capability not in p.Caps from the
// bounding set, clear the ambient set, set the permitted and effective sets
// (and the inheritable set if p.Inheritable) to p.Caps, set no_new_privs, and
// install the seccomp filter. When p.Seccomp is set without p.NoNewPrivs the
// kernel demands CAP_SYS_ADMIN to install a filter, so the filter is then
// installed before the permitted and effective sets are reduced.
//
// A failing step leaves the earlier ones in place; the returned error names
// the step. The caller should treat the thread as unusable after an error.
func Apply(p Policy) error {
	keep, err := CapMask(p.Caps)
	if err != nil {
		return fmt.Errorf("check policy: %w", err)
	}
	var filter []unix.SockFilter
	if p.Seccomp {
		if filter, err = Filter(); err != nil {
			return fmt.Errorf("build seccomp filter: %w", err)
		}
	}
	last, err := lastCap()
	if err != nil {
		return fmt.Errorf("read cap_last_cap: %w", err)
	}

	for c := 0; c <= last; c++ {
		if keep&(1<<uint(c)) != 0 {
			continue
		}
		in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0)
		if err != nil {
			return fmt.Errorf("read bounding cap %d (%s): %w", c, Cap(c), err)
		}
		if in == 0 {
			continue // already dropped: no CAP_SETPCAP needed
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			return fmt.Errorf("drop bounding cap %d (%s): %w", c, Cap(c), err)
		}
	}

	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		// EINVAL: kernel older than 4.3, which has no ambient set.
		return fmt.Errorf("clear ambient caps: %w", err)
	}

	installed := false
	if p.Seccomp && !p.NoNewPrivs {
		if err := installFilter(filter); err != nil {
			return fmt.Errorf("install seccomp filter (without no_new_privs, needs CAP_SYS_ADMIN): %w", err)
		}
		installed = true
	}

	if err := setCaps(keep, p.Inheritable); err != nil {
		return err
	}

	if p.NoNewPrivs {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("set no_new_privs: %w", err)
		}
	}

	if p.Seccomp && !installed {
		if err := installFilter(filter); err != nil {
			return fmt.Errorf("install seccomp filter: %w", err)
		}
	}
	return nil
}

// lastCap reads the highest capability number the running kernel knows.
func lastCap() (int, error) {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if errors.Is(err, os.ErrNotExist) {
		// gVisor has no such file: the bounding set answers EINVAL past
		// the last capability.
		for c := 0; c <= int(maxCap); c++ {
			if _, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0); err != nil {
				if c == 0 {
					return 0, fmt.Errorf("read the bounding set: %w", err)
				}
				return c - 1, nil
			}
		}
		return int(maxCap), nil
	}
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, err
	}
	if n < 0 || n > int(maxCap) {
		return 0, fmt.Errorf("cap_last_cap %d outside 0..%d", n, int(maxCap))
	}
	return n, nil
}

// setCaps sets the permitted and effective sets of the calling thread to
// keep ∩ (current permitted), and the inheritable set to the same value or
// to nothing, with a raw capset(2) (version 3 header, pid 0 = this thread).
func setCaps(keep uint64, inheritable bool) error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if _, _, e := unix.RawSyscall(unix.SYS_CAPGET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("capget: %w", e)
	}
	cur := uint64(data[0].Permitted) | uint64(data[1].Permitted)<<32
	set := keep & cur
	var inh uint64
	if inheritable {
		inh = set
	}
	hdr = unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3, Pid: 0}
	data = [2]unix.CapUserData{
		{Effective: uint32(set), Permitted: uint32(set), Inheritable: uint32(inh)},
		{Effective: uint32(set >> 32), Permitted: uint32(set >> 32), Inheritable: uint32(inh >> 32)},
	}
	if _, _, e := unix.RawSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("capset: %w", e)
	}
	return nil
}

// installFilter loads prog on the calling thread only (flags 0: no TSYNC).
func installFilter(prog []unix.SockFilter) error {
	if len(prog) == 0 {
		return errors.New("empty program")
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	_, _, e := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	if e != 0 {
		return e
	}
	return nil
}
