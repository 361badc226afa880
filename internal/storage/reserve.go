package storage

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// A reserve keeps part of den's storage out of every tree's reach, so that
// one sandbox (or many, whose quotas together overcommit the storage)
// filling its trees never fills the filesystem itself: btrfs keeps room for
// its metadata (a btrfs with no free space can fail even to delete files),
// and the daemon can still make trees, snapshots and forks. On btrfs with
// quotas the reserve is enforced by the kernel: every tree den makes is
// born a member of one level-1 qgroup (denGroup) whose limit is the
// storage's size minus the reserve, so writes past it fail with EDQUOT in
// whichever tree makes them. Without quotas (plain directories) nothing
// stops a write; Room then at least refuses new trees once the free space
// falls into the reserve.

// denGroup is the qgroup 1/1: every subvolume den makes is in it.
const denGroup = 1<<48 | 1

// minRoom is the room a new tree needs below the reserve: less, and Room
// refuses.
const minRoom = 64 << 20

// DefaultReserve is the reserve of storage of size bytes when none is
// configured: a tenth of it, at least 256 MiB (but no more than half) and
// at most 10 GiB. (A new btrfs allocates about 120 MiB to metadata at once,
// out of the reserve: on btrfs it is room for the filesystem's metadata,
// not for data.)
func DefaultReserve(size int64) int64 {
	return min(max(size/10, min(256<<20, size/2)), 10<<30)
}

// setReserve sizes the store and applies a reserve of r bytes (0: the
// default).
func (s *Store) setReserve(r int64) error {
	var fs unix.Statfs_t
	if err := unix.Statfs(s.root, &fs); err != nil {
		return fmt.Errorf("statfs %s: %w", s.root, err)
	}
	s.size = int64(fs.Blocks) * fs.Bsize
	if r == 0 {
		r = DefaultReserve(s.size)
	}
	if r >= s.size {
		return fmt.Errorf("reserve of %s is not below the storage's size of %s", mib(r), mib(s.size))
	}
	s.reserve = r
	if s.kind != "btrfs" || !s.Quotas() {
		return nil
	}
	if err := btrfsCreateQgroup(s.fd, denGroup); err != nil {
		s.why = "reserve: " + err.Error()
		return nil
	}
	if err := btrfsSetLimit(s.fd, denGroup, s.size-r); err != nil {
		s.why = "reserve: " + err.Error()
		return nil
	}
	if err := adoptTrees(s.fd); err != nil {
		s.why = "reserve: " + err.Error()
		return nil
	}
	s.group = denGroup
	return nil
}

// adoptTrees makes every subvolume in the root subvolume of fd (trees
// made before den had a reserve, or made by hand) a member of denGroup;
// where the kernel cannot carry the numbers over (full qgroups, a tree
// with data) it rescans them.
func adoptTrees(fd int) error {
	refs, err := btrfsRootrefs(fd)
	if err != nil {
		return err
	}
	rescan := false
	for _, ref := range refs {
		r, err := btrfsAssign(fd, ref.Treeid, denGroup)
		if err != nil {
			return fmt.Errorf("subvolume %d: %w", ref.Treeid, err)
		}
		rescan = rescan || r
	}
	if rescan {
		return btrfsRescan(fd)
	}
	return nil
}

// Size is the size of den's storage in bytes: the btrfs den manages, or in
// dir mode the filesystem the directories are on.
func (s *Store) Size() int64 { return s.size }

// Reserve is the part of Size no tree may use. On btrfs with quotas the
// kernel enforces it (ReserveEnforced); otherwise Room only refuses new
// trees once free space falls into it.
func (s *Store) Reserve() int64 { return s.reserve }

// ReserveEnforced reports whether the kernel keeps trees out of the
// reserve.
func (s *Store) ReserveEnforced() bool { return s.group != 0 }

// Room returns nil when den's storage, and the host filesystem under it,
// have room for a new tree; else an error saying which is full and by how
// much.
func (s *Store) Room() error {
	if s.group != 0 {
		if used, err := qgroupReferenced(s.fsid, s.group); err == nil && s.size-s.reserve-used < minRoom {
			return fmt.Errorf("den's storage is full: sandboxes, snapshots and volumes use %s of the %s they may (%s is kept in reserve)",
				mib(used), mib(s.size-s.reserve), mib(s.reserve))
		}
	}
	if free, _, err := statFree(s.root); err == nil && s.group == 0 && free < s.reserve+minRoom {
		return fmt.Errorf("den's storage is nearly full: %s free of %s, below the reserve of %s", mib(free), mib(s.size), mib(s.reserve))
	}
	if s.kind == "btrfs" {
		// The image is sparse: it takes host disk as it fills.
		if free, total, err := statFree(s.dir); err == nil && free < DefaultReserve(total) {
			return fmt.Errorf("the host filesystem holding %s is nearly full (%s free of %s): den's storage image could not grow", s.dir, mib(free), mib(total))
		}
	}
	return nil
}

// statFree is the bytes free for unprivileged writers and the size of the
// filesystem holding path.
func statFree(path string) (free, total int64, err error) {
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		return 0, 0, err
	}
	return int64(fs.Bavail) * fs.Bsize, int64(fs.Blocks) * fs.Bsize, nil
}

// mib formats bytes for messages.
func mib(n int64) string {
	if n >= 10<<30 {
		return fmt.Sprintf("%d GiB", n>>30)
	}
	return fmt.Sprintf("%d MiB", n>>20)
}
