// Package storage keeps den's sandbox, snapshot and volume trees on a
// filesystem den manages: a btrfs image (DIR/storage.img, a sparse file
// formatted by mkfs.btrfs and loop-mounted at DIR/fs by ioctls from Go) on
// which every tree is a subvolume, so a snapshot or fork is O(1) whatever the
// tree holds and a tree can have a disk quota; or, where btrfs cannot be used
// (not root, no loop devices, no mkfs.btrfs), plain directories under DIR in
// which a snapshot is a full copy (reflinked per file where the filesystem
// can) and there are no quotas. Quotas are btrfs simple quotas (squota,
// kernel 6.7+) where the kernel takes them, else full qgroups. Simple quotas
// charge each extent to the subvolume that wrote it until no tree references
// it: a snapshot or fork costs nothing until it writes, and neither snapshot
// creation nor subvolume deletion pays full qgroups' backref walks (nor
// leaves their numbers inconsistent after a large deletion); the price is
// that a sandbox stays charged for data it deleted while a snapshot of it
// still holds that data (full qgroups would charge its referenced bytes: what
// it sees now). BuildManifest and Manifest.Verify record and check the
// contents of an immutable tree.
package storage

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Config says where den's storage lives and how it is made.
type Config struct {
	Dir  string // den's data dir; the image is Dir/storage.img, mounted at Dir/fs
	Size int64  // bytes for a new image; 0 = default (90% of the free space of Dir's filesystem, at least 1 GiB)
	Mode string // "auto" (btrfs when possible, else plain directories), "btrfs" (error if impossible), "dir"
	// Reserve is the space of den's storage no tree may take (0: the
	// default, DefaultReserve of its size): see Store.Reserve.
	Reserve int64
}

// Store is den's storage: a mounted btrfs or a plain directory. Its methods
// are safe for concurrent use on different paths.
type Store struct {
	kind      string
	why       string
	root      string
	fsid      string
	quotaMode string // "squota", "qgroup" or ""
	dir       string // Config.Dir
	size      int64  // bytes of den's storage (the btrfs, or Dir's filesystem)
	reserve   int64
	group     uint64 // the level-1 qgroup every tree joins (btrfs with quotas), else 0

	mu sync.Mutex
	fd int // the mounted filesystem's root (btrfs), -1 after Close
}

// errImage marks a failure on an existing image: auto mode must not fall
// back to empty directories when the sandboxes' files are in the image.
type errImage struct{ error }

func (e errImage) Unwrap() error { return e.error }

// Open creates or re-mounts den's btrfs image, or uses Dir/fs as it is when
// it is already a mounted btrfs, and enables quotas; in "dir" mode, or in
// "auto" mode when btrfs cannot be used and there is no image yet, it uses
// plain directories under Dir.
func Open(cfg Config) (*Store, error) {
	if cfg.Dir == "" {
		return nil, errors.New("storage: no directory")
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("storage: %w", err)
	}
	if cfg.Size < 0 {
		return nil, fmt.Errorf("storage: negative size %d", cfg.Size)
	}
	mode := cfg.Mode
	if mode == "" {
		mode = "auto"
	}
	if mode != "auto" && mode != "btrfs" && mode != "dir" {
		return nil, fmt.Errorf("storage: unknown mode %q (auto, btrfs or dir)", cfg.Mode)
	}
	if cfg.Reserve < 0 {
		return nil, fmt.Errorf("storage: negative reserve %d", cfg.Reserve)
	}
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, fmt.Errorf("storage: %w", err)
	}
	var s *Store
	if mode == "dir" {
		s = &Store{kind: "dir", why: "storage mode is dir", root: dir, fd: -1}
	} else {
		s, err = openBtrfs(dir, cfg.Size)
		var ie errImage
		if err != nil && (mode == "btrfs" || errors.As(err, &ie)) {
			return nil, fmt.Errorf("storage: %w", err)
		}
		if err != nil {
			s = &Store{kind: "dir", why: err.Error(), root: dir, fd: -1}
		}
	}
	s.dir = dir
	if err := s.setReserve(cfg.Reserve); err != nil {
		s.Close()
		return nil, fmt.Errorf("storage: %w", err)
	}
	return s, nil
}

