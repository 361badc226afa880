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
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		return fmt.Errorf("list inherited descriptors: %w", err)
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("list inherited descriptors: %w", err)
	}
	for _, n := range names {
		fd, err := strconv.Atoi(n)
		if err != nil || fd < 3 {
			continue
		}
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil && !errors.Is(err, unix.EBADF) {
			return fmt.Errorf("mark descriptor %d close-on-exec: %w", fd, err)
		}
	}
	return nil
}
