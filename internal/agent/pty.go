package agent

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// openPty allocates a terminal from the sandbox's own devpts instance.
func openPty(rows, cols uint16) (master, slave *os.File, err error) {
	fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open /dev/ptmx: %w", err)
	}
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		unix.Close(fd)
		return nil, nil, fmt.Errorf("unlock pty: %w", err)
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		unix.Close(fd)
		return nil, nil, fmt.Errorf("pty number: %w", err)
	}
	name := "/dev/pts/" + strconv.Itoa(n)
	sfd, err := unix.Open(name, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(fd)
		return nil, nil, fmt.Errorf("open %s: %w", name, err)
	}
	if rows == 0 || cols == 0 {
		rows, cols = 24, 80
	}
	unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
	// Non-blocking, so reads go through the poller and can be cancelled.
	unix.SetNonblock(fd, true)
	return os.NewFile(uintptr(fd), "ptmx"), os.NewFile(uintptr(sfd), name), nil
}

func dupFile(f *os.File) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dup: %w", err)
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// Resize sets the terminal size of a process started with a tty.
func (p *Process) Resize(rows, cols uint16) error {
	if !p.tty || p.stdinW == nil || p.stdinClosed.Load() {
		return fmt.Errorf("process %s has no terminal", p.ID)
	}
	return unix.IoctlSetWinsize(int(p.stdinW.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
}