func openBtrfs(dir string, size int64) (s *Store, err error) {
	fsdir := filepath.Join(dir, "fs")
	image := filepath.Join(dir, "storage.img")
	if !isMountedBtrfs(fsdir) {
		_, statErr := os.Stat(image)
		exists := statErr == nil
		wrap := func(err error) error {
			if exists {
				return errImage{fmt.Errorf("%s: %w", image, err)}
			}
			return err
		}
		if why := btrfsCheck(); why != "" {
			return nil, wrap(errors.New(why))
		}
		if !exists {
			if size == 0 {
				var err error
				if size, err = defaultSize(dir); err != nil {
					return nil, err
				}
			}
			if err := makeImage(image, size); err != nil {
				return nil, err
			}
			exists = true
		}
		if err := os.MkdirAll(fsdir, 0o711); err != nil {
			return nil, wrap(err)
		}
		if err := mountImage(image, fsdir); err != nil {
			return nil, wrap(err)
		}
		defer func() {
			if err != nil {
				unix.Unmount(fsdir, 0)
			}
		}()
	}
	// Mounted by an older den perhaps: no setuid program or device node
	// a sandbox leaves in its files works from here.
	if err := secureMount(fsdir); err != nil {
		return nil, errImage{err}
	}
	fd, err := openDir(fsdir)
	if err != nil {
		return nil, errImage{err}
	}
	s = &Store{kind: "btrfs", root: fsdir, fd: fd}
	if s.fsid, err = btrfsFsid(fd); err != nil {
		unix.Close(fd)
		return nil, errImage{err}
	}
	if err := limitDirty(s.fsid); err != nil {
		s.why = "dirty limit: " + err.Error()
	}
	if m, err := btrfsEnableQuotas(fd, s.fsid); err == nil {
		s.quotaMode = m
	} else {
		s.why = "quotas: " + err.Error()
	}
	return s, nil
}

// Kind is "btrfs" or "dir".
func (s *Store) Kind() string { return s.kind }

// Why says, in dir mode, why btrfs is not used; in btrfs mode without
// quotas, why quotas are off; else "".
func (s *Store) Why() string { return s.why }

// Root is the directory every tree lives under: Dir/fs for btrfs, Dir in dir
// mode.
func (s *Store) Root() string { return s.root }

// Quotas reports whether SetQuota works.
func (s *Store) Quotas() bool { return s.quotaMode != "" }

// QuotaMode is "squota" (simple quotas), "qgroup" (full qgroups) or "" (no
// quotas).
func (s *Store) QuotaMode() string { return s.quotaMode }

// path checks that p names something strictly under Root(), with no
// symbolic link in its directories leading elsewhere, and returns it clean.
func (s *Store) path(p string) (string, error) {
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("path %q is not absolute", p)
	}
	p = filepath.Clean(p)
	rel, err := filepath.Rel(s.root, p)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("path %s is not under %s", p, s.root)
	}
	parent, err := filepath.EvalSymlinks(filepath.Dir(p))
	if err != nil {
		return "", err
	}
	root, err := filepath.EvalSymlinks(s.root)
	if err != nil {
		return "", err
	}
	if parent != root && !strings.HasPrefix(parent, root+"/") {
		return "", fmt.Errorf("path %s leads out of %s", p, s.root)
	}
	return filepath.Join(parent, filepath.Base(p)), nil
}

