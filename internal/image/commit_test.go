package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	"golang.org/x/sys/unix"
)

// upperBuilder makes an overlayfs-upper-like test directory.
type upperBuilder struct {
	t    *testing.T
	root string
}

func newUpper(t *testing.T) *upperBuilder {
	root := filepath.Join(t.TempDir(), "upper")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	return &upperBuilder{t: t, root: root}
}

func (u *upperBuilder) p(rel string) string { return filepath.Join(u.root, rel) }

func (u *upperBuilder) check(err error) {
	u.t.Helper()
	if err != nil {
		u.t.Fatal(err)
	}
}

// dir and file take modes as st_mode bits (0o4755, not os.ModeSetuid).
func (u *upperBuilder) dir(rel string, mode uint32, uid, gid int) {
	u.t.Helper()
	u.check(os.MkdirAll(u.p(rel), 0o755))
	u.check(os.Chown(u.p(rel), uid, gid))
	u.check(unix.Chmod(u.p(rel), mode))
}

func (u *upperBuilder) file(rel, body string, mode uint32, uid, gid int) {
	u.t.Helper()
	u.check(os.WriteFile(u.p(rel), []byte(body), 0o600))
	u.check(os.Chown(u.p(rel), uid, gid))
	u.check(unix.Chmod(u.p(rel), mode)) // after chown, which clears setuid
}

func (u *upperBuilder) whiteout(rel string) {
	u.t.Helper()
	u.check(unix.Mknod(u.p(rel), unix.S_IFCHR|0o000, 0))
}

func (u *upperBuilder) xattr(rel, name, value string) {
	u.t.Helper()
	u.check(unix.Lsetxattr(u.p(rel), name, []byte(value), 0))
}

// times sets every entry's mtime (and atime) to a time with nanoseconds,
// deepest first so that directories keep theirs.
func (u *upperBuilder) times(ts time.Time) {
	u.t.Helper()
	var paths []string
	filepath.Walk(u.root, func(p string, _ os.FileInfo, err error) error {
		paths = append(paths, p)
		return err
	})
	sort.Sort(sort.Reverse(sort.StringSlice(paths)))
	for i, p := range paths {
		t := timespec(ts.Add(time.Duration(i) * time.Second))
		u.check(unix.UtimesNanoAt(unix.AT_FDCWD, p, []unix.Timespec{t, t}, unix.AT_SYMLINK_NOFOLLOW))
	}
}

