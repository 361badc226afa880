package storage

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestIoctlLayouts(t *testing.T) {
	for name, got := range map[string]uintptr{
		"btrfs_ioctl_vol_args":                      unsafe.Sizeof(btrfsVolArgs{}),
		"btrfs_ioctl_vol_args_v2":                   unsafe.Sizeof(btrfsVolArgsV2{}),
		"btrfs_ioctl_ino_lookup_args":               unsafe.Sizeof(btrfsInoLookupArgs{}),
		"btrfs_ioctl_get_subvol_rootref_args":       unsafe.Sizeof(btrfsSubvolRootrefArgs{}),
		"btrfs_ioctl_ino_lookup_user_args":          unsafe.Sizeof(btrfsInoLookupUserArgs{}),
		"btrfs_ioctl_fs_info_args":                  unsafe.Sizeof(btrfsFsInfoArgs{}) * 4,
		"btrfs_ioctl_qgroup_limit_args (x128)":      unsafe.Sizeof(btrfsQgroupLimitArgs{}) * 4096 / 48,
		"btrfs_ioctl_qgroup_assign_args (x4096/24)": unsafe.Sizeof(btrfsQgroupAssignArgs{}) * 4096 / 24,
		"btrfs_ioctl_quota_rescan_args (x64)":       unsafe.Sizeof(btrfsQuotaRescanArgs{}) * 64,
		"btrfs_ioctl_qgroup_create_args (x256)":     unsafe.Sizeof(btrfsQgroupCreateArgs{}) * 256,
		"btrfs_qgroup_inherit + 1 (x51.2)":          unsafe.Sizeof(btrfsQgroupInherit{}) * 4096 / 80,
	} {
		if got != 4096 {
			t.Errorf("%s: size %d, want 4096", name, got)
		}
	}
	// Two numbers from the kernel's headers, to check ioc().
	if iocSnapCreateV2 != 0x50009417 || iocQuotaCtl != 0xc0109428 {
		t.Errorf("ioctl numbers %#x %#x", iocSnapCreateV2, iocQuotaCtl)
	}
}