// Create makes a new empty tree at path (a subvolume on btrfs); its parent
// must exist and path must not.
func (s *Store) Create(path string) error {
	p, err := s.path(path)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	if s.kind == "btrfs" {
		err = btrfsCreateSubvol(p, s.group)
		if err == unix.EEXIST {
			err = os.ErrExist
		}
	} else {
		err = unix.Mkdir(p, 0o755)
		if err == nil {
			err = unix.Chmod(p, 0o755) // whatever the umask
		} else if err == unix.EEXIST {
			err = os.ErrExist
		}
	}
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	return nil
}

// Snapshot makes dst a copy of the tree at src. On btrfs, when src is a
// subvolume, it is a subvolume snapshot (O(1); read-only if asked), which
// does not include subvolumes nested in src (they show as empty
// directories). Otherwise dst is a full copy preserving owners, modes, times,
// extended attributes (overlayfs's trusted.* included), symbolic and hard
// links, device nodes and holes, each file reflinked where the filesystem
// can; on btrfs the copy is made in a new subvolume (read-only if asked), in
// dir mode readonly is not enforced. dst must not exist; on failure nothing
// is left at dst.
func (s *Store) Snapshot(src, dst string, readonly bool) error {
	err := s.snapshot(src, dst, readonly)
	if err != nil {
		return fmt.Errorf("snapshot %s as %s: %w", src, dst, err)
	}
	return nil
}

func (s *Store) snapshot(src, dst string, readonly bool) error {
	sp, err := s.path(src)
	if err != nil {
		return err
	}
	dp, err := s.path(dst)
	if err != nil {
		return err
	}
	if fi, err := os.Lstat(sp); err != nil {
		return err
	} else if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", src)
	}
	if _, err := os.Lstat(dp); err == nil {
		return fmt.Errorf("%s: %w", dst, os.ErrExist)
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if s.kind == "btrfs" {
		if sub, err := isSubvolume(sp); err != nil {
			return err
		} else if sub {
			err := btrfsSnapshot(sp, dp, readonly, s.group)
			if err == unix.EEXIST {
				err = os.ErrExist
			}
			return err
		}
	}
	tmp, err := tempName(dp)
	if err != nil {
		return err
	}
	if s.kind == "btrfs" {
		err = btrfsCreateSubvol(tmp, s.group)
	} else {
		err = unix.Mkdir(tmp, 0o700)
	}
	if err != nil {
		return fmt.Errorf("create %s: %w", tmp, err)
	}
	err = copyTree(sp, tmp)
	if err == nil && readonly && s.kind == "btrfs" {
		err = setReadonly(tmp)
	}
	if err == nil {
		err = unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, dp, unix.RENAME_NOREPLACE)
		if err != nil {
			err = fmt.Errorf("rename to %s: %w", dp, err)
		}
	}
	if err != nil {
		if derr := s.remove(tmp); derr != nil {
			err = fmt.Errorf("%w (and removing %s: %v)", err, tmp, derr)
		}
	}
	return err
}

func tempName(p string) (string, error) {
	var b [6]byte
	if _, err := unix.Getrandom(b[:], 0); err != nil {
		return "", err
	}
	return filepath.Join(filepath.Dir(p), fmt.Sprintf(".%s.tmp-%x", filepath.Base(p), b)), nil
}

func setReadonly(path string) error {
	fd, err := openDir(path)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var flags uint64
	if err := ioctl(fd, iocSubvolGetflags, ptr(&flags)); err != nil {
		return fmt.Errorf("BTRFS_IOC_SUBVOL_GETFLAGS: %w", err)
	}
	flags |= btrfsSubvolRdonly
	if err := ioctl(fd, iocSubvolSetflags, ptr(&flags)); err != nil {
		return fmt.Errorf("BTRFS_IOC_SUBVOL_SETFLAGS: %w", err)
	}
	return nil
}

