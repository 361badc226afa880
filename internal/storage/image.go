package storage

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

const (
	minImageSize = 1 << 30 // floor of the default size
	// smallestImage is what mkfs.btrfs accepts for one device (btrfs-progs
	// 6.2 refuses less than 114 MiB, or about 110 MiB in mixed mode).
	smallestImage = 128 << 20
	// mixedBelow: images smaller than this use mixed data+metadata block
	// groups, so a small test image does not run out of one kind of chunk
	// while the other has room.
	mixedBelow = 1 << 30
)

// mountOptions are the btrfs options of den's image, mounted with MS_NOATIME
// (reads never dirty metadata, which would also unshare snapshot metadata).
// discard=async: space freed in the image is punched out of the sparse
// backing file, so deleting sandboxes gives the host its disk back.
// Flushes still go to the backing file (no nobarrier), so a host crash loses
// at most the last commit, never the filesystem: with the loop device in
// direct I/O mode, snapshot commits measured 2-15 ms, so nobarrier,
// commit= or flushoncommit changes buy nothing worth that risk.
const mountOptions = "discard=async,space_cache=v2"

// loopFlags are the loop device's flags: autoclear (the device goes away
// with the last unmount) and direct I/O to the backing file (no second copy
// of every block in the host's page cache).
var loopFlags uint32 = unix.LO_FLAGS_AUTOCLEAR | unix.LO_FLAGS_DIRECT_IO

// defaultSize is 90% of the free space of dir's filesystem, at least 1 GiB.
func defaultSize(dir string) (int64, error) {
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	n := int64(float64(fs.Bavail) * float64(fs.Bsize) * 0.9)
	return max(n, minImageSize) &^ (1<<20 - 1), nil
}

// findMkfs finds mkfs.btrfs in PATH or the sbin directories (a daemon's
// PATH may lack them).
func findMkfs() (string, error) {
	if p, err := exec.LookPath("mkfs.btrfs"); err == nil {
		return p, nil
	}
	for _, d := range []string{"/usr/sbin", "/sbin", "/usr/local/sbin"} {
		p := filepath.Join(d, "mkfs.btrfs")
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errors.New("mkfs.btrfs not found (install btrfs-progs)")
}

// btrfsCheck is what Open asks whether btrfs can be used: btrfsPossible,
// or in tests a host without it (so that the fallback runs as root too).
var btrfsCheck = btrfsPossible

// btrfsPossible says why a btrfs image cannot be used here, or "" if it can.
func btrfsPossible() string {
	if os.Geteuid() != 0 {
		return "not root"
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		return "no loop devices (/dev/loop-control: " + errors.Unwrap(err).Error() + ")"
	}
	if b, err := os.ReadFile("/proc/filesystems"); err == nil && !bytes.Contains(b, []byte("\tbtrfs\n")) {
		// The module may still load on mount; try it.
		if _, err := exec.LookPath("modprobe"); err == nil {
			_ = exec.Command("modprobe", "btrfs").Run()
		}
		if b, err := os.ReadFile("/proc/filesystems"); err == nil && !bytes.Contains(b, []byte("\tbtrfs\n")) {
			return "the kernel has no btrfs"
		}
	}
	if _, err := findMkfs(); err != nil {
		return err.Error()
	}
	return ""
}

// makeImage creates a sparse file of size bytes and formats it, at a
// temporary name first so that a failure leaves no half-made image.
func makeImage(image string, size int64) error {
	if size < smallestImage {
		return fmt.Errorf("mkfs.btrfs: image size %d is below the minimum %d", size, smallestImage)
	}
	mkfs, err := findMkfs()
	if err != nil {
		return fmt.Errorf("mkfs.btrfs: %w", err)
	}
	tmp := image + ".new"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("create image: %w", err)
	}
	defer os.Remove(tmp)
	// On a btrfs host, copy-on-write under a loop device only fragments.
	_ = setNoCOW(int(f.Fd()))
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("create image: %w", err)
	}
	args := []string{"-q", "-f", "-L", "den"}
	if size < mixedBelow {
		args = append(args, "--mixed")
	}
	out, err := exec.Command(mkfs, append(args, tmp)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mkfs.btrfs: %v: %s", err, strings.TrimSpace(string(out)))
	}
	if err := os.Rename(tmp, image); err != nil {
		return fmt.Errorf("create image: %w", err)
	}
	return nil
}

func setNoCOW(fd int) error {
	flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
	if err != nil {
		return err
	}
	return unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, int(flags|fsNOCOWFL))
}

