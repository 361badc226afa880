package linux

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/den-dev/den/internal/agent"
	"github.com/den-dev/den/internal/image"
	"github.com/den-dev/den/internal/isolate"
	"golang.org/x/sys/unix"
)

// sh runs a shell command in the box as user ("" is root) and fails the
// test unless it exits 0.
func sh(t *testing.T, c *agent.Client, user, script string) string {
	t.Helper()
	out, errOut, code := runAs(t, c, user, script)
	if code != 0 {
		t.Fatalf("%q as %q: exit %d\nstdout %q\nstderr %q", script, user, code, out, errOut)
	}
	return out
}

func runAs(t *testing.T, c *agent.Client, user, script string) (string, string, int) {
	t.Helper()
	out, errOut, st := runSpec(t, c, &agent.ExecSpec{Argv: []string{"/bin/sh", "-c", script}, User: user})
	return out, errOut, st.ExitCode
}

// owner is the uid:gid of p on the host, not followed if a symlink.
func owner(t *testing.T, p string) (int, int) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return int(st.Uid), int(st.Gid)
}

func wantOwner(t *testing.T, p string, uid, gid int) {
	t.Helper()
	if u, g := owner(t, p); u != uid || g != gid {
		t.Errorf("%s is owned by %d:%d on disk, want %d:%d", p, u, g, uid, gid)
	}
}

func startBox(t *testing.T, rt *Runtime, spec *isolate.Spec) isolate.Box {
	t.Helper()
	ctx := context.Background()
	b, err := rt.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Stop(ctx) })
	return b
}

// Upper layers hold the ids the box sees: root's files are 0 on disk,
// uid 1000's are 1000, with every overlayfs feature den relies on.
func TestCanonicalUpper(t *testing.T) {
	rt := newRuntime(t)
	ctx := context.Background()
	spec := testSpec(t, rt, "t1canon")
	defer rt.Destroy(ctx, spec)
	skel := spec.Layers[0].Lowers[0]
	for _, d := range []string{"opt/lowerdir", "home/u"} {
		os.MkdirAll(filepath.Join(skel, d), 0o755)
	}
	os.WriteFile(filepath.Join(skel, "opt/lowerdir/x"), []byte("x"), 0o644)
	os.WriteFile(filepath.Join(skel, "home/u/file"), []byte("u\n"), 0o644)
	os.Chown(filepath.Join(skel, "home/u"), 1000, 1000)
	os.Chown(filepath.Join(skel, "home/u/file"), 1000, 1000)

	b := startBox(t, rt, spec)
	sh(t, b.Agent(), "", `set -e
echo r > /root/rootfile
touch /chowned && chown 1234:4321 /chowned
rm /etc/group
rm -rf /opt/lowerdir && mkdir /opt/lowerdir && touch /opt/lowerdir/new
echo more >> /home/u/file
cp /usr/bin/env /suid && chmod 4755 /suid
echo h > /hl1 && ln /hl1 /hl2`)
	sh(t, b.Agent(), "1000", "echo u > /tmp/u1000 && echo again >> /home/u/file")

	up := filepath.Join(spec.Dir, "upper/root")
	wantOwner(t, up, 0, 0)
	wantOwner(t, filepath.Join(up, "root/rootfile"), 0, 0)
	wantOwner(t, filepath.Join(up, "chowned"), 1234, 4321)
	wantOwner(t, filepath.Join(up, "home/u"), 1000, 1000)
	wantOwner(t, filepath.Join(up, "home/u/file"), 1000, 1000)
	wantOwner(t, filepath.Join(up, "tmp/u1000"), 1000, 1000)
	wantOwner(t, filepath.Join(up, "suid"), 0, 0)
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(up, "etc/group"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("no whiteout for /etc/group: %v mode %o", err, st.Mode)
	}
	if v := getxattr(filepath.Join(up, "opt/lowerdir"), "trusted.overlay.opaque"); string(v) != "y" {
		t.Errorf("/opt/lowerdir is not opaque: %q", v)
	}
	if unix.Lstat(filepath.Join(up, "suid"), &st); st.Mode&unix.S_ISUID == 0 {
		t.Errorf("setuid bit lost on disk: %o", st.Mode)
	}
	var h1, h2 unix.Stat_t
	unix.Lstat(filepath.Join(up, "hl1"), &h1)
	unix.Lstat(filepath.Join(up, "hl2"), &h2)
	if h1.Ino != h2.Ino || h1.Nlink != 2 {
		t.Errorf("hard link: inodes %d %d, nlink %d", h1.Ino, h2.Ino, h1.Nlink)
	}

	check := `stat -c '%n %u:%g %a' /root/rootfile /chowned /home/u /home/u/file /tmp/u1000 /suid; cat /home/u/file; ls /opt/lowerdir; test -e /etc/group || echo nogroup; stat -c %h /hl1`
	want := `/root/rootfile 0:0 644
/chowned 1234:4321 644
/home/u 1000:1000 755
/home/u/file 1000:1000 644
/tmp/u1000 1000:1000 644
/suid 0:0 4755
u
more
again
new
nogroup
2
`
	if out := sh(t, b.Agent(), "", check); out != want {
		t.Errorf("inside the box:\n%s\nwant\n%s", out, want)
	}
	// Again after a restart.
	b.Stop(ctx)
	b = startBox(t, rt, spec)
	if out := sh(t, b.Agent(), "", check); out != want {
		t.Errorf("after a restart:\n%s\nwant\n%s", out, want)
	}
	b.Stop(ctx)

	// A layer committed from the upper (ids as they are, as
	// internal/sandbox's commit does) keeps the owners in a box of another
	// id range.
	store, err := image.NewStore(filepath.Join(t.TempDir(), "images"))
	if err != nil {
		t.Fatal(err)
	}
	diffID, _, err := store.AddLayerFromDirOptions(ctx, up, image.DirOptions{})
	if err != nil {
		t.Fatal(err)
	}
	child := testSpec(t, rt, "t1canonchild")
	child.UIDBase += 65536
	child.Layers[0].Lowers = []string{skel, store.LayerPath(diffID)}
	defer rt.Destroy(ctx, child)
	cb := startBox(t, rt, child)
	if out := sh(t, cb.Agent(), "", check); out != want {
		t.Errorf("box of the committed layer:\n%s\nwant\n%s", out, want)
	}
}