// Delete removes the tree at path: a subvolume (with the subvolumes nested
// in it, read-only ones too) or a directory tree. A missing path is not an
// error.
func (s *Store) Delete(path string) error {
	p, err := s.path(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err == nil {
		err = s.remove(p)
	}
	if err != nil {
		return fmt.Errorf("delete %s: %w", path, err)
	}
	return nil
}

func (s *Store) remove(p string) error {
	fi, err := os.Lstat(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	if s.kind != "btrfs" || !fi.IsDir() {
		return RemoveTree(p)
	}
	if err := notMountRoot(p); err != nil {
		return err
	}
	if sub, err := isSubvolume(p); err != nil {
		return err
	} else if sub {
		return btrfsDestroy(p)
	}
	// A plain directory on btrfs: subvolumes in it go by ioctl.
	ents, err := os.ReadDir(p)
	if err != nil {
		return err
	}
	for _, e := range ents {
		c := filepath.Join(p, e.Name())
		if e.IsDir() {
			err = s.remove(c)
		} else {
			err = unix.Unlink(c)
		}
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return unix.Rmdir(p)
}

// SetQuota limits the space the subvolume at path may use to bytes (0
// removes the limit). The limit is on both referenced and exclusive bytes:
// under simple quotas both are the bytes of the extents the subvolume itself
// wrote that some tree still references (what a snapshot shares with its
// source stays charged to the source, even after the source deletes it);
// under full qgroups referenced bytes count what a fork shares. A snapshot
// does not inherit its source's limit. Writes past the limit fail with
// EDQUOT.
func (s *Store) SetQuota(path string, bytes int64) error {
	if err := s.setQuota(path, bytes); err != nil {
		return fmt.Errorf("set quota of %s: %w", path, err)
	}
	return nil
}

func (s *Store) setQuota(path string, bytes int64) error {
	if !s.Quotas() {
		why := "storage is plain directories"
		if s.kind == "btrfs" {
			why = "btrfs quotas are off"
		}
		return fmt.Errorf("%s: %w", why, errors.ErrUnsupported)
	}
	if bytes < 0 {
		return fmt.Errorf("negative limit %d", bytes)
	}
	p, err := s.path(path)
	if err != nil {
		return err
	}
	if sub, err := isSubvolume(p); err != nil {
		return err
	} else if !sub {
		return fmt.Errorf("%s is not a subvolume", path)
	}
	fd, err := openDir(p)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return btrfsSetLimit(fd, 0, bytes)
}

// Usage is the space the tree at path uses, in bytes. For a subvolume with
// quotas on it is its qgroup's referenced bytes as of the last transaction
// commit (under simple quotas, what the subvolume itself wrote and some tree
// still references, so a fresh fork uses about 0); otherwise
// the sum of st_blocks*512 over the tree, each inode once.
func (s *Store) Usage(path string) (int64, error) {
	n, err := s.usage(path)
	if err != nil {
		return 0, fmt.Errorf("usage of %s: %w", path, err)
	}
	return n, nil
}

func (s *Store) usage(path string) (int64, error) {
	p, err := s.path(path)
	if err != nil {
		return 0, err
	}
	if s.Quotas() {
		if sub, err := isSubvolume(p); err != nil {
			return 0, err
		} else if sub {
			fd, err := openDir(p)
			if err != nil {
				return 0, err
			}
			id, err := btrfsSubvolID(fd)
			unix.Close(fd)
			if err != nil {
				return 0, err
			}
			return qgroupReferenced(s.fsid, id)
		}
	}
	return walkUsage(p)
}

// Close releases the store's descriptors. The filesystem stays mounted:
// sandboxes keep running across daemon restarts.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fd < 0 {
		return nil
	}
	err := unix.Close(s.fd)
	s.fd = -1
	return err
}

// Unmount closes the store and unmounts its btrfs (the loop device then
// detaches by itself); in dir mode it only closes.
func (s *Store) Unmount() error {
	if err := s.Close(); err != nil {
		return err
	}
	if s.kind != "btrfs" {
		return nil
	}
	if err := unix.Unmount(s.root, 0); err != nil && err != unix.EINVAL {
		return fmt.Errorf("unmount %s: %w", s.root, err)
	}
	return nil
}
