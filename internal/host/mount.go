package host

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// MakePrivateMount makes dir a private mount (binding it onto itself
// first if it is not a mount point), so mounts made under it never
// propagate into (or out of) other mount namespaces.
func MakePrivateMount(dir string) error {
	mounted, err := isMountPoint(dir)
	if err != nil {
		return err
	}
	if !mounted {
		if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s: %w", dir, err)
		}
	}
	if err := unix.Mount("", dir, "", unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make %s private: %w", dir, err)
	}
	return nil
}

func isMountPoint(dir string) (bool, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[4] == dir {
			return true, nil
		}
	}
	return false, nil
}

// inRoot resolves paths the way the box will see them: symlinks (even
// absolute or full of "..") stay inside the root, and /proc magic links
// are refused.
var inRoot = unix.OpenHow{
	Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
	Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
}

// MkdirInRoot opens (O_PATH) the directory p inside root, creating what is
// missing (mode 0755, owned by the caller) one component at a time, each
// in its parent as resolved inside root: symlinks stay inside the root and
// /proc magic links are refused.
func MkdirInRoot(root int, p string) (int, error) {
	rel := strings.TrimPrefix(path.Clean("/"+p), "/")
	how := inRoot
	if fd, err := unix.Openat2(root, rel, &how); !errors.Is(err, unix.ENOENT) {
		return fd, err
	}
	parent, err := unix.Openat2(root, ".", &how)
	if err != nil {
		return -1, err
	}
	comps := strings.Split(rel, "/")
	for i, c := range comps {
		prefix := strings.Join(comps[:i+1], "/")
		fd, err := unix.Openat2(root, prefix, &how)
		if errors.Is(err, unix.ENOENT) {
			if err := unix.Mkdirat(parent, c, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
				unix.Close(parent)
				return -1, fmt.Errorf("create /%s: %w", prefix, err)
			}
			fd, err = unix.Openat2(root, prefix, &how)
			if errors.Is(err, unix.ENOENT) {
				err = errors.New("a dangling symlink")
			}
		}
		unix.Close(parent)
		if err != nil {
			return -1, fmt.Errorf("open /%s: %w", prefix, err)
		}
		parent = fd
	}
	return parent, nil
}

// Paths masked and made read-only as in Docker's default configuration,
// and sysfs's virtual block devices, which are the host's (sysfs shows
// every block device, whatever namespace mounts it) and tell host paths:
// a loop device's backing_file, a zram device's backing_dev, an nbd
// device's backend; /sys/block, /sys/class/block and /sys/dev/block only
// link there.
var (
	maskedPaths = []string{
		"/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
		"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
		"/sys/firmware", "/sys/devices/virtual/powercap", "/sys/devices/virtual/block",
	}
	readonlyPaths = []string{
		"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
	}
	devices = []string{"null", "zero", "full", "random", "urandom", "tty"}
)

// MaskPaths hides the kernel interfaces a sandbox has no business with
// under root (its /proc and /sys mounted): Docker's masked paths become an
// empty read-only tmpfs or /dev/null, its read-only paths read-only. root's
// /dev/null must exist.
func MaskPaths(root string) error {
	const nosuidnodev = unix.MS_NOSUID | unix.MS_NODEV
	p := func(rel string) string { return filepath.Join(root, rel) }
	for _, m := range maskedPaths {
		st, err := os.Stat(p(m))
		if err != nil {
			continue
		}
		if st.IsDir() {
			err = unix.Mount("tmpfs", p(m), "tmpfs", unix.MS_RDONLY|nosuidnodev|unix.MS_NOEXEC, "size=0")
		} else {
			err = unix.Mount(p("/dev/null"), p(m), "", unix.MS_BIND, "")
		}
		if err != nil {
			return fmt.Errorf("mask %s: %w", m, err)
		}
	}
	for _, ro := range readonlyPaths {
		if _, err := os.Stat(p(ro)); err != nil {
			continue
		}
		if err := unix.Mount(p(ro), p(ro), "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s: %w", ro, err)
		}
		if err := unix.Mount("", p(ro), "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|nosuidnodev|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("make %s read-only: %w", ro, err)
		}
	}
	return nil
}

// MountSystem mounts a box's kernel file systems in root: /proc, a
// read-only /sys, and a /dev tmpfs holding the usual devices (each made by
// makeDev at dst), pts, shm, mqueue and the standard links plus links;
// then it masks what a box must not reach (MaskPaths). The linux tier binds
// the host's devices, a microVM's guest makes its own.
func MountSystem(root string, shmSize int64, makeDev func(dst, name string) error, links map[string]string) error {
	p := func(rel string) string { return filepath.Join(root, rel) }
	mkdir := func(rel string, mode os.FileMode) error {
		if err := os.MkdirAll(p(rel), mode); err != nil {
			return fmt.Errorf("create %s: %w", rel, err)
		}
		return nil
	}
	for _, d := range []string{"/proc", "/sys", "/dev", "/tmp"} {
		if err := mkdir(d, 0o755); err != nil {
			return err
		}
	}
	const nosuidnodev = unix.MS_NOSUID | unix.MS_NODEV
	if err := unix.Mount("proc", p("/proc"), "proc", nosuidnodev|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	if err := unix.Mount("sysfs", p("/sys"), "sysfs", nosuidnodev|unix.MS_NOEXEC|unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("mount /sys: %w", err)
	}
	if err := unix.Mount("tmpfs", p("/dev"), "tmpfs", unix.MS_NOSUID|unix.MS_STRICTATIME, "mode=755,size=65536k"); err != nil {
		return fmt.Errorf("mount /dev: %w", err)
	}
	for _, d := range devices {
		if err := makeDev(p("/dev/"+d), d); err != nil {
			return fmt.Errorf("create /dev/%s: %w", d, err)
		}
	}
	for _, d := range []string{"/dev/pts", "/dev/shm", "/dev/mqueue"} {
		if err := mkdir(d, 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount("devpts", p("/dev/pts"), "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5"); err != nil {
		return fmt.Errorf("mount /dev/pts: %w", err)
	}
	if err := unix.Mount("shm", p("/dev/shm"), "tmpfs", nosuidnodev|unix.MS_NOEXEC, ShmOptions(shmSize)); err != nil {
		return fmt.Errorf("mount /dev/shm: %w", err)
	}
	if err := unix.Mount("mqueue", p("/dev/mqueue"), "mqueue", nosuidnodev|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /dev/mqueue: %w", err)
	}
	all := map[string]string{
		"/dev/ptmx": "pts/ptmx", "/dev/fd": "/proc/self/fd", "/dev/stdin": "/proc/self/fd/0",
		"/dev/stdout": "/proc/self/fd/1", "/dev/stderr": "/proc/self/fd/2",
	}
	for link, target := range links {
		all[link] = target
	}
	for link, target := range all {
		if err := os.Symlink(target, p(link)); err != nil {
			return fmt.Errorf("symlink %s: %w", link, err)
		}
	}
	return MaskPaths(root)
}

// DefaultShmSize is the size of a sandbox's /dev/shm unless it asks for
// another (Docker's default too).
const DefaultShmSize = 64 << 20

// ShmOptions are the tmpfs options of a /dev/shm of size bytes (0: the
// default), in KiB rounded up as tmpfs rounds to pages anyway.
func ShmOptions(size int64) string {
	if size <= 0 {
		size = DefaultShmSize
	}
	return fmt.Sprintf("mode=1777,size=%dk", (size+1023)/1024)
}
