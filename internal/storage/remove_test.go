package storage

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// bindTree makes root/tree/{a,sub/b} and a directory "host" holding
// host/keep, bind-mounted at root/tree/sub/mnt (as a volume or host
// directory is in a sandbox root a dead daemon left mounted).
func bindTree(t *testing.T) (tree, host, mnt string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("bind mounts need root")
	}
	root := t.TempDir()
	tree = filepath.Join(root, "tree")
	host = filepath.Join(root, "host")
	mnt = filepath.Join(tree, "sub", "mnt")
	for _, d := range []string{host, mnt} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{filepath.Join(host, "keep"), filepath.Join(tree, "a"), filepath.Join(tree, "sub", "b")} {
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mount(host, mnt, "", unix.MS_BIND, ""); err != nil {
		t.Skipf("bind mount: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	return tree, host, mnt
}

func TestRemoveTreeStopsAtMounts(t *testing.T) {
	// Control: os.RemoveAll walks through the bind mount and deletes the
	// mounted directory's files.
	tree, host, mnt := bindTree(t)
	os.RemoveAll(tree)
	if _, err := os.Stat(filepath.Join(host, "keep")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("control: os.RemoveAll left host/keep (err %v): the test cannot show the difference", err)
	}
	unix.Unmount(mnt, unix.MNT_DETACH)

	tree, host, mnt = bindTree(t)
	err := RemoveTree(tree)
	if !errors.Is(err, ErrMountPoint) {
		t.Fatalf("RemoveTree across a bind mount: %v, want ErrMountPoint", err)
	}
	if _, err := os.Stat(filepath.Join(host, "keep")); err != nil {
		t.Fatalf("RemoveTree deleted a file of the mounted directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join(mnt, "keep")); err != nil {
		t.Fatalf("the mount is gone: %v", err)
	}
	// Everything not under the mount went.
	for _, f := range []string{filepath.Join(tree, "a"), filepath.Join(tree, "sub", "b")} {
		if _, err := os.Lstat(f); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: %v, want removed", f, err)
		}
	}
	// The mount point itself is refused.
	if err := RemoveTree(mnt); !errors.Is(err, ErrMountPoint) {
		t.Fatalf("RemoveTree of a mount point: %v, want ErrMountPoint", err)
	}

	// Once unmounted (as recovery does), the rest goes.
	gone, err := UnmountUnder(tree)
	if err != nil || !slices.Equal(gone, []string{mnt}) {
		t.Fatalf("UnmountUnder: %v, %v; want [%s]", gone, err, mnt)
	}
	if ms := MountsUnder(tree); len(ms) != 0 {
		t.Fatalf("mounts left: %v", ms)
	}
	if err := RemoveTree(tree); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(tree); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("tree left: %v", err)
	}
	if _, err := os.Stat(filepath.Join(host, "keep")); err != nil {
		t.Fatal(err)
	}
}

func TestRemoveTree(t *testing.T) {
	root := t.TempDir()
	tree := filepath.Join(root, "t")
	// Many entries (more than one read of the directory), a symlink to
	// outside that must not be followed, a read-only directory.
	outside := filepath.Join(root, "outside")
	os.MkdirAll(outside, 0o755)
	os.WriteFile(filepath.Join(outside, "f"), nil, 0o644)
	big := filepath.Join(tree, "big")
	os.MkdirAll(big, 0o755)
	for i := range 3000 {
		os.WriteFile(filepath.Join(big, "f"+string(rune('a'+i%26))+string(rune('a'+i/26%26))+string(rune('a'+i/676))), nil, 0o644)
	}
	os.Symlink(outside, filepath.Join(tree, "link"))
	os.MkdirAll(filepath.Join(tree, "ro", "d"), 0o755)
	os.Chmod(filepath.Join(tree, "ro"), 0o555)
	if err := RemoveTree(tree); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(tree); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("tree left: %v", err)
	}
	if _, err := os.Stat(filepath.Join(outside, "f")); err != nil {
		t.Fatalf("followed a symlink: %v", err)
	}
	if err := RemoveTree(tree); err != nil {
		t.Fatalf("missing path: %v", err)
	}
	f := filepath.Join(root, "file")
	os.WriteFile(f, nil, 0o644)
	if err := RemoveTree(f); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(f); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("file left: %v", err)
	}
}

// mountOpts is the per-mount options of the mount at dir, from
// /proc/self/mountinfo.
func mountOpts(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var opts []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 5 && unescapeMount(f[4]) == dir {
			opts = strings.Split(f[5], ",") // the last mount on dir wins
		}
	}
	if opts == nil {
		t.Fatalf("%s is not a mount point", dir)
	}
	return opts
}

func TestStorageMountNosuidNodev(t *testing.T) {
	s := newBtrfs(t, 256<<20)
	if o := mountOpts(t, s.Root()); !slices.Contains(o, "nosuid") || !slices.Contains(o, "nodev") {
		t.Fatalf("DATA/fs mounted with %v, want nosuid and nodev", o)
	}
	// A storage an older den mounted without them gets them at the next
	// start. (Control: the options really were gone.)
	attr := unix.MountAttr{Attr_clr: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if err := unix.MountSetattr(unix.AT_FDCWD, s.Root(), 0, &attr); err != nil {
		t.Fatal(err)
	}
	if o := mountOpts(t, s.Root()); slices.Contains(o, "nosuid") || slices.Contains(o, "nodev") {
		t.Fatalf("control: options %v after clearing nosuid,nodev", o)
	}
	s2, err := Open(Config{Dir: filepath.Dir(s.Root()), Mode: "btrfs"})
	if err != nil {
		t.Fatal(err)
	}
	s2.Close()
	if o := mountOpts(t, s.Root()); !slices.Contains(o, "nosuid") || !slices.Contains(o, "nodev") {
		t.Fatalf("re-opened DATA/fs has %v, want nosuid and nodev", o)
	}
}

func TestBtrfsDeleteStopsAtMounts(t *testing.T) {
	s := newBtrfs(t, 256<<20)
	host := t.TempDir()
	if err := os.WriteFile(filepath.Join(host, "keep"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A plain directory (not a subvolume) in den's storage with a host
	// directory mounted in it, and a subvolume beside it.
	d := filepath.Join(s.Root(), "d")
	mnt := filepath.Join(d, "m")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := s.Create(filepath.Join(d, "sub")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(host, mnt, "", unix.MS_BIND, ""); err != nil {
		t.Skipf("bind mount: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	if err := s.Delete(d); !errors.Is(err, ErrMountPoint) {
		t.Fatalf("Delete across a bind mount: %v, want ErrMountPoint", err)
	}
	if _, err := os.Stat(filepath.Join(host, "keep")); err != nil {
		t.Fatalf("Delete removed a file of the mounted directory: %v", err)
	}
	unix.Unmount(mnt, unix.MNT_DETACH)
	if err := s.Delete(d); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(d); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("d left: %v", err)
	}
}
