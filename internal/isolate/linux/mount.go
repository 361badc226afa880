package linux

import (
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/den-dev/den/internal/host"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/den-dev/den/internal/isolate"
	"golang.org/x/sys/unix"
)

// mountRoot mounts the box's overlays at rootfs in the host's mount
// namespace, then its spec.Mounts inside them. Every lower layer is an
// id-mapped read-only mount, and the upper and work directories are reached
// through one id-mapped mount of spec.Dir, all mapped through ns (the box's
// user namespace): so uppers store canonical ids, root inside being uid 0
// on disk. Nothing id-mapped is ever attached in the host's mount table
// outside rootfs.
func (r *Runtime) mountRoot(spec *isolate.Spec, rootfs string, ns *os.File) (err error) {
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	for _, l := range spec.Layers {
		for _, d := range []string{"upper", "work"} {
			if err := os.MkdirAll(filepath.Join(spec.Dir, d, l.Name), 0o755); err != nil {
				return fmt.Errorf("create layer dir: %w", err)
			}
		}
	}
	if err := r.Canonicalize(spec); err != nil {
		return err
	}
	state, err := idmapped(spec.Dir, ns, false)
	if err != nil {
		return err
	}
	fds = append(fds, state)
	opts := make([]string, len(spec.Layers))
	for i, l := range spec.Layers {
		var lowers []string
		for j := len(l.Lowers) - 1; j >= 0; j-- { // overlayfs wants the top first
			fd, err := idmapped(l.Lowers[j], ns, true)
			if err != nil {
				return err
			}
			fds = append(fds, fd)
			lowers = append(lowers, fmt.Sprintf("/proc/self/fd/%d", fd))
		}
		opts[i] = fmt.Sprintf("lowerdir=%s,upperdir=/proc/self/fd/%d/upper/%s,workdir=/proc/self/fd/%d/work/%s,index=off,metacopy=off,redirect_dir=off,xino=off",
			strings.Join(lowers, ":"), state, l.Name, state, l.Name)
	}
	sources := make([]int, len(spec.Mounts))
	for i, m := range spec.Mounts {
		if sources[i], err = mountSource(m, ns); err != nil {
			return err
		}
		fds = append(fds, sources[i])
	}
	mounted := false
	defer func() {
		if err != nil && mounted {
			unix.Unmount(rootfs, unix.MNT_DETACH) // the overlays and mounts under it too
		}
	}()
	// overlayfs works on its upper directory with the credentials of the
	// mount(2) call, and the id-mapped upper only accepts ids of the box:
	// the box's root must mount it. Directories made for mount targets are
	// the box root's as well.
	return asBoxRoot(spec.UIDBase, func() error {
		for i, l := range spec.Layers {
			err := unix.Mount("overlay", filepath.Join(rootfs, l.Target), "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts[i])
			if err != nil {
				return fmt.Errorf("mount overlay at %s: %w", l.Target, err)
			}
			mounted = true
		}
		if len(spec.Mounts) == 0 {
			return nil
		}
		root, err := unix.Open(rootfs, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open root: %w", err)
		}
		defer unix.Close(root)
		for i, m := range spec.Mounts {
			if err := attachInRoot(root, m.Target, sources[i]); err != nil {
				return fmt.Errorf("mount %s at %s: %w", m.Source, m.Target, err)
			}
		}
		return nil
	})
}

// idmapped returns a detached mount of dir (not its submounts) whose ids
// are shifted by the user namespace ns, read-only if ro.
func idmapped(dir string, ns *os.File, ro bool) (int, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("open_tree %s: %w", dir, err)
	}
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(ns.Fd())}
	if ro {
		attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, attr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("id-map %s: %w (the filesystem must support id-mapped mounts)", dir, err)
	}
	return fd, nil
}

// mountSource checks m and returns a detached mount of its source with its
// attributes set: nosuid and nodev always, read-only and id-mapped through
// ns as m asks.
func mountSource(m isolate.Mount, ns *os.File) (int, error) {
	if !path.IsAbs(m.Target) || path.Clean(m.Target) == "/" {
		return -1, fmt.Errorf("mount target %q: want an absolute path other than /", m.Target)
	}
	if st, err := os.Stat(m.Source); err != nil {
		return -1, fmt.Errorf("mount source: %w", err)
	} else if !st.IsDir() {
		return -1, fmt.Errorf("mount source %s is not a directory", m.Source)
	}
	fd, err := unix.OpenTree(unix.AT_FDCWD, m.Source, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("open_tree %s: %w", m.Source, err)
	}
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if m.ReadOnly {
		attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
	}
	if m.IDMapped {
		attr.Attr_set |= unix.MOUNT_ATTR_IDMAP
		attr.Userns_fd = uint64(ns.Fd())
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, attr); err != nil {
		unix.Close(fd)
		if m.IDMapped {
			return -1, fmt.Errorf("id-map %s: %w (the filesystem must support id-mapped mounts)", m.Source, err)
		}
		return -1, fmt.Errorf("set attributes of %s: %w", m.Source, err)
	}
	return fd, nil
}

// attachInRoot attaches the detached mount src at target, a path resolved
// inside the directory root; missing directories on the way are created
// (mode 0755, by the caller's fsuid).
func attachInRoot(root int, target string, src int) error {
	dir, err := host.MkdirInRoot(root, target)
	if err != nil {
		return err
	}
	defer unix.Close(dir)
	if err := unix.MoveMount(src, "", dir, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("move_mount: %w", err)
	}
	return nil
}

// secbitNoSetuidFixup keeps a thread's capabilities when its (fs)uid
// changes from 0.
const secbitNoSetuidFixup = 1 << 2