// newBtrfs opens a store on a new image of size bytes in a temporary
// directory, unmounted when the test ends; it skips the test where btrfs
// cannot be used.
func newBtrfs(t testing.TB, size int64) *Store {
	t.Helper()
	if why := btrfsPossible(); why != "" {
		t.Skip("btrfs storage impossible here: " + why)
	}
	s, err := Open(Config{Dir: t.TempDir(), Size: size, Mode: "btrfs"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Unmount(); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return s
}

func writeFile(t testing.TB, path string, size int, seed byte) {
	t.Helper()
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(i*7) ^ seed
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func readFile(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func syncFS(t testing.TB, s *Store) {
	t.Helper()
	fd, err := openDir(s.Root())
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		t.Fatal(err)
	}
}

func TestBtrfsSubvolumes(t *testing.T) {
	s := newBtrfs(t, 512<<20)
	if s.Kind() != "btrfs" || s.Root() == "" || !strings.HasSuffix(s.Root(), "/fs") {
		t.Fatalf("kind %q root %q", s.Kind(), s.Root())
	}
	t.Logf("quota mode %q, why %q", s.QuotaMode(), s.Why())
	a := filepath.Join(s.Root(), "a")
	if err := s.Create(a); err != nil {
		t.Fatal(err)
	}
	if err := s.Create(a); !errors.Is(err, os.ErrExist) {
		t.Errorf("create again: %v, want ErrExist", err)
	}
	if sub, _ := isSubvolume(a); !sub {
		t.Fatal("a is not a subvolume")
	}
	os.WriteFile(filepath.Join(a, "f"), []byte("one"), 0o644)

	snap := filepath.Join(s.Root(), "snap")
	fork := filepath.Join(s.Root(), "fork")
	if err := s.Snapshot(a, snap, true); err != nil {
		t.Fatal(err)
	}
	if err := s.Snapshot(snap, fork, false); err != nil {
		t.Fatal(err)
	}
	if err := s.Snapshot(a, fork, false); err == nil || !errors.Is(err, os.ErrExist) || !strings.HasPrefix(err.Error(), "snapshot ") {
		t.Errorf("snapshot onto an existing path: %v", err)
	}
	// Independence: the source, the snapshot and the fork change apart.
	os.WriteFile(filepath.Join(a, "f"), []byte("two"), 0o644)
	os.WriteFile(filepath.Join(a, "new"), nil, 0o644)
	os.WriteFile(filepath.Join(fork, "f"), []byte("three"), 0o644)
	if got := readFile(t, filepath.Join(snap, "f")); got != "one" {
		t.Errorf("snapshot sees %q", got)
	}
	if _, err := os.Stat(filepath.Join(snap, "new")); err == nil {
		t.Error("snapshot sees a file created after it")
	}
	if got := readFile(t, filepath.Join(a, "f")); got != "two" {
		t.Errorf("source sees %q", got)
	}
	if err := os.WriteFile(filepath.Join(snap, "f"), []byte("x"), 0o644); !errors.Is(err, unix.EROFS) {
		t.Errorf("write into a read-only snapshot: %v", err)
	}

	// Delete takes nested subvolumes, read-only ones and a read-only parent.
	if err := s.Create(filepath.Join(a, "inner")); err != nil {
		t.Fatal(err)
	}
	if err := s.Create(filepath.Join(a, "inner", "deeper")); err != nil {
		t.Fatal(err)
	}
	if err := s.Snapshot(filepath.Join(a, "inner"), filepath.Join(a, "inner", "ro"), true); err != nil {
		t.Fatal(err)
	}
	if err := s.Snapshot(a, filepath.Join(s.Root(), "ro-with-kids"), true); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(s.Root(), "plain", "dir"), 0o755)
	if err := s.Snapshot(a, filepath.Join(s.Root(), "plain", "dir", "sub"), false); err != nil {
		t.Fatal(err)
	}
	if err := s.Create(filepath.Join(s.Root(), "ro-with-kids", "x")); !errors.Is(err, unix.EROFS) {
		t.Errorf("create in a read-only snapshot: %v", err)
	}
	for _, p := range []string{a, snap, fork, filepath.Join(s.Root(), "ro-with-kids"), filepath.Join(s.Root(), "plain")} {
		if err := s.Delete(p); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still there: %v", p, err)
		}
		if err := s.Delete(p); err != nil {
			t.Errorf("delete again: %v", err)
		}
	}
	if ents, _ := os.ReadDir(s.Root()); len(ents) != 0 {
		t.Errorf("left in root: %v", ents)
	}
}

func TestPaths(t *testing.T) {
	s, err := Open(Config{Dir: t.TempDir(), Mode: "dir"})
	if err != nil {
		t.Fatal(err)
	}
	os.Symlink("/tmp", filepath.Join(s.Root(), "out"))
	for _, p := range []string{"rel", s.Root(), filepath.Dir(s.Root()), s.Root() + "/../x", s.Root() + "/out/x", "/etc/x"} {
		if err := s.Create(p); err == nil || !strings.HasPrefix(err.Error(), "create ") {
			t.Errorf("create %q: %v", p, err)
		}
	}
	if err := s.Snapshot(s.Root()+"/nope", s.Root()+"/b", false); err == nil || !strings.Contains(err.Error(), "snapshot "+s.Root()+"/nope") {
		t.Errorf("snapshot of a missing tree: %v", err)
	}
	if err := s.Delete(s.Root() + "/no/such/thing"); err != nil {
		t.Errorf("delete of a missing tree: %v", err)
	}
	if err := s.SetQuota(s.Root()+"/x", 1<<20); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("dir-mode quota: %v", err)
	}
	if s.Kind() != "dir" || s.Quotas() || s.Why() == "" {
		t.Errorf("dir store: kind %q quotas %v why %q", s.Kind(), s.Quotas(), s.Why())
	}
	if _, err := Open(Config{Dir: t.TempDir(), Mode: "zfs"}); err == nil {
		t.Error("unknown mode accepted")
	}
}

