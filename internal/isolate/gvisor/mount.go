package gvisor

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/den-dev/den/internal/host"
	"github.com/den-dev/den/internal/isolate"
	"golang.org/x/sys/unix"
)

// mountRoot mounts the box's overlays at rootfs in the host's mount
// namespace, as the linux tier lays them out (upper and work directories
// spec.Dir/upper/<name> and spec.Dir/work/<name>) but without id mapping:
// runsc's gofer runs as host root and creates files with the ids the box
// sees, so the uppers store canonical ids (root inside is uid 0 on disk).
func mountRoot(spec *isolate.Spec, rootfs string) (err error) {
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	for _, l := range spec.Layers {
		if l.Name == "" || strings.ContainsAny(l.Name, "/,:") || l.Name == "." || l.Name == ".." {
			return fmt.Errorf("layer name %q: want a plain name", l.Name)
		}
		for _, d := range []string{"upper", "work"} {
			if err := os.MkdirAll(filepath.Join(spec.Dir, d, l.Name), 0o755); err != nil {
				return fmt.Errorf("create layer dir: %w", err)
			}
		}
	}
	state, err := unix.Open(spec.Dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open box storage: %w", err)
	}
	fds = append(fds, state)
	mounted := false
	defer func() {
		if err != nil && mounted {
			unix.Unmount(rootfs, unix.MNT_DETACH)
		}
	}()
	for i, l := range spec.Layers {
		var lowers []string
		for j := len(l.Lowers) - 1; j >= 0; j-- { // overlayfs wants the top first
			fd, err := unix.Open(l.Lowers[j], unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("open layer %s: %w", l.Lowers[j], err)
			}
			fds = append(fds, fd)
			lowers = append(lowers, fmt.Sprintf("/proc/self/fd/%d", fd))
		}
		opts := fmt.Sprintf("lowerdir=%s,upperdir=/proc/self/fd/%d/upper/%s,workdir=/proc/self/fd/%d/work/%s,index=off,metacopy=off,redirect_dir=off,xino=off",
			strings.Join(lowers, ":"), state, l.Name, state, l.Name)
		target := rootfs
		if i > 0 {
			// Resolved inside the root mounted so far, as the box sees it.
			root, err := unix.Open(rootfs, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("open root: %w", err)
			}
			fd, err := host.MkdirInRoot(root, l.Target)
			unix.Close(root)
			if err != nil {
				return fmt.Errorf("mount point %s: %w", l.Target, err)
			}
			fds = append(fds, fd)
			target = fmt.Sprintf("/proc/self/fd/%d", fd)
		}
		if err := unix.Mount("overlay", target, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
			return fmt.Errorf("mount overlay at %s: %w", l.Target, err)
		}
		mounted = true
	}
	// The mount points gVisor mounts its own filesystems on (and the agent
	// under /dev) must exist, also in an image made FROM scratch.
	root, err := unix.Open(rootfs, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open root: %w", err)
	}
	defer unix.Close(root)
	for _, d := range []string{"/dev", "/proc", "/sys", "/tmp"} {
		fd, err := host.MkdirInRoot(root, d)
		if err != nil {
			return fmt.Errorf("mount point %s: %w", d, err)
		}
		unix.Close(fd)
	}
	return nil
}

// bindSource makes dst a read-only (if ro) nosuid, nodev bind mount of
// the directory src, without its submounts, and returns nil or the error.
func bindSource(m isolate.Mount, dst string) error {
	if !path.IsAbs(m.Target) || path.Clean(m.Target) == "/" {
		return fmt.Errorf("mount target %q: want an absolute path other than /", m.Target)
	}
	if st, err := os.Stat(m.Source); err != nil {
		return fmt.Errorf("mount source: %w", err)
	} else if !st.IsDir() {
		return fmt.Errorf("mount source %s is not a directory", m.Source)
	}
	if err := os.MkdirAll(dst, 0o700); err != nil {
		return err
	}
	if err := unix.Mount(m.Source, dst, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s: %w", m.Source, err)
	}
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_NOSUID | unix.MS_NODEV)
	if m.ReadOnly {
		flags |= unix.MS_RDONLY
	}
	if err := unix.Mount("", dst, "", flags, ""); err != nil {
		unix.Unmount(dst, unix.MNT_DETACH)
		return fmt.Errorf("set attributes of %s: %w", m.Source, err)
	}
	return nil
}