// attachLoop binds image to a free loop device and returns an open
// descriptor of the device; with autoclear, the device detaches when that
// descriptor is closed and the filesystem on it is unmounted.
func attachLoop(image string) (string, int, error) {
	img, err := unix.Open(image, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", -1, fmt.Errorf("loop: open image: %w", err)
	}
	defer unix.Close(img)
	ctl, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", -1, fmt.Errorf("loop: %w", err)
	}
	defer unix.Close(ctl)
	var last error
	for range 20 {
		n, err := unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", -1, fmt.Errorf("loop: LOOP_CTL_GET_FREE: %w", err)
		}
		dev := fmt.Sprintf("/dev/loop%d", n)
		fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) {
			// A /dev without udev (a container): make the node.
			if err = unix.Mknod(dev, unix.S_IFBLK|0o660, int(unix.Mkdev(7, uint32(n)))); err == nil || errors.Is(err, unix.EEXIST) {
				fd, err = unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
			}
		}
		if err != nil {
			return "", -1, fmt.Errorf("loop: open %s: %w", dev, err)
		}
		cfg := unix.LoopConfig{Fd: uint32(img), Size: 4096}
		cfg.Info.Flags = loopFlags
		copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], image)
		err = unix.IoctlLoopConfigure(fd, &cfg)
		if err != nil && cfg.Info.Flags&unix.LO_FLAGS_DIRECT_IO != 0 && errors.Is(err, unix.EINVAL) {
			// A backing filesystem without O_DIRECT: buffered I/O.
			cfg.Info.Flags &^= unix.LO_FLAGS_DIRECT_IO
			err = unix.IoctlLoopConfigure(fd, &cfg)
		}
		if err == nil {
			return dev, fd, nil
		}
		unix.Close(fd)
		last = err
		if !errors.Is(err, unix.EBUSY) {
			break
		}
		time.Sleep(10 * time.Millisecond) // someone else took it first
	}
	return "", -1, fmt.Errorf("loop: LOOP_CONFIGURE: %w", last)
}

// mountImage attaches image to a loop device and mounts it at dir.
func mountImage(image, dir string) error {
	waitLoopsGone(image, 5*time.Second)
	dev, fd, err := attachLoop(image)
	if err != nil {
		return err
	}
	defer unix.Close(fd) // after the mount: autoclear then waits for the unmount
	if err := unix.Mount(dev, dir, "btrfs", unix.MS_NOATIME|unix.MS_NOSUID|unix.MS_NODEV, mountOptions); err != nil {
		return fmt.Errorf("mount %s on %s: %w", dev, dir, err)
	}
	return nil
}

// isMountedBtrfs reports whether dir is the root of a mounted btrfs.
func isMountedBtrfs(dir string) bool {
	var fs unix.Statfs_t
	if unix.Statfs(dir, &fs) != nil || uint32(fs.Type) != unix.BTRFS_SUPER_MAGIC {
		return false
	}
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, dir, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_INO, &st); err != nil {
		return false
	}
	return st.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 && st.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0
}

const fsNOCOWFL = 0x00800000 // FS_NOCOW_FL, linux/fs.h

// dirtyLimit bounds the dirty page cache of den's btrfs (its bdi's max_bytes
// with strict_limit): a snapshot first writes out the subvolume's dirty
// data, so this bounds a snapshot's latency whatever a sandbox just wrote;
// writers past it are throttled to the disk's speed.
var dirtyLimit int64 = 256 << 20

// limitDirty applies dirtyLimit to the filesystem fsid (settings under
// /sys/class/bdi do not outlive the mount, so each Open sets them).
func limitDirty(fsid string) error {
	if dirtyLimit <= 0 {
		return nil
	}
	bdi := filepath.Join("/sys/fs/btrfs", fsid, "bdi")
	if err := os.WriteFile(filepath.Join(bdi, "max_bytes"), []byte(fmt.Sprint(dirtyLimit)), 0); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(bdi, "strict_limit"), []byte("1"), 0)
}

// waitLoopsGone waits (up to limit) until no loop device is backed by
// image: after an unmount, an autoclear loop device is torn down
// asynchronously, and mounting the same filesystem through a new loop
// device while the old one is still registered with btrfs can read a stale
// view of it.
func waitLoopsGone(image string, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for {
		busy := len(loopsBacking(func(file string) bool { return file == image })) > 0
		if !busy || time.Now().After(deadline) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// loopsBacking lists the loop devices (/dev/loopN) whose backing file
// match accepts.
func loopsBacking(match func(file string) bool) []string {
	var devs []string
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		file := strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")
		if match(file) {
			devs = append(devs, "/dev/"+filepath.Base(filepath.Dir(filepath.Dir(f))))
		}
	}
	return devs
}

// DetachLoops detaches every loop device backed by a file under dir (den
// system reset, once nothing is mounted from them) and returns them as
// "/dev/loopN (FILE)".
func DetachLoops(dir string) ([]string, error) {
	dir = filepath.Clean(dir)
	var gone []string
	var errs []error
	under := func(file string) bool { return strings.HasPrefix(file, dir+"/") }
	for _, dev := range loopsBacking(under) {
		b, _ := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop/backing_file"))
		fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errs = append(errs, fmt.Errorf("detach %s: %w", dev, err))
			continue
		}
		err = unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0)
		unix.Close(fd)
		if err != nil && !errors.Is(err, unix.ENXIO) { // ENXIO: it detached meanwhile (autoclear)
			errs = append(errs, fmt.Errorf("detach %s: %w", dev, err))
			continue
		}
		gone = append(gone, dev+" ("+strings.TrimSpace(string(b))+")")
	}
	// LOOP_CLR_FD on a device still open elsewhere only marks it
	// autoclear: wait (briefly) until the kernel lets them go.
	deadline := time.Now().Add(5 * time.Second)
	for len(loopsBacking(under)) > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if left := loopsBacking(under); len(left) > 0 {
		errs = append(errs, fmt.Errorf("loop devices still backed by files under %s (open elsewhere?): %s", dir, strings.Join(left, ", ")))
	}
	return gone, errors.Join(errs...)
}
