//go:build linux

package confine

import (
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// Both ways of marking inherited descriptors (close_range, and one at a
// time for kernels before 5.11) leave none without close-on-exec.
func TestInheritNothing(t *testing.T) {
	for name, mark := range map[string]func() error{"close_range": InheritNothing, "each": cloexecEach} {
		fd, err := syscall.Dup(1) // dup leaves close-on-exec off, as an inherited descriptor has it
		if err != nil {
			t.Fatal(err)
		}
		if fl, _ := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); fl&unix.FD_CLOEXEC != 0 {
			t.Fatalf("%s: a dup is close-on-exec already", name)
		}
		if err := mark(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		syscall.Close(fd)
		if err != nil || fl&unix.FD_CLOEXEC == 0 {
			t.Errorf("%s: descriptor %d not close-on-exec: flags %d, %v", name, fd, fl, err)
		}
	}
}