// An upper directory written by an older den (host ids) is converted once.
func TestOldUpperConverted(t *testing.T) {
	rt := newRuntime(t)
	ctx := context.Background()
	spec := testSpec(t, rt, "t1old")
	defer rt.Destroy(ctx, spec)
	base := spec.UIDBase
	up := filepath.Join(spec.Dir, "upper/root")
	for _, d := range []string{"home/u", "etc"} {
		os.MkdirAll(filepath.Join(up, d), 0o755)
	}
	os.WriteFile(filepath.Join(up, "home/u/file"), []byte("u\n"), 0o644)
	os.WriteFile(filepath.Join(up, "suid"), []byte("#!/bin/sh\n"), 0o755)
	os.Link(filepath.Join(up, "home/u/file"), filepath.Join(up, "hl"))
	os.Symlink("/nowhere", filepath.Join(up, "link"))
	for _, p := range []string{"", "home", "etc", "suid", "link"} {
		os.Lchown(filepath.Join(up, p), base, base)
	}
	os.Chown(filepath.Join(up, "home/u"), base+1000, base+1000)
	os.Chown(filepath.Join(up, "home/u/file"), base+1000, base+1001)
	unix.Chmod(filepath.Join(up, "suid"), 0o4755)
	// overlayfs made whiteouts as the mounter, host root.
	if err := unix.Mknod(filepath.Join(up, "etc/group"), unix.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}

	// A stopped box is converted on demand (before a commit, say), once.
	if err := rt.Canonicalize(spec); err != nil {
		t.Fatal(err)
	}
	wantOwner(t, up, 0, 0)
	wantOwner(t, filepath.Join(up, "home/u/file"), 1000, 1001)
	b := startBox(t, rt, spec)
	wantOwner(t, up, 0, 0)
	wantOwner(t, filepath.Join(up, "home/u/file"), 1000, 1001)
	wantOwner(t, filepath.Join(up, "link"), 0, 0)
	var st unix.Stat_t
	if unix.Lstat(filepath.Join(up, "suid"), &st); st.Mode&0o7777 != 0o4755 {
		t.Errorf("mode after conversion %o", st.Mode&0o7777)
	}
	out := sh(t, b.Agent(), "", "stat -c '%n %u:%g %a' / /home/u /home/u/file /hl /suid; test -e /etc/group || echo nogroup")
	want := "/ 0:0 755\n/home/u 1000:1000 755\n/home/u/file 1000:1001 644\n/hl 1000:1001 644\n/suid 0:0 4755\nnogroup\n"
	if out != want {
		t.Errorf("inside:\n%s\nwant\n%s", out, want)
	}
}

func TestCanonicalCaps(t *testing.T) {
	v2 := make([]byte, 20)
	binary.LittleEndian.PutUint32(v2, 0x02000001)
	v2[4] = 0x20 // cap_net_bind_service
	v3 := append(append([]byte{}, v2...), 0, 0, 0, 0)
	binary.LittleEndian.PutUint32(v3, 0x03000001)
	binary.LittleEndian.PutUint32(v3[20:], 300000)
	if got := canonicalCaps(v2, 300000); string(got) != string(v2) {
		t.Errorf("v2 changed: %x", got)
	}
	if got := canonicalCaps(v3, 300000); string(got) != string(v2) {
		t.Errorf("v3 of the box's root: %x, want %x", got, v2)
	}
	binary.LittleEndian.PutUint32(v3[20:], 300005)
	if got := canonicalCaps(v3, 300000); got != nil {
		t.Errorf("v3 of a nested namespace kept: %x", got)
	}
	if canonicalID(300000+7, 300000) != 7 || canonicalID(7, 300000) != 7 || canonicalID(99, 1<<20) != 99 || canonicalID(1<<30, 300000) != 65534 {
		t.Error("canonicalID")
	}
}

