package storage

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The btrfs ioctl ABI (include/uapi/linux/btrfs.h). golang.org/x/sys has none
// of it, so the numbers and layouts are spelled out here; every struct's size
// is checked against the kernel's in btrfs_test.go.

const (
	btrfsIoctlMagic = 0x94

	btrfsFirstFreeObjectID = 256 // inode number of every subvolume's root directory

	btrfsSubvolRdonly    = 1 << 1
	btrfsSubvolSpecByID  = 1 << 4
	btrfsSubvolInherit   = 1 << 2 // BTRFS_SUBVOL_QGROUP_INHERIT
	btrfsQuotaCtlEnable  = 1
	btrfsQuotaCtlSimple  = 4
	btrfsQgroupLimitRfer = 1 << 0
	btrfsQgroupLimitExcl = 1 << 1
	btrfsLimitClear      = ^uint64(0)
)

func ioc(dir, nr, size uintptr) uintptr {
	return dir<<30 | size<<16 | btrfsIoctlMagic<<8 | nr
}

const (
	iocW  = 1
	iocR  = 2
	iocWR = 3
)

type btrfsVolArgs struct {
	Fd   int64
	Name [4088]byte
}

type btrfsVolArgsV2 struct {
	Fd      int64
	Transid uint64
	Flags   uint64
	Unused  [4]uint64
	Name    [4040]byte // union with devid / subvolid (the first 8 bytes)
}

type btrfsQuotaCtlArgs struct {
	Cmd    uint64
	Status uint64
}

type btrfsQgroupLimitArgs struct {
	Qgroupid uint64
	Flags    uint64
	MaxRfer  uint64
	MaxExcl  uint64
	RsvRfer  uint64
	RsvExcl  uint64
}

// btrfsQgroupInherit is struct btrfs_qgroup_inherit with room for one
// qgroup id.
type btrfsQgroupInherit struct {
	Flags         uint64
	NumQgroups    uint64
	NumRefCopies  uint64
	NumExclCopies uint64
	Lim           [5]uint64 // struct btrfs_qgroup_limit
	Qgroups       [1]uint64
}

type btrfsQgroupAssignArgs struct {
	Assign uint64
	Src    uint64
	Dst    uint64
}

type btrfsQuotaRescanArgs struct {
	Flags    uint64
	Progress uint64
	Reserved [6]uint64
}

type btrfsQgroupCreateArgs struct {
	Create   uint64
	Qgroupid uint64
}

type btrfsInoLookupArgs struct {
	Treeid   uint64
	Objectid uint64
	Name     [4080]byte
}

type btrfsRootref struct {
	Treeid uint64
	Dirid  uint64
}

type btrfsSubvolRootrefArgs struct {
	MinTreeid uint64
	Rootref   [255]btrfsRootref
	NumItems  uint8
	Align     [7]byte
}

type btrfsInoLookupUserArgs struct {
	Dirid  uint64
	Treeid uint64
	Name   [256]byte
	Path   [3824]byte
}

type btrfsFsInfoArgs struct {
	MaxID      uint64
	NumDevices uint64
	Fsid       [16]byte
	Rest       [992]byte
}

var (
	iocSubvolCreate     = ioc(iocW, 14, unsafe.Sizeof(btrfsVolArgs{}))
	iocInoLookup        = ioc(iocWR, 18, unsafe.Sizeof(btrfsInoLookupArgs{}))
	iocSnapCreateV2     = ioc(iocW, 23, unsafe.Sizeof(btrfsVolArgsV2{}))
	iocSubvolCreateV2   = ioc(iocW, 24, unsafe.Sizeof(btrfsVolArgsV2{}))
	iocSubvolGetflags   = ioc(iocR, 25, 8)
	iocSubvolSetflags   = ioc(iocW, 26, 8)
	iocFsInfo           = ioc(iocR, 31, unsafe.Sizeof(btrfsFsInfoArgs{}))
	iocQuotaCtl         = ioc(iocWR, 40, unsafe.Sizeof(btrfsQuotaCtlArgs{}))
	iocQgroupAssign     = ioc(iocW, 41, unsafe.Sizeof(btrfsQgroupAssignArgs{}))
	iocQgroupCreate     = ioc(iocW, 42, unsafe.Sizeof(btrfsQgroupCreateArgs{}))
	iocQuotaRescan      = ioc(iocW, 44, unsafe.Sizeof(btrfsQuotaRescanArgs{}))
	iocQgroupLimit      = ioc(iocR, 43, unsafe.Sizeof(btrfsQgroupLimitArgs{}))
	iocGetSubvolRootref = ioc(iocWR, 61, unsafe.Sizeof(btrfsSubvolRootrefArgs{}))
	iocInoLookupUser    = ioc(iocWR, 62, unsafe.Sizeof(btrfsInoLookupUserArgs{}))
	iocSnapDestroyV2    = ioc(iocW, 63, unsafe.Sizeof(btrfsVolArgsV2{}))
)