// TestAutoFallback: auto mode falls back to directories where btrfs cannot
// be used, and says why. As root on a host with btrfs, the test takes btrfs
// away (btrfsCheck), so the fallback runs in CI too.
func TestAutoFallback(t *testing.T) {
	const why = "test: this host has no btrfs"
	if btrfsPossible() == "" {
		btrfsCheck = func() string { return why }
		t.Cleanup(func() { btrfsCheck = btrfsPossible })
	}
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if s.Kind() != "dir" || s.Why() == "" {
		t.Errorf("kind %q why %q", s.Kind(), s.Why())
	}
	if _, err := os.Stat(filepath.Join(dir, "storage.img")); err == nil {
		t.Error("the fallback made a btrfs image")
	}
	// The fallback stores trees: a sandbox's, its snapshot and a fork.
	sb := filepath.Join(s.Root(), "sandbox")
	must(t, s.Create(sb))
	writeFile(t, filepath.Join(sb, "f"), 1<<20, 7)
	snap, fork := filepath.Join(s.Root(), "snap"), filepath.Join(s.Root(), "fork")
	must(t, s.Snapshot(sb, snap, true))
	must(t, s.Snapshot(snap, fork, false))
	if b, err := os.ReadFile(filepath.Join(fork, "f")); err != nil || len(b) != 1<<20 || b[0] != 7 {
		t.Fatalf("fork in the fallback: %d bytes, %v", len(b), err)
	}
	must(t, s.Delete(fork))
	if _, err := os.Stat(fork); err == nil {
		t.Error("delete left the fork")
	}
}

func TestBtrfsReopen(t *testing.T) {
	s := newBtrfs(t, 256<<20)
	dir := filepath.Dir(s.Root())
	v := filepath.Join(s.Root(), "vol")
	if err := s.Create(v); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(v, "data"), 3<<20, 1)

	// Open while mounted: the mounted filesystem is used as it is.
	s2, err := Open(Config{Dir: dir, Mode: "btrfs"})
	if err != nil {
		t.Fatal(err)
	}
	if s2.Root() != s.Root() || s2.QuotaMode() != s.QuotaMode() {
		t.Errorf("second open: root %q quotas %q", s2.Root(), s2.QuotaMode())
	}
	s2.Close()
	if err := s.Unmount(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(v); err == nil {
		t.Fatal("still mounted")
	}
	// Auto mode re-mounts the existing image.
	s3, err := Open(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s3.Unmount() })
	if s3.Kind() != "btrfs" {
		t.Fatalf("re-open: kind %s (%s)", s3.Kind(), s3.Why())
	}
	b, err := os.ReadFile(filepath.Join(v, "data"))
	if err != nil || len(b) != 3<<20 || b[12345] != byte(12345*7%256)^1 {
		t.Fatalf("after re-open: %d bytes, %v", len(b), err)
	}
	if sub, _ := isSubvolume(v); !sub {
		t.Error("vol is no longer a subvolume")
	}
}

// fill writes up to n bytes of non-zero data to path and returns how many it
// wrote and the error that stopped it (a write's or fsync's).
func fill(path string, n int) (int, error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := bytes.Repeat([]byte("den storage quota test\n"), 1<<16/23+1)[:1<<16]
	done := 0
	for done < n {
		k, err := f.Write(buf)
		done += k
		if err != nil {
			return done, err
		}
	}
	return done, f.Sync()
}

