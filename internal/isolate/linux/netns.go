package linux

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
	// unshare on a thread of its own that is never reused: it ends with
	// the goroutine, so no other goroutine runs in the new namespace.
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare network namespace: %w", err)
			return
		}
		self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		if err := unix.Mount(self, path, "", unix.MS_BIND, ""); err != nil {
			errc <- fmt.Errorf("pin network namespace at %s: %w", path, err)
			return
		}
		errc <- loopbackUp()
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