func ioctl(fd int, req uintptr, arg unsafe.Pointer) error {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
	if e != 0 {
		return e
	}
	return nil
}

// openDir opens a directory for ioctls without following a final symlink.
func openDir(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return fd, nil
}

func setName(dst []byte, name string) error {
	if name == "" || len(name) >= len(dst) || strings.ContainsRune(name, '/') || name == "." || name == ".." {
		return fmt.Errorf("invalid subvolume name %q", name)
	}
	copy(dst, name)
	return nil
}

// isSubvolume reports whether path is the root directory of a btrfs subvolume.
func isSubvolume(path string) (bool, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return false, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Ino != btrfsFirstFreeObjectID {
		return false, nil
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		return false, err
	}
	return uint32(fs.Type) == unix.BTRFS_SUPER_MAGIC, nil
}

// btrfsCreateSubvol makes a subvolume at path; with group (a level-1
// qgroup id, 0 for none) the new subvolume's qgroup is made a member of
// group in the same transaction, so its writes count against group's limit.
func btrfsCreateSubvol(path string, group uint64) error {
	pfd, err := openDir(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if group == 0 {
		var a btrfsVolArgs
		if err := setName(a.Name[:], filepath.Base(path)); err != nil {
			return err
		}
		return ioctl(pfd, iocSubvolCreate, unsafe.Pointer(&a))
	}
	var a btrfsVolArgsV2
	if err := setName(a.Name[:], filepath.Base(path)); err != nil {
		return err
	}
	inh := withInherit(&a, group)
	err = ioctl(pfd, iocSubvolCreateV2, unsafe.Pointer(&a))
	runtime.KeepAlive(inh)
	return err
}

// withInherit points a's qgroup inheritance at a new struct naming group.
func withInherit(a *btrfsVolArgsV2, group uint64) *btrfsQgroupInherit {
	inh := &btrfsQgroupInherit{NumQgroups: 1, Qgroups: [1]uint64{group}}
	a.Flags |= btrfsSubvolInherit
	a.Unused[0] = uint64(unsafe.Sizeof(*inh))
	a.Unused[1] = uint64(uintptr(unsafe.Pointer(inh)))
	return inh
}

// btrfsSnapshot snapshots the subvolume src as dst, a member of qgroup
// group (0: none) like btrfsCreateSubvol's.
func btrfsSnapshot(src, dst string, readonly bool, group uint64) error {
	sfd, err := openDir(src)
	if err != nil {
		return err
	}
	defer unix.Close(sfd)
	pfd, err := openDir(filepath.Dir(dst))
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	a := btrfsVolArgsV2{Fd: int64(sfd)}
	if readonly {
		a.Flags = btrfsSubvolRdonly
	}
	if err := setName(a.Name[:], filepath.Base(dst)); err != nil {
		return err
	}
	var inh *btrfsQgroupInherit
	if group != 0 {
		inh = withInherit(&a, group)
	}
	err = ioctl(pfd, iocSnapCreateV2, unsafe.Pointer(&a))
	runtime.KeepAlive(inh)
	return err
}

// btrfsSubvolID returns the id (tree id, also the level-0 qgroup id) of the
// subvolume fd is in.
func btrfsSubvolID(fd int) (uint64, error) {
	a := btrfsInoLookupArgs{Objectid: btrfsFirstFreeObjectID}
	if err := ioctl(fd, iocInoLookup, unsafe.Pointer(&a)); err != nil {
		return 0, fmt.Errorf("BTRFS_IOC_INO_LOOKUP: %w", err)
	}
	return a.Treeid, nil
}

// btrfsRootrefs lists the subvolumes whose directory entries are in the
// subvolume of fd, at any depth of its directories.
func btrfsRootrefs(fd int) ([]btrfsRootref, error) {
	var out []btrfsRootref
	var a btrfsSubvolRootrefArgs
	for {
		err := ioctl(fd, iocGetSubvolRootref, unsafe.Pointer(&a))
		if err != nil && err != unix.EOVERFLOW {
			return nil, fmt.Errorf("BTRFS_IOC_GET_SUBVOL_ROOTREF: %w", err)
		}
		out = append(out, a.Rootref[:a.NumItems]...)
		if err == nil {
			return out, nil
		}
	}
}

// btrfsChildren lists the paths (relative to the subvolume fd's root) of the
// subvolumes directly nested in it.
func btrfsChildren(fd int) ([]string, error) {
	refs, err := btrfsRootrefs(fd)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range refs {
		u := btrfsInoLookupUserArgs{Dirid: r.Dirid, Treeid: r.Treeid}
		if e := ioctl(fd, iocInoLookupUser, unsafe.Pointer(&u)); e != nil {
			if e == unix.ENOENT {
				continue // being deleted
			}
			return nil, fmt.Errorf("BTRFS_IOC_INO_LOOKUP_USER: %w", e)
		}
		out = append(out, filepath.Join(cstr(u.Path[:]), cstr(u.Name[:])))
	}
	return out, nil
}

func cstr(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// btrfsDestroy deletes the subvolume at path together with every subvolume
// nested in it, read-only ones included.
func btrfsDestroy(path string) error {
	fd, err := openDir(path)
	if err != nil {
		return err
	}
	kids, err := btrfsChildren(fd)
	if err == nil && len(kids) > 0 {
		var flags uint64
		if err = ioctl(fd, iocSubvolGetflags, unsafe.Pointer(&flags)); err == nil && flags&btrfsSubvolRdonly != 0 {
			// A read-only parent's directories refuse the unlink of a child.
			flags &^= btrfsSubvolRdonly
			err = ioctl(fd, iocSubvolSetflags, unsafe.Pointer(&flags))
		}
		for _, k := range kids {
			if err != nil {
				break
			}
			err = btrfsDestroy(filepath.Join(path, k))
		}
	}
	unix.Close(fd)
	if err != nil {
		return err
	}
	pfd, err := openDir(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	var a btrfsVolArgsV2
	if err := setName(a.Name[:], filepath.Base(path)); err != nil {
		return err
	}
	if err := ioctl(pfd, iocSnapDestroyV2, unsafe.Pointer(&a)); err != nil {
		return &os.PathError{Op: "BTRFS_IOC_SNAP_DESTROY_V2", Path: path, Err: err}
	}
	return nil
}

// fullQgroups makes a new image use full qgroups even where the kernel has
// simple quotas (tests compare the two).
var fullQgroups = false

// btrfsEnableQuotas turns on simple quotas, or full qgroups where the kernel
// does not know simple quotas. It returns the mode now in force.
func btrfsEnableQuotas(fd int, fsid string) (string, error) {
	if m := quotaMode(fsid); m != "" && m != "disabled" {
		return m, nil
	}
	a := btrfsQuotaCtlArgs{Cmd: btrfsQuotaCtlSimple}
	err := error(unix.EINVAL)
	if !fullQgroups {
		err = ioctl(fd, iocQuotaCtl, unsafe.Pointer(&a))
	}
	if err != nil {
		a = btrfsQuotaCtlArgs{Cmd: btrfsQuotaCtlEnable}
		if err2 := ioctl(fd, iocQuotaCtl, unsafe.Pointer(&a)); err2 != nil {
			return "", fmt.Errorf("BTRFS_IOC_QUOTA_CTL: simple quotas: %v; qgroups: %w", err, err2)
		}
	}
	if m := quotaMode(fsid); m != "" {
		return m, nil
	}
	if err == nil {
		return "squota", nil
	}
	return "qgroup", nil
}

// quotaMode reads /sys/fs/btrfs/FSID/qgroups/mode ("qgroup", "squota"), or
// "disabled" when quotas are off; "" when the kernel does not say.
func quotaMode(fsid string) string {
	dir := filepath.Join("/sys/fs/btrfs", fsid, "qgroups")
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return "disabled"
	}
	b, err := os.ReadFile(filepath.Join(dir, "mode"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func btrfsFsid(fd int) (string, error) {
	var a btrfsFsInfoArgs
	if err := ioctl(fd, iocFsInfo, unsafe.Pointer(&a)); err != nil {
		return "", fmt.Errorf("BTRFS_IOC_FS_INFO: %w", err)
	}
	u := a.Fsid
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16]), nil
}

// btrfsSetLimit limits qgroup id (0: the subvolume fd is in) to bytes
// referenced and exclusive (0 clears the limit).
func btrfsSetLimit(fd int, id uint64, bytes int64) error {
	v := uint64(bytes)
	if bytes == 0 {
		v = btrfsLimitClear
	}
	a := btrfsQgroupLimitArgs{Qgroupid: id, Flags: btrfsQgroupLimitRfer | btrfsQgroupLimitExcl, MaxRfer: v, MaxExcl: v}
	if err := ioctl(fd, iocQgroupLimit, unsafe.Pointer(&a)); err != nil {
		return fmt.Errorf("BTRFS_IOC_QGROUP_LIMIT: %w", err)
	}
	return nil
}

// btrfsAssign makes qgroup src a member of qgroup dst. rescan is true when
// the kernel could not carry the numbers over and marked them inconsistent.
func btrfsAssign(fd int, src, dst uint64) (rescan bool, err error) {
	a := btrfsQgroupAssignArgs{Assign: 1, Src: src, Dst: dst}
	r, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), iocQgroupAssign, uintptr(unsafe.Pointer(&a)))
	switch {
	case e == unix.EEXIST:
		return false, nil
	case e != 0:
		return false, fmt.Errorf("BTRFS_IOC_QGROUP_ASSIGN: %w", e)
	}
	return r > 0, nil
}

// btrfsRescan starts a rescan of the quota numbers (it runs in the
// background; one in progress already is fine).
func btrfsRescan(fd int) error {
	var a btrfsQuotaRescanArgs
	if err := ioctl(fd, iocQuotaRescan, unsafe.Pointer(&a)); err != nil && err != unix.EINPROGRESS {
		return fmt.Errorf("BTRFS_IOC_QUOTA_RESCAN: %w", err)
	}
	return nil
}

// btrfsCreateQgroup makes qgroup id on the filesystem of fd; one that
// exists already is fine.
func btrfsCreateQgroup(fd int, id uint64) error {
	a := btrfsQgroupCreateArgs{Create: 1, Qgroupid: id}
	if err := ioctl(fd, iocQgroupCreate, unsafe.Pointer(&a)); err != nil && err != unix.EEXIST {
		return fmt.Errorf("BTRFS_IOC_QGROUP_CREATE: %w", err)
	}
	return nil
}

// qgroupReferenced reads the referenced bytes of qgroup id (level/number as
// the kernel packs them; a subvolume's id is its level-0 qgroup) from sysfs.
// The kernel updates it at each transaction commit.
func qgroupReferenced(fsid string, id uint64) (int64, error) {
	name := strconv.FormatUint(id>>48, 10) + "_" + strconv.FormatUint(id&(1<<48-1), 10)
	p := filepath.Join("/sys/fs/btrfs", fsid, "qgroups", name, "referenced")
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

func ptr[T any](p *T) unsafe.Pointer { return unsafe.Pointer(p) }