func TestBtrfsQuota(t *testing.T) {
	s := newBtrfs(t, 512<<20)
	if !s.Quotas() {
		t.Fatalf("no quotas: %s", s.Why())
	}
	t.Logf("quota mode: %s", s.QuotaMode())
	a, b := filepath.Join(s.Root(), "a"), filepath.Join(s.Root(), "b")
	for _, p := range []string{a, b} {
		if err := s.Create(p); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.SetQuota(a, 50<<20); err != nil {
		t.Fatal(err)
	}
	n, err := fill(filepath.Join(a, "big"), 120<<20)
	if !errors.Is(err, unix.EDQUOT) && !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("wrote %d bytes past a 50 MiB quota: %v", n, err)
	}
	t.Logf("a (50 MiB quota) stopped after %d MiB: %v", n>>20, err)
	if n > 60<<20 {
		t.Errorf("wrote %d MiB under a 50 MiB quota", n>>20)
	}
	if n, err := fill(filepath.Join(b, "big"), 100<<20); err != nil {
		t.Fatalf("b (no quota) stopped after %d bytes: %v", n, err)
	}
	syncFS(t, s)
	ua, _ := s.Usage(a)
	ub, err := s.Usage(b)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("usage: a %d MiB, b %d MiB", ua>>20, ub>>20)
	if ub < 100<<20 || ub > 110<<20 || ua > 60<<20 {
		t.Errorf("usage a %d b %d", ua, ub)
	}

	// Lifting the limit lets a write again.
	if err := s.SetQuota(a, 0); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(a, "big"))
	if n, err := fill(filepath.Join(a, "big2"), 80<<20); err != nil {
		t.Fatalf("a without quota stopped after %d bytes: %v", n, err)
	}

	// What a snapshot that shares all its extents with its source costs.
	snap := filepath.Join(s.Root(), "b-snap")
	if err := s.Snapshot(b, snap, false); err != nil {
		t.Fatal(err)
	}
	syncFS(t, s)
	us, _ := s.Usage(snap)
	ub2, _ := s.Usage(b)
	t.Logf("%s: snapshot of b: usage %d KiB; b now %d MiB", s.QuotaMode(), us>>10, ub2>>20)
	if s.QuotaMode() == "squota" && us > 1<<20 {
		t.Errorf("squota: a snapshot sharing everything uses %d bytes", us)
	}
	// The fork is limited on what it writes itself.
	if err := s.SetQuota(snap, 20<<20); err != nil {
		t.Fatal(err)
	}
	n, err = fill(filepath.Join(snap, "more"), 60<<20)
	t.Logf("fork with a 20 MiB quota stopped after %d MiB: %v", n>>20, err)
	if err == nil {
		t.Error("fork wrote past its quota")
	}
	if err := s.SetQuota(filepath.Join(s.Root(), "nope"), 1); err == nil {
		t.Error("quota on a missing path")
	}
	os.Mkdir(filepath.Join(s.Root(), "plain"), 0o755)
	if err := s.SetQuota(filepath.Join(s.Root(), "plain"), 1<<20); err == nil || !strings.Contains(err.Error(), "not a subvolume") {
		t.Errorf("quota on a plain directory: %v", err)
	}
}

// TestQuotaModes compares simple quotas with full qgroups: both enforce a
// limit; they differ in what a snapshot's shared extents cost whom.
func TestQuotaModes(t *testing.T) {
	quotaModes(t, 512<<20, func(t *testing.T, s *Store, mode string) {
		a := filepath.Join(s.Root(), "a")
		must(t, s.Create(a))
		must(t, s.SetQuota(a, 50<<20))
		n, err := fill(filepath.Join(a, "big"), 80<<20)
		if !errors.Is(err, unix.EDQUOT) {
			t.Errorf("50 MiB quota: wrote %d MiB: %v", n>>20, err)
		}
		must(t, s.SetQuota(a, 0))
		must(t, os.Remove(filepath.Join(a, "big")))
		_, err = fill(filepath.Join(a, "data"), 40<<20)
		must(t, err)
		syncFS(t, s)
		snap := filepath.Join(s.Root(), "snap")
		must(t, s.Snapshot(a, snap, true))
		syncFS(t, s)
		u1, _ := s.Usage(a)
		us, _ := s.Usage(snap)
		must(t, os.Remove(filepath.Join(a, "data")))
		syncFS(t, s)
		u2, _ := s.Usage(a)
		us2, _ := s.Usage(snap)
		t.Logf("%s: 40 MiB written: source %d MiB, its snapshot %d MiB; source deletes the file: source %d MiB, snapshot %d MiB",
			mode, u1>>20, us>>20, u2>>20, us2>>20)
	})
}