// Volumes shared by boxes of different id ranges store canonical ids;
// targets resolve inside the root, whatever the image's symlinks say.
func TestMounts(t *testing.T) {
	rt := newRuntime(t)
	ctx := context.Background()
	host := t.TempDir()
	os.Chmod(host, 0o755)
	vol, ro, plain, sym := filepath.Join(host, "vol"), filepath.Join(host, "ro"), filepath.Join(host, "plain"), filepath.Join(host, "sym")
	for _, d := range []string{vol, ro, plain, sym} {
		os.Mkdir(d, 0o755)
	}
	os.Chmod(vol, 0o1777)
	os.WriteFile(filepath.Join(ro, "file"), []byte("ro\n"), 0o644)
	os.WriteFile(filepath.Join(plain, "file"), []byte("plain\n"), 0o644)
	os.WriteFile(filepath.Join(sym, "from-volume"), []byte("sym\n"), 0o644)
	mounts := []isolate.Mount{
		{Source: vol, Target: "/data", IDMapped: true},
		{Source: ro, Target: "/new/deep/ro", ReadOnly: true, IDMapped: true},
		{Source: plain, Target: "/plain"},
		{Source: sym, Target: "/escape/den-escape", IDMapped: true},
		{Source: sym, Target: "/abs/den-abs", IDMapped: true},
	}
	specA := testSpec(t, rt, "t1mntA")
	specA.Mounts = mounts
	skel := specA.Layers[0].Lowers[0]
	os.Symlink("../../../../../../../../../etc", filepath.Join(skel, "escape"))
	os.Symlink("/etc", filepath.Join(skel, "abs"))
	specB := testSpec(t, rt, "t1mntB")
	specB.UIDBase += 65536
	specB.Mounts = mounts[:1]
	defer rt.Destroy(ctx, specA)
	defer rt.Destroy(ctx, specB)
	a := startBox(t, rt, specA)
	b := startBox(t, rt, specB)

	sh(t, a.Agent(), "1000", "echo a > /data/f")
	wantOwner(t, filepath.Join(vol, "f"), 1000, 1000)
	if out := sh(t, b.Agent(), "", "stat -c %u:%g /data/f; cat /data/f; touch /data/r"); out != "1000:1000\na\n" {
		t.Errorf("box B sees %q", out)
	}
	wantOwner(t, filepath.Join(vol, "r"), 0, 0)
	sh(t, b.Agent(), "1000", "echo b >> /data/f")

	if out, errOut, code := runAs(t, a.Agent(), "", "cat /new/deep/ro/file; touch /new/deep/ro/x"); code == 0 || out != "ro\n" || !strings.Contains(errOut, "Read-only file system") {
		t.Errorf("read-only mount: exit %d %q %q", code, out, errOut)
	}
	wantOwner(t, filepath.Join(specA.Dir, "upper/root/new/deep"), 0, 0)
	// Without id mapping, host ids outside the box's range are nobody's.
	if out := sh(t, a.Agent(), "", "stat -c %u /plain/file; cat /plain/file"); out != "65534\nplain\n" {
		t.Errorf("plain bind mount: %q", out)
	}
	// Symlinked targets land inside the root.
	if out := sh(t, a.Agent(), "", "cat /etc/den-escape/from-volume /etc/den-abs/from-volume"); out != "sym\nsym\n" {
		t.Errorf("symlinked targets: %q", out)
	}
	for _, p := range []string{"/etc/den-escape", "/etc/den-abs"} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s was created on the host", p)
		}
	}
	mi := sh(t, a.Agent(), "", "grep -E ' /(data|plain|new/deep/ro) ' /proc/self/mountinfo")
	for _, line := range strings.Split(strings.TrimSpace(mi), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || !strings.Contains(f[5], "nosuid") || !strings.Contains(f[5], "nodev") {
			t.Errorf("mount without nosuid,nodev: %q", line)
		}
	}
	// The box's root cannot make the read-only mount writable.
	if _, _, code := runAs(t, a.Agent(), "", "mount -o remount,rw /new/deep/ro"); code == 0 {
		t.Error("remount rw succeeded")
	}

	// Bad mounts fail the start cleanly.
	for _, m := range []isolate.Mount{
		{Source: filepath.Join(host, "missing"), Target: "/x"},
		{Source: vol, Target: "relative"},
		{Source: vol, Target: "/"},
		{Source: filepath.Join(ro, "file"), Target: "/x"},
	} {
		bad := testSpec(t, rt, "t1mntbad")
		bad.Mounts = []isolate.Mount{m}
		if bx, err := rt.Start(ctx, bad); err == nil {
			bx.Stop(ctx)
			t.Errorf("mount %+v accepted", m)
		}
		rt.Destroy(ctx, bad)
	}
}