// fullUpper builds an upper directory with every kind of entry a sandbox
// can leave, and returns the entries that must not make it into a layer.
func fullUpper(t *testing.T) (*upperBuilder, map[string]bool) {
	u := newUpper(t)
	u.dir("etc", 0o755, 0, 0)
	u.file("etc/hosts", "10.0.0.1 den\n", 0o644, 0, 0)
	u.whiteout("etc/gone")
	u.whiteout("gone-too")
	u.dir("home/user", 0o700, 1000, 1000)
	u.file("home/user/.profile", "PS1='$ '\n", 0o600, 1000, 1000)
	u.dir("usr/bin", 0o755, 0, 0)
	u.file("usr/bin/tool", "#!/bin/false\n", 0o4755, 0, 0)
	u.check(os.Link(u.p("usr/bin/tool"), u.p("usr/bin/tool-again")))
	u.check(os.Link(u.p("usr/bin/tool"), u.p("tool-at-root")))
	u.check(os.Symlink("tool", u.p("usr/bin/sh")))
	u.check(os.Symlink("/etc/shadow", u.p("abs")))
	u.check(os.Symlink("nope/../x", u.p("dangling")))
	u.check(os.Symlink(u.p("etc"), u.p("etc-link"))) // must not be followed
	u.dir("opaque", 0o750, 0, 1000)
	u.xattr("opaque", "trusted.overlay.opaque", "y")
	u.file("opaque/new", "new", 0o644, 0, 0)
	u.dir("xwhiteouts", 0o755, 0, 0)
	u.xattr("xwhiteouts", "trusted.overlay.opaque", "x") // not opaque
	u.file("xattrs", "x", 0o640, 0, 0)
	u.xattr("xattrs", "user.den", "kept")
	u.xattr("xattrs", "user.overlay.origin", "ignored")
	u.xattr("xattrs", "trusted.overlay.origin", "ignored")
	u.xattr("xattrs", "trusted.other", "ignored")
	u.dir("ro/sub", 0o555, 0, 0)
	u.file("ro/sub/f", "read-only", 0o444, 0, 0)
	u.check(os.Chmod(u.p("ro"), 0o500))
	u.dir("tmp", 0o1777, 0, 0)
	u.file("empty", "", 0o644, 0, 0)
	long := strings.Repeat("d", 120) + "/" + strings.Repeat("f", 200)
	u.dir(filepath.Dir(long), 0o755, 0, 0)
	u.file(long, "long name", 0o644, 0, 0)
	// Not for a layer: device nodes, a fifo, a socket, a .wh. name.
	u.dir("dev", 0o755, 0, 0)
	u.check(unix.Mknod(u.p("dev/null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	u.check(unix.Mknod(u.p("dev/sda"), unix.S_IFBLK|0o660, int(unix.Mkdev(8, 0))))
	u.check(unix.Mkfifo(u.p("fifo"), 0o644))
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: u.p("sock"), Net: "unix"})
	u.check(err)
	l.SetUnlinkOnClose(false)
	l.Close()
	u.file(".wh.weird", "not a whiteout", 0o644, 0, 0)
	u.times(time.Date(2024, 5, 6, 7, 8, 9, 123456789, time.UTC))
	return u, map[string]bool{"dev/null": true, "dev/sda": true, "fifo": true, "sock": true, ".wh.weird": true}
}

func TestAddLayerFromDir(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	u, skip := fullUpper(t)
	s := newStore(t)
	var logs []string
	s.Logf = func(f string, a ...any) { logs = append(logs, fmt.Sprintf(f, a...)) }
	id, size, err := s.AddLayerFromDir(ctx, u.root)
	if err != nil {
		t.Fatal(err)
	}
	if diffIDHex(id) == "" || !s.HasLayer(id) {
		t.Fatalf("diffID %q not in the store", id)
	}
	wantSize := int64(len("10.0.0.1 den\n") + len("PS1='$ '\n") + len("#!/bin/false\n") + len("new") + len("x") + len("read-only") + len("long name"))
	if size != wantSize {
		t.Errorf("size %d, want %d", size, wantSize)
	}
	dir := s.LayerPath(id)
	compareTrees(t, u.root, dir, skip)

	// Spot checks of the stored copy.
	for _, p := range []string{"etc/gone", "gone-too"} {
		st := lstat(t, filepath.Join(dir, p))
		if st.Mode != unix.S_IFCHR || st.Rdev != 0 || st.Uid != 0 || st.Gid != 0 {
			t.Errorf("%s: mode %o rdev %d owner %d:%d, want a 0/0 whiteout", p, st.Mode, st.Rdev, st.Uid, st.Gid)
		}
	}
	if v, err := getxattr(filepath.Join(dir, "opaque"), "trusted.overlay.opaque"); v != "y" {
		t.Errorf("opaque: %q, %v", v, err)
	}
	if v, err := getxattr(filepath.Join(dir, "xwhiteouts"), "trusted.overlay.opaque"); err == nil {
		t.Errorf("xwhiteouts is opaque (%q)", v)
	}
	x := filepath.Join(dir, "xattrs")
	if v, _ := getxattr(x, "user.den"); v != "kept" {
		t.Errorf("user.den = %q", v)
	}
	for _, n := range []string{"user.overlay.origin", "trusted.overlay.origin", "trusted.other"} {
		if _, err := getxattr(x, n); err == nil {
			t.Errorf("xattr %s was copied", n)
		}
	}
	for p := range skip {
		if _, err := os.Lstat(filepath.Join(dir, p)); err == nil {
			t.Errorf("%s was copied", p)
		}
	}
	st := lstat(t, filepath.Join(dir, "usr/bin/tool"))
	if st.Mode != unix.S_IFREG|0o4755 || st.Nlink != 3 || st.Mtim.Nsec == 0 {
		t.Errorf("usr/bin/tool: mode %o nlink %d mtime %v", st.Mode, st.Nlink, st.Mtim)
	}
	if l, _ := os.Readlink(filepath.Join(dir, "etc-link")); l != u.p("etc") {
		t.Errorf("etc-link -> %q", l)
	}
	if !strings.Contains(strings.Join(logs, "\n"), "skipped 4 device nodes, fifos or sockets") ||
		!strings.Contains(strings.Join(logs, "\n"), "skipped 1 entries named .wh.*") {
		t.Errorf("logs: %q", logs)
	}
	checkOverlay2(t, dir)

	// Stable, and reused.
	ino := lstat(t, dir).Ino
	id2, size2, err := s.AddLayerFromDir(ctx, u.root)
	if err != nil || id2 != id || size2 != size || lstat(t, dir).Ino != ino {
		t.Errorf("second add: %s %d %v (first %s %d)", id2, size2, err, id, size)
	}
	layers, _ := s.Layers()
	if len(layers) != 1 {
		t.Errorf("layers: %v", layers)
	}
	assertTmpEmpty(t, s)

	// Save reproduces the diffID: the layer blob decompresses to a tar
	// whose sha256 is the diffID, and the config says so.
	_, raw := saveToFile(t, s, SaveImage{Name: "commit:1", Image: Image{Layers: []string{id}}})
	files := readArchive(t, raw)
	var docker []struct {
		Config string
		Layers []string
	}
	if err := json.Unmarshal(files["manifest.json"], &docker); err != nil || len(docker) != 1 {
		t.Fatalf("manifest.json: %s", files["manifest.json"])
	}
	zr, err := gzip.NewReader(bytes.NewReader(files[docker[0].Layers[0]]))
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	io.Copy(h, zr)
	if got := fmt.Sprintf("sha256:%x", h.Sum(nil)); got != id {
		t.Errorf("saved layer tar is %s, diffID %s", got, id)
	}
	var cfg struct {
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	json.Unmarshal(files[docker[0].Config], &cfg)
	if len(cfg.RootFS.DiffIDs) != 1 || cfg.RootFS.DiffIDs[0] != id {
		t.Errorf("saved config diffIDs %v, want %s", cfg.RootFS.DiffIDs, id)
	}
	// And the saved archive imports to the same layer.
	s2 := newStore(t)
	got, err := s2.ImportReader(ctx, bytes.NewReader(raw), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || len(got[0].Image.Layers) != 1 || got[0].Image.Layers[0] != id || got[0].Image.Size != size {
		t.Fatalf("imported %+v", got)
	}
	compareTrees(t, dir, s2.LayerPath(id), nil)

	// A second store computes the same diffID from the upper directory.
	s3 := newStore(t)
	if id3, _, err := s3.AddLayerFromDir(ctx, u.root); err != nil || id3 != id {
		t.Errorf("other store: %s, %v; want %s", id3, err, id)
	}
}

// checkOverlay2 mounts one layer as a lowerdir over a lower that has the
// whited-out and opaque-hidden names, if this machine allows mounting.
func checkOverlay2(t *testing.T, layer string) {
	lower := t.TempDir()
	for _, p := range []string{"etc/gone", "gone-too", "opaque/old", "etc/hosts"} {
		os.MkdirAll(filepath.Join(lower, filepath.Dir(p)), 0o755)
		os.WriteFile(filepath.Join(lower, p), []byte("lower"), 0o644)
	}
	mnt := t.TempDir()
	if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, "lowerdir="+layer+":"+lower); err != nil {
		t.Logf("overlay mount not possible here (%v): skipping the mount check", err)
		return
	}
	defer unix.Unmount(mnt, unix.MNT_DETACH)
	for _, p := range []string{"etc/gone", "gone-too", "opaque/old"} {
		if _, err := os.Lstat(filepath.Join(mnt, p)); err == nil {
			t.Errorf("%s visible through the overlay", p)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(mnt, "etc/hosts")); string(b) != "10.0.0.1 den\n" {
		t.Errorf("overlay etc/hosts = %q", b)
	}
}

func TestAddLayerFromDirEmpty(t *testing.T) {
	s := newStore(t)
	for range 2 {
		id, size, err := s.AddLayerFromDir(context.Background(), t.TempDir())
		if err != nil || id != EmptyLayerDiffID || size != 0 {
			t.Errorf("empty dir: %s %d %v", id, size, err)
		}
	}
	if ents, _ := os.ReadDir(s.LayerPath(EmptyLayerDiffID)); len(ents) != 0 {
		t.Errorf("empty layer has %d entries", len(ents))
	}
	assertTmpEmpty(t, s)
}

func TestAddLayerFromDirIDShift(t *testing.T) {
	requireRoot(t)
	const base = 200000
	u := newUpper(t)
	u.dir("home/user", 0o700, base+1000, base+1000)
	u.file("home/user/f", "f", 0o644, base+1000, base+1001)
	u.file("root-owned", "r", 0o644, base, base)
	u.file("stray", "s", 0o644, 5, 5) // outside the range
	u.whiteout("gone")                // made by overlayfs as real root
	u.check(os.Chown(u.p("home"), base, base))
	s := newStore(t)
	id, _, err := s.AddLayerFromDirOptions(context.Background(), u.root, DirOptions{IDBase: base})
	if err != nil {
		t.Fatal(err)
	}
	dir := s.LayerPath(id)
	for p, want := range map[string][2]uint32{
		"home":        {0, 0},
		"home/user":   {1000, 1000},
		"home/user/f": {1000, 1001},
		"root-owned":  {0, 0},
		"stray":       {overflowID, overflowID},
		"gone":        {0, 0},
	} {
		if st := lstat(t, filepath.Join(dir, p)); st.Uid != want[0] || st.Gid != want[1] {
			t.Errorf("%s: owner %d:%d, want %d:%d", p, st.Uid, st.Gid, want[0], want[1])
		}
	}
	_, _, err = s.AddLayerFromDirOptions(context.Background(), u.root, DirOptions{IDBase: -1})
	mustErrContain(t, err, "invalid id range")
}

func TestAddLayerFromDirRefused(t *testing.T) {
	requireRoot(t)
	for _, x := range []string{"trusted.overlay.metacopy", "trusted.overlay.redirect"} {
		u := newUpper(t)
		u.dir("d", 0o755, 0, 0)
		u.file("d/f", "f", 0o644, 0, 0)
		target := "d/f"
		if strings.HasSuffix(x, "redirect") {
			target = "d"
		}
		u.xattr(target, x, "")
		s := newStore(t)
		_, _, err := s.AddLayerFromDir(context.Background(), u.root)
		mustErrContain(t, err, "add layer from "+u.root, `"`+target+`"`, x, "metacopy=off")
		assertStoreEmpty(t, s)
	}

	// Limits apply as for imports.
	u := newUpper(t)
	for i := range 20 {
		u.file(fmt.Sprint(i), "x", 0o644, 0, 0)
	}
	s := newStore(t)
	s.MaxEntries = 10
	_, _, err := s.AddLayerFromDir(context.Background(), u.root)
	mustErrContain(t, err, "more than 10 entries")
	assertStoreEmpty(t, s)

	// A huge sparse file fails before it is read.
	u2 := newUpper(t)
	u2.file("small", "s", 0o644, 0, 0)
	u2.check(os.Truncate(u2.p("small"), 1<<40))
	s = newStore(t)
	s.MaxLayerBytes = 1 << 20
	start := time.Now()
	_, _, err = s.AddLayerFromDir(context.Background(), u2.root)
	mustErrContain(t, err, "more than 1048576 bytes")
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v", d)
	}
	assertStoreEmpty(t, s)

	// Not a directory; a symlink to one is not followed either.
	s = newStore(t)
	_, _, err = s.AddLayerFromDir(context.Background(), filepath.Join(u.root, "1"))
	mustErrContain(t, err, "not a directory")
	link := filepath.Join(t.TempDir(), "link")
	os.Symlink(u.root, link)
	_, _, err = s.AddLayerFromDir(context.Background(), link)
	mustErrContain(t, err, "not a directory")
	assertStoreEmpty(t, s)

	// Canceled.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, _, err = s.AddLayerFromDir(ctx, u.root)
	if err == nil || !strings.Contains(err.Error(), "context canceled") {
		t.Errorf("canceled: %v", err)
	}
	assertStoreEmpty(t, s)
}
