package host

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"
)

// CreateNetNS makes a new network namespace with its loopback up and pins
// it at path with a bind mount (as `ip netns add` does), so it lives on
// without a process in it: across daemon restarts, and before the box's
// process (runsc's sandbox, a microVM's tap) joins it. A namespace already
// pinned there is kept.
func CreateNetNS(path string) error {
	if ok, _ := isNetNS(path); ok {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o711); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDONLY, 0o444)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	f.Close()
	errc := make(chan error, 1)
	// unshare on a locked thread, and back again before unlocking it, so
	// no other goroutine ever runs in the new namespace.
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open own network namespace: %w", err)
			return
		}
		defer unix.Close(orig)
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("unshare network namespace: %w", err)
			return
		}
		self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		err = unix.Mount(self, path, "", unix.MS_BIND, "")
		if err != nil {
			err = fmt.Errorf("pin network namespace at %s: %w", path, err)
		} else {
			err = LoopbackUp()
		}
		// Back to the daemon's namespace before the thread is reused; if
		// that fails the thread stays locked and ends with the goroutine
		// (Go parks rather than ends the main thread, so never rely on
		// that alone).
		if unix.Setns(orig, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	if err := <-errc; err != nil {
		RemoveNetNS(path)
		return err
	}
	return nil
}

// RemoveNetNS unpins and removes a namespace made by CreateNetNS; it goes
// once no process uses it. Idempotent.
func RemoveNetNS(path string) error {
	unix.Unmount(path, unix.MNT_DETACH)
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return nil
}

// isNetNS reports whether path is a pinned network namespace.
func isNetNS(path string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false, err
	}
	return st.Type == unix.NSFS_MAGIC, nil
}

// LoopbackUp brings up the loopback interface of the calling thread's
// network namespace.
func LoopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("get lo flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring lo up: %w", err)
	}
	return nil
}
