//go:build linux

package confine

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// InheritNothing marks every descriptor of the process above standard
// error close-on-exec, so that no program it executes from now on inherits
// a descriptor it was not handed on purpose (os/exec's ExtraFiles and
// syscall.ProcAttr.Files dup2 theirs into place, which clears the flag on
// the copies). Go opens its own descriptors close-on-exec; the ones a
// process inherited from its parent are not: started as
// `(exec 7</some/dir; den serve)`, the daemon would hand fd 7 to every
// sandbox's init and the agent on to every command, which could then reach
// host files through /proc/self/fd/7.
func InheritNothing() error {
	err := unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("mark inherited descriptors close-on-exec: %w", err)
	}
	// Before Linux 5.11: one descriptor at a time.
	return cloexecEach()
}

// cloexecEach marks the descriptors /proc lists close-on-exec, or (a
// microVM's init runs before it mounts /proc) every one up to the
// open-files limit.
func cloexecEach() error {
	fds, err := openDescriptors()
	if err != nil {
		return err
	}
	for _, fd := range fds {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil && !errors.Is(err, unix.EBADF) {
			return fmt.Errorf("mark descriptor %d close-on-exec: %w", fd, err)
		}
	}
	return nil
}

// openDescriptors lists the process's descriptors above 2.
func openDescriptors() ([]int, error) {
	var fds []int
	if names, err := readDirNames("/proc/self/fd"); err == nil {
		for _, n := range names {
			if fd, err := strconv.Atoi(n); err == nil && fd > 2 {
				fds = append(fds, fd)
			}
		}
		return fds, nil
	}
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return nil, fmt.Errorf("list inherited descriptors: %w", err)
	}
	for fd := 3; uint64(fd) < lim.Cur; fd++ {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil {
			fds = append(fds, fd)
		}
	}
	return fds, nil
}

func readDirNames(dir string) ([]string, error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return d.Readdirnames(-1)
}
