package storage

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestReserve: trees without quotas of their own fill den's btrfs only up
// to its reserve (EDQUOT, not ENOSPC), and the filesystem keeps room for
// new trees and snapshots; Room says the storage is full, and says so no
// more once space is freed. Under both quota modes.
func TestReserve(t *testing.T) {
	quotaModes(t, 1<<30, func(t *testing.T, s *Store, mode string) {
		if !s.ReserveEnforced() {
			t.Fatalf("reserve not enforced: %s", s.Why())
		}
		if s.Reserve() != DefaultReserve(s.Size()) || s.Size() < 900<<20 {
			t.Fatalf("size %d reserve %d", s.Size(), s.Reserve())
		}
		a, b := filepath.Join(s.Root(), "a"), filepath.Join(s.Root(), "b")
		must(t, s.Create(a))
		must(t, s.Create(b))
		must(t, s.Room())
		n, err := fill(filepath.Join(a, "big"), 2<<30)
		t.Logf("%s: a filled %d MiB of %d MiB (reserve %d MiB): %v", mode, n>>20, s.Size()>>20, s.Reserve()>>20, err)
		if !errors.Is(err, unix.EDQUOT) {
			t.Fatalf("filling the storage ended with %v, want EDQUOT (the reserve's limit)", err)
		}
		syncFS(t, s)
		if err := s.Room(); err == nil || !strings.Contains(err.Error(), "den's storage is full") {
			t.Fatalf("Room with the trees' share used up: %v", err)
		}
		// The filesystem itself is not full: den can still make
		// trees and snapshots.
		must(t, s.Create(filepath.Join(s.Root(), "c")))
		must(t, s.Snapshot(b, filepath.Join(s.Root(), "b-snap"), true))
		must(t, s.Snapshot(filepath.Join(s.Root(), "b-snap"), filepath.Join(s.Root(), "b-fork"), false))
		must(t, os.WriteFile(filepath.Join(s.Root(), "daemon-file"), []byte("state"), 0o600))
		// Freed space is usable again.
		must(t, os.Remove(filepath.Join(a, "big")))
		waitRoom(t, s)
		if _, err := fill(filepath.Join(b, "f"), 64<<20); err != nil {
			t.Fatalf("writing after space was freed: %v", err)
		}
	})
}

// waitRoom waits for Room to pass: btrfs frees a deleted subvolume's
// extents in the background.
func waitRoom(t *testing.T, s *Store) {
	t.Helper()
	var err error
	for i := 0; i < 100; i++ {
		syncFS(t, s)
		if err = s.Room(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	out, _ := exec.Command("sh", "-c", "cd /sys/fs/btrfs/"+s.fsid+"/qgroups && grep . */referenced */exclusive; btrfs subvolume list -d "+s.Root()+"; btrfs fi df "+s.Root()).CombinedOutput()
	t.Fatalf("no room after freeing space: %v\n%s", err, out)
}

// TestRoomDir: in dir mode Room refuses once the filesystem's free space
// falls into the reserve (a small tmpfs stands for the host's disk).
func TestRoomDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=512m"); err != nil {
		t.Skipf("tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	s, err := Open(Config{Dir: dir, Mode: "dir"})
	if err != nil {
		t.Fatal(err)
	}
	if s.Size() != 512<<20 || s.Reserve() != 256<<20 || s.ReserveEnforced() {
		t.Fatalf("size %d reserve %d enforced %v", s.Size(), s.Reserve(), s.ReserveEnforced())
	}
	must(t, s.Room())
	must(t, s.Create(filepath.Join(dir, "a")))
	if _, err := fill(filepath.Join(dir, "a", "big"), 300<<20); err != nil {
		t.Fatal(err)
	}
	if err := s.Room(); err == nil || !strings.Contains(err.Error(), "nearly full") {
		t.Fatalf("Room with %d MiB of 512 used: %v", 300, err)
	}
	must(t, os.Remove(filepath.Join(dir, "a", "big")))
	must(t, s.Room())
	if _, err := Open(Config{Dir: dir, Mode: "dir", Reserve: 1 << 40}); err == nil || !strings.Contains(err.Error(), "not below") {
		t.Fatalf("a reserve larger than the storage: %v", err)
	}
}

// TestReserveAdoptsOldTrees: trees made before den had a reserve (outside
// its qgroup) join it when the storage is opened again, so they too stop
// at the reserve.
func TestReserveAdoptsOldTrees(t *testing.T) {
	quotaModes(t, 1<<30, func(t *testing.T, s *Store, mode string) {
		dir := filepath.Dir(s.Root())
		// A tree as an older den made it: no group.
		must(t, os.Mkdir(filepath.Join(s.Root(), "sandboxes"), 0o700))
		old := filepath.Join(s.Root(), "sandboxes", "old")
		must(t, btrfsCreateSubvol(old, 0))
		if _, err := fill(filepath.Join(old, "before"), 100<<20); err != nil {
			t.Fatal(err)
		}
		must(t, s.Unmount())
		s2, err := Open(Config{Dir: dir, Mode: "btrfs"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s2.Unmount() })
		if !s2.ReserveEnforced() {
			t.Fatalf("reserve not enforced after reopening: %s", s2.Why())
		}
		n, err := fill(filepath.Join(old, "big"), 2<<30)
		t.Logf("%s: the old tree then wrote %d MiB: %v", mode, n>>20, err)
		if !errors.Is(err, unix.EDQUOT) {
			t.Fatalf("an old tree filling the storage: %v, want EDQUOT from the reserve", err)
		}
	})
}

// TestRoomHostFull: with den's btrfs in a sparse image, Room refuses new
// trees once the host filesystem holding the image is nearly full (a
// tmpfs stands for the host's disk), though the btrfs itself has room.
func TestRoomHostFull(t *testing.T) {
	if why := btrfsPossible(); why != "" {
		t.Skip("btrfs storage impossible here: " + why)
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1536m"); err != nil {
		t.Skipf("tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	s, err := Open(Config{Dir: dir, Size: 1 << 30, Mode: "btrfs"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Unmount() })
	must(t, s.Room())
	// Something else on the host takes its disk.
	if _, err := fill(filepath.Join(dir, "other"), 1300<<20); err != nil {
		t.Fatal(err)
	}
	err = s.Room()
	if err == nil || !strings.Contains(err.Error(), "host filesystem holding "+dir+" is nearly full") {
		t.Fatalf("Room with the host nearly full: %v", err)
	}
	must(t, os.Remove(filepath.Join(dir, "other")))
	must(t, s.Room())
}