// quotaModes runs test in a subtest for each quota mode (simple quotas,
// full qgroups) on a new btrfs image of size bytes; a mode the kernel
// does not have is skipped.
func quotaModes(t *testing.T, size int64, test func(t *testing.T, s *Store, mode string)) {
	for _, full := range []bool{false, true} {
		mode := "squota"
		if full {
			mode = "qgroup"
		}
		t.Run(mode, func(t *testing.T) {
			fullQgroups = full
			s := newBtrfs(t, size)
			fullQgroups = false
			if s.QuotaMode() != mode {
				// Simple quotas came with Linux 6.7: an older host
				// kernel lacks them (a skip); a newer one that did not
				// get them is den's failure.
				if mode == "squota" && !kernelAtLeast(6, 7) {
					t.Skipf("simple quotas need Linux 6.7 (this kernel gave %q)", s.QuotaMode())
				}
				t.Fatalf("quota mode %q, want %q (%s)", s.QuotaMode(), mode, s.Why())
			}
			test(t, s, mode)
		})
	}
}

// kernelAtLeast reports whether the running kernel is major.minor or newer.
func kernelAtLeast(major, minor int) bool {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	var ma, mi int
	fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &ma, &mi)
	return ma > major || ma == major && mi >= minor
}

// TestDetachLoops attaches a loop device (without autoclear, as losetup
// does) to a file under a directory and one outside it: DetachLoops
// detaches the first (the kernel's /sys/block view agrees) and leaves the
// other.
func TestDetachLoops(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("loop devices need root")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("no loop devices here")
	}
	dir, other := t.TempDir(), t.TempDir()
	attach := func(d string) string {
		img := filepath.Join(d, "disk.img")
		if err := os.WriteFile(img, make([]byte, 1<<20), 0o600); err != nil {
			t.Fatal(err)
		}
		dev, fd, err := attachLoop(img)
		if err != nil {
			t.Skipf("cannot attach a loop device: %v", err)
		}
		// No autoclear: closing leaves it attached, as after a crash of
		// a program that set it up so.
		info, err := unix.IoctlLoopGetStatus64(fd)
		if err != nil {
			t.Fatal(err)
		}
		info.Flags &^= unix.LO_FLAGS_AUTOCLEAR
		if err := unix.IoctlLoopSetStatus64(fd, info); err != nil {
			t.Fatal(err)
		}
		unix.Close(fd)
		t.Cleanup(func() {
			if fd, err := unix.Open(dev, unix.O_RDONLY, 0); err == nil {
				unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0)
				unix.Close(fd)
			}
		})
		return dev
	}
	in, out := attach(dir), attach(other)
	backed := func(d string) []string {
		var devs []string
		files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
		for _, f := range files {
			if b, err := os.ReadFile(f); err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), d+"/") {
				devs = append(devs, f)
			}
		}
		return devs
	}
	if len(backed(dir)) != 1 || len(backed(other)) != 1 {
		t.Fatalf("loop devices not attached: %q %q", backed(dir), backed(other))
	}
	gone, err := DetachLoops(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(gone) != 1 || !strings.HasPrefix(gone[0], in+" ") {
		t.Errorf("detached %q, want %s", gone, in)
	}
	if b := backed(dir); len(b) != 0 {
		t.Errorf("still backed by files under %s: %q", dir, b)
	}
	if len(backed(other)) != 1 {
		t.Errorf("%s (outside the directory) was detached", out)
	}
	if gone, err := DetachLoops(dir); err != nil || len(gone) != 0 {
		t.Errorf("second run: %q, %v", gone, err)
	}
}