// asBoxRoot runs fn on a fresh OS thread whose filesystem uid and gid are
// base (the box's root) but which keeps the daemon's capabilities. The
// thread's credentials are its own (setfsuid is per thread), and the thread
// exits when fn returns, so no other goroutine ever runs with them.
func asBoxRoot(base int, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the goroutine's end takes the thread with it.
		runtime.LockOSThread()
		errc <- func() error {
			bits, err := unix.PrctlRetInt(unix.PR_GET_SECUREBITS, 0, 0, 0, 0)
			if err != nil {
				return fmt.Errorf("get securebits: %w", err)
			}
			if err := unix.Prctl(unix.PR_SET_SECUREBITS, uintptr(bits|secbitNoSetuidFixup), 0, 0, 0); err != nil {
				return fmt.Errorf("set securebits: %w", err)
			}
			unix.RawSyscall(unix.SYS_SETFSGID, uintptr(base), 0, 0)
			unix.RawSyscall(unix.SYS_SETFSUID, uintptr(base), 0, 0)
			// setfsuid never fails; an invalid id returns the current one.
			invalid := uintptr(^uint32(0))
			uid, _, _ := unix.RawSyscall(unix.SYS_SETFSUID, invalid, 0, 0)
			gid, _, _ := unix.RawSyscall(unix.SYS_SETFSGID, invalid, 0, 0)
			if int(uid) != base || int(gid) != base {
				return fmt.Errorf("setfsuid %d: fsuid %d, fsgid %d", base, uid, gid)
			}
			return fn()
		}()
	}()
	return <-errc
}

// Canonicalize converts the upper directories of a stopped box written by
// an older den (owners are host ids) to canonical ids, as Start does; it
// does nothing to canonical ones. Whoever reads a stopped box's uppers
// (commit, snapshot, fork) calls it first. A box still running from before
// the upgrade keeps the old format until it starts again: its uppers must
// not be converted under it.
func (r *Runtime) Canonicalize(spec *isolate.Spec) error {
	for _, l := range spec.Layers {
		upper := filepath.Join(spec.Dir, "upper", l.Name)
		if _, err := os.Lstat(upper); errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err := canonicalUpper(upper, spec.UIDBase); err != nil {
			return err
		}
	}
	return nil
}

// canonicalUpper converts, once, an upper directory written by an older
// den, whose owners are host ids (base+id), to canonical ids. Its root
// owned by base marks that format; it is converted last, so an interrupted
// conversion is finished by the next one (ids below IDRange are canonical
// already and kept).
func canonicalUpper(upper string, base int) error {
	var st unix.Stat_t
	if err := unix.Lstat(upper, &st); err != nil {
		return fmt.Errorf("upper layer: %w", err)
	}
	if int(st.Uid) != base || base < IDRange {
		return nil
	}
	err := filepath.WalkDir(upper, func(p string, _ fs.DirEntry, err error) error {
		if err != nil || p == upper {
			return err
		}
		return shiftOwner(p, base)
	})
	if err == nil {
		err = shiftOwner(upper, base)
	}
	if err != nil {
		return fmt.Errorf("convert upper layer %s to canonical ids: %w", upper, err)
	}
	return nil
}

// canonicalID maps an id of an old-format upper: base+n is n, an id below
// IDRange is canonical already (overlayfs's own whiteouts are 0), and any
// other is the overflow id, as the box saw it.
func canonicalID(id uint32, base int) int {
	switch {
	case int64(id) >= int64(base) && int64(id) < int64(base)+IDRange:
		return int(id) - base
	case id < IDRange:
		return int(id)
	}
	return 65534
}

const xattrCaps = "security.capability"

// shiftOwner gives p (never followed if a symlink) canonical owners,
// keeping the setuid and setgid bits and file capabilities that chown
// clears.
func shiftOwner(p string, base int) error {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return err
	}
	uid, gid := canonicalID(st.Uid, base), canonicalID(st.Gid, base)
	if uid == int(st.Uid) && gid == int(st.Gid) {
		return nil
	}
	regular := st.Mode&unix.S_IFMT == unix.S_IFREG
	var caps []byte
	if regular {
		caps = getxattr(p, xattrCaps)
	}
	if err := unix.Lchown(p, uid, gid); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFLNK && st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
		if err := unix.Chmod(p, st.Mode&0o7777); err != nil {
			return err
		}
	}
	if caps = canonicalCaps(caps, base); caps != nil {
		if err := unix.Lsetxattr(p, xattrCaps, caps, 0); err != nil {
			return fmt.Errorf("restore file capabilities of %s: %w", p, err)
		}
	}
	return nil
}

func getxattr(p, name string) []byte {
	buf := make([]byte, 64)
	n, err := unix.Lgetxattr(p, name, buf)
	if err != nil {
		return nil
	}
	return buf[:n]
}

// canonicalCaps converts a security.capability value of an old-format
// upper: capabilities set inside the box were stored for the namespace
// whose root is base (revision 3); canonically they are the plain revision
// 2 of a file of the root's. Capabilities of a namespace nested in the box
// cannot be kept (nil).
func canonicalCaps(v []byte, base int) []byte {
	const (
		rev2, rev3   = 0x02000000, 0x03000000
		size2, size3 = 20, 24
	)
	if len(v) < size2 {
		return nil
	}
	magic := binary.LittleEndian.Uint32(v)
	switch {
	case magic&0xff000000 == rev2 && len(v) == size2:
		return v
	case magic&0xff000000 == rev3 && len(v) == size3 && int64(binary.LittleEndian.Uint32(v[size2:])) == int64(base):
		out := append([]byte(nil), v[:size2]...)
		binary.LittleEndian.PutUint32(out, magic&^0xff000000|rev2)
		return out
	}
	return nil
}
