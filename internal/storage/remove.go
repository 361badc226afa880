package storage

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrMountPoint marks a removal that stopped at a mount point.
var ErrMountPoint = errors.New("is a mount point")

// RemoveTree removes the file or directory tree at path, like os.RemoveAll,
// but never crosses into another mount: a directory mounted on (a sandbox
// root a dead daemon left mounted, a bind-mounted host directory or volume
// under it) is left whole, with the directories above it, and the error
// wraps ErrMountPoint and names it. Everything else is removed. It works
// with openat/unlinkat from descriptors, so a directory swapped for a
// symlink meanwhile is unlinked, never followed. A missing path is not an
// error.
func RemoveTree(path string) error {
	path = filepath.Clean(path)
	if path == "/" {
		return errors.New("remove /: refusing")
	}
	parent, err := unix.Open(filepath.Dir(path), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return &os.PathError{Op: "remove", Path: path, Err: err}
	}
	defer unix.Close(parent)
	mnt, err := mountOf(parent, "")
	if err != nil {
		return &os.PathError{Op: "remove", Path: filepath.Dir(path), Err: err}
	}
	return removeAt(parent, filepath.Base(path), path, mnt)
}

// mountID identifies the mount a file is on: its mount id where statx
// gives it (Linux 5.8+), else its device plus whether it is a mount's
// root (a mount of the same filesystem shows only through the latter).
type mountID struct {
	id   uint64
	dev  uint64
	root bool
}

func mountOf(dirfd int, name string) (mountID, error) {
	flags := unix.AT_SYMLINK_NOFOLLOW | unix.AT_NO_AUTOMOUNT
	if name == "" {
		flags |= unix.AT_EMPTY_PATH
	}
	var st unix.Statx_t
	if err := unix.Statx(dirfd, name, flags, unix.STATX_TYPE|unix.STATX_MNT_ID, &st); err != nil {
		return mountID{}, err
	}
	m := mountID{dev: unix.Mkdev(st.Dev_major, st.Dev_minor)}
	if st.Mask&unix.STATX_MNT_ID != 0 {
		m.id = st.Mnt_id
	}
	if st.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 {
		m.root = st.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0
	}
	return m, nil
}

// crosses reports whether child (a directory in parent's directory) is on
// another mount than parent.
func crosses(parent, child mountID) bool {
	if parent.id != 0 && child.id != 0 {
		return parent.id != child.id
	}
	// No mount ids: a new device is another filesystem (a btrfs subvolume
	// looks like one too, and is left alone all the same), and a mount
	// root is a mount whatever its device.
	return parent.dev != child.dev || child.root
}

// removeAt removes name in the directory dirfd (whose mount is mnt); full
// is its path, for errors.
func removeAt(dirfd int, name, full string, mnt mountID) error {
	st, err := mountOf(dirfd, name)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return &os.PathError{Op: "remove", Path: full, Err: err}
	}
	// Anything but a directory is unlinked (a mount on a file is refused
	// by the kernel with EBUSY).
	err = unix.Unlinkat(dirfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) {
		return &os.PathError{Op: "remove", Path: full, Err: err}
	}
	if crosses(mnt, st) {
		return fmt.Errorf("remove %s: %w: not removing what is mounted there", full, ErrMountPoint)
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return &os.PathError{Op: "remove", Path: full, Err: err}
	}
	// What was opened is what is removed: check its mount again, in case
	// something was mounted there after the first look.
	if st, err = mountOf(fd, ""); err != nil || crosses(mnt, st) {
		unix.Close(fd)
		if err != nil {
			return &os.PathError{Op: "remove", Path: full, Err: err}
		}
		return fmt.Errorf("remove %s: %w: not removing what is mounted there", full, ErrMountPoint)
	}
	dir := os.NewFile(uintptr(fd), full)
	defer dir.Close()
	// Entries unlinked while the directory is read can make it skip
	// others: read it again until it can be removed.
	for pass := 0; ; pass++ {
		var errs []error
		if _, err := dir.Seek(0, io.SeekStart); err != nil {
			return &os.PathError{Op: "remove", Path: full, Err: err}
		}
		for {
			names, rerr := dir.Readdirnames(1024)
			for _, n := range names {
				if err := removeAt(fd, n, filepath.Join(full, n), mnt); err != nil {
					errs = append(errs, err)
				}
			}
			if rerr != nil {
				if rerr != io.EOF {
					errs = append(errs, rerr)
				}
				break
			}
		}
		if len(errs) > 0 {
			return errors.Join(errs...)
		}
		err := unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.ENOTEMPTY) || pass == 3 {
			return &os.PathError{Op: "remove", Path: full, Err: err}
		}
	}
}

// notMountRoot returns an error wrapping ErrMountPoint if the directory p
// is mounted on (or its mount cannot be told).
func notMountRoot(p string) error {
	parent, err := unix.Open(filepath.Dir(p), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "remove", Path: p, Err: err}
	}
	defer unix.Close(parent)
	pm, err := mountOf(parent, "")
	if err != nil {
		return &os.PathError{Op: "remove", Path: p, Err: err}
	}
	cm, err := mountOf(parent, filepath.Base(p))
	if err != nil {
		return &os.PathError{Op: "remove", Path: p, Err: err}
	}
	// A subvolume has a device of its own but the same mount: only the
	// mount ids (or the mount-root attribute) tell a mount.
	if (pm.id != 0 && cm.id != 0 && pm.id != cm.id) || cm.root {
		return fmt.Errorf("remove %s: %w: not removing what is mounted there", p, ErrMountPoint)
	}
	return nil
}

// MountsUnder lists the mount points at or under dir in this process's
// mount namespace, deepest first.
func MountsUnder(dir string) []string {
	dir = filepath.Clean(dir)
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		if len(fl) < 5 {
			continue
		}
		mp := unescapeMount(fl[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			ok := true
			for _, c := range s[i+1 : i+4] {
				if c < '0' || c > '7' {
					ok = false
					break
				}
				v = v*8 + byte(c-'0')
			}
			if ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// UnmountUnder detaches every mount at or under dir and returns the mount
// points it detached; the error names those that stay (never remove a
// directory with a mount left under it: it may be a box's storage or a
// host directory).
func UnmountUnder(dir string) ([]string, error) {
	var gone []string
	for i := 0; i < 4; i++ {
		ms := MountsUnder(dir)
		if len(ms) == 0 {
			return gone, nil
		}
		for _, m := range ms {
			if unix.Unmount(m, unix.MNT_DETACH) == nil {
				gone = append(gone, m)
			}
		}
	}
	if ms := MountsUnder(dir); len(ms) > 0 {
		return gone, fmt.Errorf("mounts left under %s: %s", dir, strings.Join(ms, ", "))
	}
	return gone, nil
}

// secureMount makes the mount at dir nosuid and nodev (only those two
// attributes change): den's storage holds files sandboxes wrote, and no
// setuid program or device node among them may work on the host.
func secureMount(dir string) error {
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if err := unix.MountSetattr(unix.AT_FDCWD, dir, 0, &attr); err != nil {
		return fmt.Errorf("make %s nosuid,nodev: %w", dir, err)
	}
	return nil
}
