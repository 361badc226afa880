package image

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/klauspost/compress/gzip"
	"golang.org/x/sys/unix"
)

// The normal two-layer test image.
func baseLayer(t testing.TB) []byte {
	return mkTar(t,
		ent{name: "etc/", typ: tar.TypeDir},
		ent{name: "etc/hosts", body: "127.0.0.1 localhost\n"},
		ent{name: "etc/gone", body: "whited out by layer 2\n"},
		ent{name: "home/", typ: tar.TypeDir},
		ent{name: "home/user/", typ: tar.TypeDir, mode: 0o700, uid: 1000, gid: 1000},
		ent{name: "home/user/.bashrc", body: "export PS1='$ '\n", mode: 0o600, uid: 1000, gid: 1000},
		ent{name: "usr/bin/sudo", body: "#!/bin/false\n", mode: 0o4755},
		ent{name: "usr/bin/sudoedit", typ: tar.TypeLink, link: "usr/bin/sudo"},
		ent{name: "usr/bin/ping", body: "ping", mode: 0o755, pax: map[string]string{
			"SCHILY.xattr.user.den":           "yes",
			"SCHILY.xattr.trusted.overlay.x":  "no",
			"SCHILY.xattr.security.selinux":   "no",
			"SCHILY.xattr.user.overlay.redir": "no",
		}},
		ent{name: "bin", typ: tar.TypeSymlink, link: "usr/bin"},
		ent{name: "etc/abs-link", typ: tar.TypeSymlink, link: "/etc/shadow"},
		ent{name: "opaque/", typ: tar.TypeDir},
		ent{name: "opaque/old", body: "old"},
		ent{name: "ro/", typ: tar.TypeDir, mode: 0o500},
		ent{name: "ro/sub/", typ: tar.TypeDir, mode: 0o555},
		ent{name: "ro/sub/f", body: "in a read-only dir", mode: 0o444},
		ent{name: "tmp/", typ: tar.TypeDir, mode: 0o1777},
		ent{name: "dev/null", typ: tar.TypeChar, major: 1},
		ent{name: "dev/sda", typ: tar.TypeBlock, major: 8},
		ent{name: "dev/fifo", typ: tar.TypeFifo},
	)
}

func topLayer(t testing.TB) []byte {
	return mkTar(t,
		ent{name: "etc/", typ: tar.TypeDir},
		ent{name: "etc/.wh.gone"},
		ent{name: "etc/hosts", body: "10.0.0.1 den\n"},
		ent{name: "opaque/", typ: tar.TypeDir},
		ent{name: "opaque/.wh..wh..opq"},
		ent{name: "opaque/new", body: "new"},
		ent{name: "app/", typ: tar.TypeDir, uid: 1000, gid: 1000},
		ent{name: "app/main", body: "main", mode: 0o2755, uid: 1000, gid: 1000},
	)
}

var testConfig = v1.Config{
	Env:          []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8"},
	WorkingDir:   "/app",
	User:         "1000:1000",
	Cmd:          []string{"--serve"},
	Entrypoint:   []string{"/app/main", "-v"},
	ExposedPorts: map[string]struct{}{"8080/tcp": {}, "53/udp": {}},
	Labels:       map[string]string{"org.example": "den"},
}

func wantConfig() Config {
	return Config{
		Env:          []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8"},
		WorkingDir:   "/app",
		User:         "1000:1000",
		Cmd:          []string{"--serve"},
		Entrypoint:   []string{"/app/main", "-v"},
		ExposedPorts: []string{"53/udp", "8080/tcp"},
		Labels:       map[string]string{"org.example": "den"},
	}
}

func lstat(t testing.TB, p string) *syscall.Stat_t {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t)
}

func getxattr(p, name string) (string, error) {
	buf := make([]byte, 256)
	n, err := unix.Lgetxattr(p, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// checkBaseLayer verifies the unpacked base layer.
func checkBaseLayer(t *testing.T, dir string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "etc/hosts"))
	if err != nil || string(b) != "127.0.0.1 localhost\n" {
		t.Errorf("etc/hosts = %q, %v", b, err)
	}
	type want struct {
		mode     uint32 // full st_mode
		uid, gid uint32
	}
	for p, w := range map[string]want{
		".":                 {unix.S_IFDIR | 0o755, 0, 0},
		"etc":               {unix.S_IFDIR | 0o755, 0, 0},
		"etc/hosts":         {unix.S_IFREG | 0o644, 0, 0},
		"home/user":         {unix.S_IFDIR | 0o700, 1000, 1000},
		"home/user/.bashrc": {unix.S_IFREG | 0o600, 1000, 1000},
		"usr/bin/sudo":      {unix.S_IFREG | 0o4755, 0, 0},
		"usr":               {unix.S_IFDIR | 0o755, 0, 0}, // implicit parent
		"bin":               {unix.S_IFLNK | 0o777, 0, 0},
		"ro":                {unix.S_IFDIR | 0o500, 0, 0},
		"ro/sub":            {unix.S_IFDIR | 0o555, 0, 0},
		"ro/sub/f":          {unix.S_IFREG | 0o444, 0, 0},
		"tmp":               {unix.S_IFDIR | 0o1777, 0, 0},
	} {
		st := lstat(t, filepath.Join(dir, p))
		if st.Mode != w.mode || st.Uid != w.uid || st.Gid != w.gid {
			t.Errorf("%s: mode %o owner %d:%d, want mode %o owner %d:%d", p, st.Mode, st.Uid, st.Gid, w.mode, w.uid, w.gid)
		}
	}
	for _, p := range []string{"etc/hosts", "home/user/.bashrc", "ro", "etc", "bin"} {
		st := lstat(t, filepath.Join(dir, p))
		if st.Mtim.Sec != testTime.Unix() {
			t.Errorf("%s: mtime %d, want %d", p, st.Mtim.Sec, testTime.Unix())
		}
	}
	if a, b := lstat(t, filepath.Join(dir, "usr/bin/sudo")), lstat(t, filepath.Join(dir, "usr/bin/sudoedit")); a.Ino != b.Ino || a.Nlink != 2 {
		t.Errorf("sudoedit is not a hard link of sudo (ino %d/%d, nlink %d)", a.Ino, b.Ino, a.Nlink)
	}
	if l, err := os.Readlink(filepath.Join(dir, "bin")); err != nil || l != "usr/bin" {
		t.Errorf("bin -> %q, %v", l, err)
	}
	if l, err := os.Readlink(filepath.Join(dir, "etc/abs-link")); err != nil || l != "/etc/shadow" {
		t.Errorf("etc/abs-link -> %q, %v", l, err)
	}
	for _, p := range []string{"dev/null", "dev/sda", "dev/fifo"} {
		if _, err := os.Lstat(filepath.Join(dir, p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: device/fifo was created (err %v)", p, err)
		}
	}
	ping := filepath.Join(dir, "usr/bin/ping")
	if v, err := getxattr(ping, "user.den"); err != nil {
		if !errors.Is(err, unix.ENOTSUP) {
			t.Errorf("user.den xattr: %v", err)
		}
	} else if v != "yes" {
		t.Errorf("user.den xattr = %q", v)
	}
	for _, x := range []string{"trusted.overlay.x", "security.selinux", "user.overlay.redir"} {
		if v, err := getxattr(ping, x); err == nil {
			t.Errorf("xattr %s was applied (%q)", x, v)
		}
	}
}

func checkTopLayer(t *testing.T, dir string) {
	t.Helper()
	st := lstat(t, filepath.Join(dir, "etc/gone"))
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 || st.Uid != 0 || st.Gid != 0 {
		t.Errorf("etc/gone: mode %o rdev %d owner %d:%d, want a 0/0 char device owned by root", st.Mode, st.Rdev, st.Uid, st.Gid)
	}
	if _, err := os.Lstat(filepath.Join(dir, "etc/.wh.gone")); err == nil {
		t.Error("the .wh. entry itself was created")
	}
	if v, err := getxattr(filepath.Join(dir, "opaque"), "trusted.overlay.opaque"); err != nil || v != "y" {
		t.Errorf("opaque: trusted.overlay.opaque = %q, %v", v, err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "opaque/.wh..wh..opq")); err == nil {
		t.Error("the opaque marker entry itself was created")
	}
	st = lstat(t, filepath.Join(dir, "app/main"))
	if st.Mode != unix.S_IFREG|0o2755 || st.Uid != 1000 || st.Gid != 1000 {
		t.Errorf("app/main: mode %o owner %d:%d", st.Mode, st.Uid, st.Gid)
	}
}

func TestRoundTrip(t *testing.T) {
	requireRoot(t)
	for _, kind := range []layerKind{gzipLayer, zstdLayer, rawLayer} {
		img := mkImage(t, testConfig, mkLayer(t, baseLayer(t), kind), mkLayer(t, topLayer(t), kind))
		ids := diffIDs(t, img)
		for _, format := range []string{"docker-save", "oci-layout", "oci-archive"} {
			t.Run(kind.String()+"/"+format, func(t *testing.T) {
				s := newStore(t)
				var logs []string
				s.Logf = func(f string, a ...any) { logs = append(logs, fmt.Sprintf(f, a...)) }
				tmp := t.TempDir()
				var src, wantName, wantID string
				switch format {
				case "docker-save":
					src = filepath.Join(tmp, "image.tar")
					wantName = "example.com/den/test:v1"
					wantID = configDigest(t, img)
					writeDockerSave(t, src, map[string]v1.Image{wantName: img})
				case "oci-layout":
					src = filepath.Join(tmp, "layout")
					wantName = "den-test:latest"
					wantID = imgDigest(t, img)
					writeLayout(t, src, img, wantName)
				case "oci-archive":
					dir := filepath.Join(tmp, "layout")
					wantName = "v2"
					wantID = imgDigest(t, img)
					writeLayout(t, dir, img, wantName)
					src = filepath.Join(tmp, "image.oci.tar")
					tarDir(t, dir, src)
				}
				var calls int
				var lastDone, lastTotal int64
				got, err := s.Import(context.Background(), src, func(done, total int64, what string) {
					calls++
					lastDone, lastTotal = done, total
					if !strings.HasPrefix(what, "layer sha256:") {
						t.Errorf("progress what = %q", what)
					}
				})
				if err != nil {
					t.Fatal(err)
				}
				if len(got) != 1 {
					t.Fatalf("got %d images, want 1", len(got))
				}
				if got[0].Name != wantName {
					t.Errorf("name %q, want %q", got[0].Name, wantName)
				}
				im := got[0].Image
				if im.ID != wantID {
					t.Errorf("ID %s, want %s", im.ID, wantID)
				}
				if !reflect.DeepEqual(im.Layers, ids) {
					t.Errorf("layers %v, want %v", im.Layers, ids)
				}
				if !reflect.DeepEqual(im.Config, wantConfig()) {
					t.Errorf("config %+v\nwant %+v", im.Config, wantConfig())
				}
				wantSize := int64(0)
				for _, b := range []string{"127.0.0.1 localhost\n", "whited out by layer 2\n", "export PS1='$ '\n", "#!/bin/false\n", "ping", "old", "in a read-only dir", "10.0.0.1 den\n", "new", "main"} {
					wantSize += int64(len(b))
				}
				if im.Size != wantSize {
					t.Errorf("size %d, want %d", im.Size, wantSize)
				}
				if calls == 0 || lastDone != lastTotal || lastTotal <= 0 {
					t.Errorf("progress: %d calls, last %d/%d", calls, lastDone, lastTotal)
				}
				checkBaseLayer(t, s.LayerPath(ids[0]))
				checkTopLayer(t, s.LayerPath(ids[1]))
				if !strings.Contains(strings.Join(logs, "\n"), "skipped 3 device nodes") {
					t.Errorf("device nodes not counted; logs: %q", logs)
				}
				var m layerMeta
				b, _ := os.ReadFile(s.metaPath(ids[0][7:]))
				if err := json.Unmarshal(b, &m); err != nil || m.SkippedDevices != 3 {
					t.Errorf("meta %s: %+v, %v", b, m, err)
				}
				layers, err := s.Layers()
				if err != nil || !reflect.DeepEqual(layers, sortedCopy(ids)) {
					t.Errorf("Layers() = %v, %v", layers, err)
				}
				assertTmpEmpty(t, s)
				checkOverlay(t, s, ids)
			})
		}
	}
}

func sortedCopy(s []string) []string {
	c := append([]string(nil), s...)
	for i := range c {
		for j := i + 1; j < len(c); j++ {
			if c[j] < c[i] {
				c[i], c[j] = c[j], c[i]
			}
		}
	}
	return c
}

func assertTmpEmpty(t testing.TB, s *Store) {
	t.Helper()
	ents, _ := os.ReadDir(s.tmp)
	if len(ents) != 0 {
		t.Errorf("tmp not empty after import: %d entries", len(ents))
	}
}

// checkOverlay mounts the layers as overlayfs lowerdirs and checks the
// whiteout and the opaque directory work, if this machine allows mounting.
func checkOverlay(t *testing.T, s *Store, ids []string) {
	mnt := t.TempDir()
	opts := "lowerdir=" + s.LayerPath(ids[1]) + ":" + s.LayerPath(ids[0])
	if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, opts); err != nil {
		t.Logf("overlay mount not possible here (%v): skipping the mount check", err)
		return
	}
	defer unix.Unmount(mnt, unix.MNT_DETACH)
	t.Logf("checking the layers mounted as overlayfs lowerdirs at %s", mnt)
	if _, err := os.Lstat(filepath.Join(mnt, "etc/gone")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("whited-out etc/gone visible in the overlay (err %v)", err)
	}
	if b, err := os.ReadFile(filepath.Join(mnt, "etc/hosts")); err != nil || string(b) != "10.0.0.1 den\n" {
		t.Errorf("overlay etc/hosts = %q, %v", b, err)
	}
	ents, err := os.ReadDir(filepath.Join(mnt, "opaque"))
	if err != nil || len(ents) != 1 || ents[0].Name() != "new" {
		t.Errorf("overlay opaque/ = %v, %v; want only new", ents, err)
	}
	if _, err := os.Stat(filepath.Join(mnt, "usr/bin/sudo")); err != nil {
		t.Errorf("overlay usr/bin/sudo: %v", err)
	}
}

func TestStorePermissions(t *testing.T) {
	s := newStore(t)
	for _, d := range []string{s.layers, s.tmp, s.meta} {
		fi, err := os.Lstat(d)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != os.ModeDir|0o700 {
			t.Errorf("%s: mode %v, want drwx------", d, fi.Mode())
		}
		if st := fi.Sys().(*syscall.Stat_t); os.Geteuid() == 0 && st.Uid != 0 {
			t.Errorf("%s: owner %d, want root", d, st.Uid)
		}
	}
	// Leftovers of an interrupted import are cleared on open.
	if err := os.MkdirAll(filepath.Join(s.tmp, "layer-x", "root", "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := NewStore(s.dir); err != nil {
		t.Fatal(err)
	}
	assertTmpEmpty(t, s)
}

func TestIdempotentReimport(t *testing.T) {
	requireRoot(t)
	s := newStore(t)
	img := mkImage(t, testConfig, mkLayer(t, baseLayer(t), gzipLayer), mkLayer(t, topLayer(t), gzipLayer))
	src := filepath.Join(t.TempDir(), "image.tar")
	writeDockerSave(t, src, map[string]v1.Image{"a:1": img, "b:2": img})
	first, err := s.Import(context.Background(), src, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(first) != 2 || first[0].Name+first[1].Name != "a:1b:2" && first[0].Name+first[1].Name != "b:2a:1" ||
		!reflect.DeepEqual(first[0].Image, first[1].Image) {
		t.Fatalf("first import: %+v", first)
	}
	ids := diffIDs(t, img)
	inode := lstat(t, s.LayerPath(ids[0])).Ino
	var total int64 = -1
	second, err := s.Import(context.Background(), src, func(done, tot int64, _ string) { total = tot })
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(first, second) {
		t.Errorf("re-import differs:\n%+v\n%+v", first, second)
	}
	if total != -1 {
		t.Errorf("re-import read layer data (total %d)", total)
	}
	if lstat(t, s.LayerPath(ids[0])).Ino != inode {
		t.Error("re-import replaced the layer directory")
	}
	// Size survives a lost sidecar.
	os.Remove(s.metaPath(ids[0][7:]))
	third, err := s.Import(context.Background(), src, nil)
	if err != nil || third[0].Image.Size != first[0].Image.Size {
		t.Errorf("size without sidecar: %+v, %v", third, err)
	}

	// Concurrent imports of the same image both succeed.
	s2 := newStore(t)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = s2.Import(context.Background(), src, nil)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	checkBaseLayer(t, s2.LayerPath(ids[0]))
	assertTmpEmpty(t, s2)

	// RemoveLayer is idempotent.
	for range 2 {
		if err := s.RemoveLayer(ids[0]); err != nil {
			t.Fatal(err)
		}
	}
	if s.HasLayer(ids[0]) || !s.HasLayer(ids[1]) {
		t.Error("RemoveLayer removed the wrong layer")
	}
	if _, err := os.Stat(s.metaPath(ids[0][7:])); !errors.Is(err, os.ErrNotExist) {
		t.Error("RemoveLayer left the sidecar")
	}
	layers, _ := s.Layers()
	if !reflect.DeepEqual(layers, []string{ids[1]}) {
		t.Errorf("Layers() = %v", layers)
	}
	assertTmpEmpty(t, s)
	// And the layer comes back on re-import.
	if _, err := s.Import(context.Background(), src, nil); err != nil || !s.HasLayer(ids[0]) {
		t.Errorf("re-import after removal: %v", err)
	}
}

func TestImportReader(t *testing.T) {
	requireRoot(t)
	img := mkImage(t, testConfig, mkLayer(t, baseLayer(t), gzipLayer))
	src := filepath.Join(t.TempDir(), "image.tar")
	writeDockerSave(t, src, map[string]v1.Image{"up:load": img})
	raw, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(raw)
	zw.Close()
	for name, b := range map[string][]byte{"plain": raw, "gzip": gz.Bytes()} {
		t.Run(name, func(t *testing.T) {
			s := newStore(t)
			got, err := s.ImportReader(context.Background(), bytes.NewReader(b), nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || got[0].Name != "up:load" {
				t.Fatalf("got %+v", got)
			}
			checkBaseLayer(t, s.LayerPath(diffIDs(t, img)[0]))
			assertTmpEmpty(t, s)

			s.MaxArchiveBytes = 1024
			_, err = s.ImportReader(context.Background(), bytes.NewReader(b), nil)
			mustErrContain(t, err, "more than 1024 bytes")
			assertTmpEmpty(t, s)
		})
	}
}

func TestUnnamedAndMultiImageLayout(t *testing.T) {
	a := mkImage(t, v1.Config{Cmd: []string{"a"}}, mkLayer(t, mkTar(t, ent{name: "a", body: "a"}), gzipLayer))
	b := mkImage(t, v1.Config{Cmd: []string{"b"}}, mkLayer(t, mkTar(t, ent{name: "b", body: "bb"}), zstdLayer))
	dir := filepath.Join(t.TempDir(), "layout")
	writeLayout(t, dir, a, "")
	writeLayout(t, dir, b, "b:latest")
	s := newStore(t)
	got, err := s.Import(context.Background(), dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Name != "" || got[1].Name != "b:latest" ||
		got[0].Image.ID != imgDigest(t, a) || got[1].Image.ID != imgDigest(t, b) ||
		got[0].Image.Size != 1 || got[1].Image.Size != 2 {
		t.Fatalf("got %+v", got)
	}
}

func TestNotAnImage(t *testing.T) {
	s := newStore(t)
	p := filepath.Join(t.TempDir(), "x.tar")
	os.WriteFile(p, mkTar(t, ent{name: "hello", body: "world"}), 0o644)
	_, err := s.Import(context.Background(), p, nil)
	mustErrContain(t, err, "not an image archive")
	_, err = s.Import(context.Background(), t.TempDir(), nil)
	mustErrContain(t, err, "not an OCI image layout")
}

func TestLayerPathValidation(t *testing.T) {
	s := newStore(t)
	for _, bad := range []string{"", "sha256:", "sha256:../../etc", "sha512:" + strings.Repeat("a", 64), strings.Repeat("a", 64), "sha256:" + strings.Repeat("A", 64)} {
		if p := s.LayerPath(bad); p != "" {
			t.Errorf("LayerPath(%q) = %q", bad, p)
		}
		if s.HasLayer(bad) {
			t.Errorf("HasLayer(%q)", bad)
		}
		if err := s.RemoveLayer(bad); err == nil {
			t.Errorf("RemoveLayer(%q) succeeded", bad)
		}
	}
	good := "sha256:" + strings.Repeat("0", 64)
	if p := s.LayerPath(good); p != filepath.Join(s.dir, "layers", strings.Repeat("0", 64)) || !filepath.IsAbs(p) {
		t.Errorf("LayerPath = %q", p)
	}
	if err := s.RemoveLayer(good); err != nil {
		t.Errorf("RemoveLayer of an absent layer: %v", err)
	}
}

// --- hostile input ---

func TestHostileEntries(t *testing.T) {
	hostDir := t.TempDir() // stands for any host directory
	cases := []struct {
		name string
		tar  []byte
		want []string
	}{
		{"dotdot", mkTar(t, ent{name: "../escape", body: "x"}), []string{`"../escape"`, `".."`}},
		{"dotdot-inner", mkTar(t, ent{name: "a/../../escape", body: "x"}), []string{`"a/../../escape"`, `".."`}},
		{"dotdot-dir", mkTar(t, ent{name: "../escape/", typ: tar.TypeDir}), []string{`"../escape/"`, `".."`}},
		{"absolute", mkTar(t, ent{name: "/abs", body: "x"}), []string{`"/abs"`, "absolute"}},
		{"symlink-parent", mkTar(t,
			ent{name: "evil", typ: tar.TypeSymlink, link: hostDir},
			ent{name: "evil/pwned", body: "x"}), []string{`"evil/pwned"`, "symlink"}},
		{"symlink-parent-relative", mkTar(t,
			ent{name: "d/", typ: tar.TypeDir},
			ent{name: "d/up", typ: tar.TypeSymlink, link: "../.."},
			ent{name: "d/up/pwned", body: "x"}), []string{`"d/up/pwned"`, "symlink"}},
		{"symlink-parent-dir", mkTar(t,
			ent{name: "evil", typ: tar.TypeSymlink, link: hostDir},
			ent{name: "evil/sub/", typ: tar.TypeDir}), []string{`"evil/sub/"`, "symlink"}},
		{"symlink-parent-symlink", mkTar(t,
			ent{name: "evil", typ: tar.TypeSymlink, link: hostDir},
			ent{name: "evil/l", typ: tar.TypeSymlink, link: "/etc/passwd"}), []string{`"evil/l"`, "symlink"}},
		{"symlink-parent-whiteout", mkTar(t,
			ent{name: "evil", typ: tar.TypeSymlink, link: hostDir},
			ent{name: "evil/.wh.victim"}), []string{`"evil/.wh.victim"`, "symlink"}},
		{"symlink-parent-opaque", mkTar(t,
			ent{name: "evil", typ: tar.TypeSymlink, link: hostDir},
			ent{name: "evil/.wh..wh..opq"}), []string{`"evil/.wh..wh..opq"`, "symlink"}},
		{"hardlink-through-symlink-dir", mkTar(t,
			ent{name: "real/", typ: tar.TypeDir},
			ent{name: "real/f", body: "f"},
			ent{name: "ln", typ: tar.TypeSymlink, link: "real"},
			ent{name: "x", typ: tar.TypeLink, link: "ln/f"}), []string{`"x"`, `"ln"`, "symlink"}},
		{"hardlink-created-through-symlink-dir", mkTar(t,
			ent{name: "real/", typ: tar.TypeDir},
			ent{name: "real/f", body: "f"},
			ent{name: "ln", typ: tar.TypeSymlink, link: hostDir},
			ent{name: "ln/h", typ: tar.TypeLink, link: "real/f"}), []string{`"ln/h"`, "symlink"}},
		{"hardlink-absolute", mkTar(t, ent{name: "shadow", typ: tar.TypeLink, link: "/etc/shadow"}), []string{`"shadow"`, "/etc/shadow", "absolute"}},
		{"hardlink-dotdot", mkTar(t, ent{name: "x", typ: tar.TypeLink, link: "../../x"}), []string{`"x"`, "../../x", `".."`}},
		{"hardlink-to-symlink", mkTar(t,
			ent{name: "s", typ: tar.TypeSymlink, link: "/etc/shadow"},
			ent{name: "x", typ: tar.TypeLink, link: "s"}), []string{`"x"`, "not a regular file"}},
		{"hardlink-to-dir", mkTar(t,
			ent{name: "d/", typ: tar.TypeDir},
			ent{name: "x", typ: tar.TypeLink, link: "d"}), []string{`"x"`, "not a regular file"}},
		{"hardlink-missing", mkTar(t, ent{name: "x", typ: tar.TypeLink, link: "etc/shadow"}), []string{`"x"`, "does not exist in this layer"}},
		{"whiteout-dotdot", mkTar(t, ent{name: "../.wh.x"}), []string{`"../.wh.x"`, `".."`}},
		{"whiteout-of-dotdot", mkTar(t, ent{name: "a/.wh..."}), []string{`"a/.wh..."`, "invalid whiteout"}},
		{"whiteout-of-dot", mkTar(t, ent{name: ".wh.."}), []string{`".wh.."`, "invalid whiteout"}},
		{"root-not-dir", mkTar(t, ent{name: "./", typ: tar.TypeSymlink, link: "/"}), []string{`"./"`, "root"}},
		{"device-dotdot", mkTar(t, ent{name: "../dev/sda", typ: tar.TypeBlock, major: 8}), []string{`"../dev/sda"`, `".."`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newStore(t)
			_, err := importLayer(t, s, c.tar)
			mustErrContain(t, err, append([]string{"layer sha256:"}, c.want...)...)
			assertStoreEmpty(t, s)
			if ents, _ := os.ReadDir(hostDir); len(ents) != 0 {
				t.Errorf("something was written to the host directory: %v", ents)
			}
			if _, err := os.Lstat(filepath.Join(filepath.Dir(s.dir), "escape")); err == nil {
				t.Error("escape was created next to the store")
			}
		})
	}
}

func fileID(t testing.TB, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	st := lstat(t, p)
	return fmt.Sprintf("%x ino=%d mode=%o mtime=%d.%d", sha256.Sum256(b), st.Ino, st.Mode, st.Mtim.Sec, st.Mtim.Nsec)
}

func TestSymlinkToEtcPasswd(t *testing.T) {
	// First the same attack against a decoy directory: if the unpacker
	// regressed, fail here instead of damaging this machine's /etc/passwd.
	decoy := t.TempDir()
	if err := os.WriteFile(filepath.Join(decoy, "passwd"), []byte("decoy\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	decoyBefore := fileID(t, filepath.Join(decoy, "passwd"))
	s := newStore(t)
	_, err := importLayer(t, s, mkTar(t,
		ent{name: "evil", typ: tar.TypeSymlink, link: decoy},
		ent{name: "evil/passwd", body: "root::0:0::/:/bin/sh\n"}))
	mustErrContain(t, err, `path component "evil" is a symlink`)
	if _, statErr := os.Lstat(filepath.Join(decoy, "passwd")); statErr != nil || fileID(t, filepath.Join(decoy, "passwd")) != decoyBefore {
		t.Fatalf("the decoy passwd was changed (%v): not running the /etc variant", statErr)
	}

	before := fileID(t, "/etc/passwd")
	s = newStore(t)
	_, err = importLayer(t, s, mkTar(t,
		ent{name: "evil", typ: tar.TypeSymlink, link: "/etc"},
		ent{name: "evil/passwd", body: "root::0:0::/:/bin/sh\n"}))
	mustErrContain(t, err, "layer sha256:", `"evil/passwd"`, `path component "evil" is a symlink`)
	if after := fileID(t, "/etc/passwd"); after != before {
		t.Fatalf("/etc/passwd changed: %s -> %s", before, after)
	}
	assertStoreEmpty(t, s)
}

func TestLaterEntriesReplaceWithoutFollowing(t *testing.T) {
	hostDir := t.TempDir()
	victim := filepath.Join(hostDir, "victim")
	if err := os.WriteFile(victim, []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := fileID(t, victim)
	// A symlink replaced by a file must not write through the symlink; a
	// dir replaced by a symlink must not get the dir's deferred chmod
	// applied through the symlink.
	s := newStore(t)
	tb := mkTar(t,
		ent{name: "f", typ: tar.TypeSymlink, link: victim},
		ent{name: "f", body: "layer"},
		ent{name: "d/", typ: tar.TypeDir, mode: 0o777},
		ent{name: "d", typ: tar.TypeSymlink, link: hostDir},
		ent{name: "g", typ: tar.TypeSymlink, link: victim},
		ent{name: "h", body: "h"},
		ent{name: "h", typ: tar.TypeLink, link: "f"},
	)
	got, err := importLayer(t, s, tb)
	if err != nil {
		t.Fatal(err)
	}
	dir := s.LayerPath(got[0].Image.Layers[0])
	if b, _ := os.ReadFile(filepath.Join(dir, "f")); string(b) != "layer" {
		t.Errorf("f = %q", b)
	}
	if l, _ := os.Readlink(filepath.Join(dir, "d")); l != hostDir {
		t.Errorf("d -> %q", l)
	}
	if fileID(t, victim) != before {
		t.Error("victim changed")
	}
	if fi, _ := os.Stat(hostDir); fi.Mode().Perm() == 0o777 {
		t.Error("host dir was chmodded through a symlink")
	}
	if a, b := lstat(t, filepath.Join(dir, "f")), lstat(t, filepath.Join(dir, "h")); a.Ino != b.Ino {
		t.Error("h is not a hard link of f")
	}
}

func TestDevicesSkipped(t *testing.T) {
	s := newStore(t)
	got, err := importLayer(t, s, mkTar(t,
		ent{name: "dev/", typ: tar.TypeDir},
		ent{name: "dev/sda", typ: tar.TypeBlock, major: 8},
		ent{name: "dev/mem", typ: tar.TypeChar, major: 1, mode: 0o666},
		ent{name: "dev/null", typ: tar.TypeChar, major: 1, mode: 0o666},
		ent{name: "pipe", typ: tar.TypeFifo},
		ent{name: "ok", body: "ok"},
	))
	if err != nil {
		t.Fatal(err)
	}
	dir := s.LayerPath(got[0].Image.Layers[0])
	ents, _ := os.ReadDir(filepath.Join(dir, "dev"))
	if len(ents) != 0 {
		t.Errorf("dev/ has %d entries, want none", len(ents))
	}
	if _, err := os.Lstat(filepath.Join(dir, "pipe")); err == nil {
		t.Error("fifo created")
	}
	var m layerMeta
	b, _ := os.ReadFile(s.metaPath(got[0].Image.Layers[0][7:]))
	json.Unmarshal(b, &m)
	if m.SkippedDevices != 4 {
		t.Errorf("skipped devices = %d, want 4", m.SkippedDevices)
	}
}

func TestLimits(t *testing.T) {
	var many []ent
	for i := range 50 {
		many = append(many, ent{name: fmt.Sprintf("f%d", i), body: "x"})
	}
	bomb := mkTar(t, many...)
	s := newStore(t)
	s.MaxEntries = 10
	_, err := importLayer(t, s, bomb)
	mustErrContain(t, err, "layer sha256:", ": more than 10 entries")
	assertStoreEmpty(t, s)

	// A highly compressible 1 MiB file against a 64 KiB limit.
	s = newStore(t)
	s.MaxLayerBytes = 64 << 10
	_, err = importLayer(t, s, mkTar(t, ent{name: "zeros", body: string(make([]byte, 1<<20))}))
	mustErrContain(t, err, "layer sha256:", fmt.Sprintf("more than %d bytes", 64<<10))
	assertStoreEmpty(t, s)

	// Too many layers.
	s = newStore(t)
	s.MaxImageLayers = 2
	var ls []v1.Layer
	for i := range 3 {
		ls = append(ls, mkLayer(t, mkTar(t, ent{name: fmt.Sprint(i), body: "x"}), gzipLayer))
	}
	img := mkImage(t, v1.Config{}, ls...)
	for _, format := range []string{"docker", "layout"} {
		p := filepath.Join(t.TempDir(), "img")
		if format == "docker" {
			writeDockerSave(t, p, map[string]v1.Image{"x:y": img})
		} else {
			writeLayout(t, p, img, "")
		}
		_, err = s.Import(context.Background(), p, nil)
		mustErrContain(t, err, "more than 2 layers")
		assertStoreEmpty(t, s)
	}
}

// blobPath returns the path of a blob in an OCI layout.
func blobPath(dir, digest string) string {
	return filepath.Join(dir, "blobs", "sha256", strings.TrimPrefix(digest, "sha256:"))
}

func TestTamperedLayer(t *testing.T) {
	l := mkLayer(t, baseLayer(t), gzipLayer)
	img := mkImage(t, testConfig, l, mkLayer(t, topLayer(t), gzipLayer))
	ld, _ := l.Digest()
	diffID, _ := l.DiffID()
	for _, where := range []string{"start", "middle", "end", "append"} {
		t.Run(where, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "layout")
			writeLayout(t, dir, img, "")
			p := blobPath(dir, ld.String())
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			switch where {
			case "start":
				b[20] ^= 0xff
			case "middle":
				b[len(b)/2] ^= 0x01
			case "end":
				b[len(b)-1] ^= 0x01
			case "append":
				b = append(b, 0)
			}
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
			s := newStore(t)
			_, err = s.Import(context.Background(), dir, nil)
			mustErrContain(t, err, "layer "+diffID.String(), ld.String())
			assertStoreEmpty(t, s)

			// The same as an OCI archive.
			arc := filepath.Join(t.TempDir(), "img.tar")
			tarDir(t, dir, arc)
			_, err = s.Import(context.Background(), arc, nil)
			mustErrContain(t, err, "layer "+diffID.String(), ld.String())
			assertStoreEmpty(t, s)
		})
	}
}

func TestWrongDiffID(t *testing.T) {
	// A static layer of gzip bytes: ggcr takes its diffID to be the digest
	// of those compressed bytes, so the config's diffID is wrong.
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(mkTar(t, ent{name: "f", body: "f"}))
	zw.Close()
	l := mkLayer(t, gz.Bytes(), rawLayer)
	diffID, _ := l.DiffID()
	img := mkImage(t, v1.Config{}, l)
	for _, format := range []string{"docker", "layout"} {
		s := newStore(t)
		p := filepath.Join(t.TempDir(), "img")
		if format == "docker" {
			writeDockerSave(t, p, map[string]v1.Image{"x:y": img})
		} else {
			writeLayout(t, p, img, "")
		}
		_, err := s.Import(context.Background(), p, nil)
		mustErrContain(t, err, "layer "+diffID.String(), "uncompressed digest mismatch")
		assertStoreEmpty(t, s)
	}
}

func TestTamperedDockerSave(t *testing.T) {
	img := mkImage(t, testConfig, mkLayer(t, baseLayer(t), rawLayer))
	diffID := diffIDs(t, img)[0]
	p := filepath.Join(t.TempDir(), "img.tar")
	writeDockerSave(t, p, map[string]v1.Image{"x:y": img})
	b, _ := os.ReadFile(p)
	// Change a byte of the file contents inside the layer tar.
	i := bytes.Index(b, []byte("127.0.0.1 localhost"))
	if i < 0 {
		t.Fatal("layer content not found")
	}
	b[i] = '9'
	os.WriteFile(p, b, 0o644)
	s := newStore(t)
	_, err := s.Import(context.Background(), p, nil)
	mustErrContain(t, err, "layer "+diffID, "digest mismatch")
	assertStoreEmpty(t, s)
}

func TestCanceled(t *testing.T) {
	img := mkImage(t, testConfig, mkLayer(t, baseLayer(t), gzipLayer))
	dir := filepath.Join(t.TempDir(), "layout")
	writeLayout(t, dir, img, "")
	s := newStore(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := s.Import(ctx, dir, nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	assertStoreEmpty(t, s)
	// Canceled from the progress callback, mid-layer.
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	big := mkImage(t, v1.Config{}, mkLayer(t, mkTar(t, ent{name: "big", body: strings.Repeat("x", 8<<20)}), rawLayer))
	dir = filepath.Join(t.TempDir(), "layout")
	writeLayout(t, dir, big, "")
	_, err = s.Import(ctx, dir, func(done, total int64, _ string) {
		if done < total {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	assertStoreEmpty(t, s)
}

// TestDockerSaveFlavors covers `docker save` tarballs as classic Docker
// (<id>/layer.tar, shared layers as symlinks, <hex>.json config) and Docker
// >= 25 (content-addressed blobs/sha256/<hex>, next to an OCI index) write
// them.
func TestDockerSaveFlavors(t *testing.T) {
	l1 := mkTar(t, ent{name: "one", body: "1"})
	l2 := mkTar(t, ent{name: "two", body: "22"})
	hex := func(b []byte) string { return fmt.Sprintf("%x", sha256.Sum256(b)) }
	cfg := v1.ConfigFile{
		Architecture: "amd64", OS: "linux",
		RootFS: v1.RootFS{Type: "layers", DiffIDs: []v1.Hash{
			{Algorithm: "sha256", Hex: hex(l1)}, {Algorithm: "sha256", Hex: hex(l2)}, {Algorithm: "sha256", Hex: hex(l1)},
		}},
		Config: v1.Config{Cmd: []string{"run"}, Env: []string{"A=1"}},
	}
	cfgBytes, _ := json.Marshal(cfg)
	cfgHex := hex(cfgBytes)

	type file struct {
		name, link string
		body       []byte
	}
	mkArchive := func(files []file, manifest any) string {
		mb, _ := json.Marshal(manifest)
		files = append(files, file{name: "manifest.json", body: mb})
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, f := range files {
			h := &tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.body)), Typeflag: tar.TypeReg}
			if f.link != "" {
				h.Typeflag, h.Linkname, h.Size = tar.TypeSymlink, f.link, 0
			}
			tw.WriteHeader(h)
			tw.Write(f.body)
		}
		tw.Close()
		p := filepath.Join(t.TempDir(), "save.tar")
		os.WriteFile(p, buf.Bytes(), 0o644)
		return p
	}
	type desc struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	classic := mkArchive([]file{
		{name: "aaa/layer.tar", body: l1},
		{name: "bbb/layer.tar", body: l2},
		{name: "ccc/layer.tar", link: "../aaa/layer.tar"},
		{name: cfgHex + ".json", body: cfgBytes},
	}, []desc{{Config: cfgHex + ".json", RepoTags: []string{"classic:1"}, Layers: []string{"aaa/layer.tar", "bbb/layer.tar", "ccc/layer.tar"}}})
	blobs := []file{
		{name: "oci-layout", body: []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{name: "index.json", body: []byte(`{"schemaVersion":2,"manifests":[]}`)},
		{name: "blobs/sha256/" + hex(l1), body: l1},
		{name: "blobs/sha256/" + hex(l2), body: l2},
		{name: "blobs/sha256/" + cfgHex, body: cfgBytes},
	}
	modern := mkArchive(blobs, []desc{{Config: "blobs/sha256/" + cfgHex, RepoTags: []string{"modern:2"},
		Layers: []string{"blobs/sha256/" + hex(l1), "blobs/sha256/" + hex(l2), "blobs/sha256/" + hex(l1)}}})
	for name, p := range map[string]string{"classic:1": classic, "modern:2": modern} {
		s := newStore(t)
		got, err := s.Import(context.Background(), p, nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want := []string{"sha256:" + hex(l1), "sha256:" + hex(l2), "sha256:" + hex(l1)}
		if len(got) != 1 || got[0].Name != name || got[0].Image.ID != "sha256:"+cfgHex ||
			!reflect.DeepEqual(got[0].Image.Layers, want) || got[0].Image.Size != 3 ||
			!reflect.DeepEqual(got[0].Image.Config.Cmd, []string{"run"}) {
			t.Errorf("%s: got %+v", name, got)
		}
		if b, err := os.ReadFile(filepath.Join(s.LayerPath(want[1]), "two")); err != nil || string(b) != "22" {
			t.Errorf("%s: two = %q, %v", name, b, err)
		}
	}

	// A content-addressed blob whose content does not match its name.
	tampered := append([]file(nil), blobs...)
	tampered[3] = file{name: "blobs/sha256/" + hex(l2), body: mkTar(t, ent{name: "two", body: "XX"})}
	p := mkArchive(tampered, []desc{{Config: "blobs/sha256/" + cfgHex, Layers: []string{"blobs/sha256/" + hex(l1), "blobs/sha256/" + hex(l2), "blobs/sha256/" + hex(l1)}}})
	s := newStore(t)
	_, err := s.Import(context.Background(), p, nil)
	mustErrContain(t, err, "layer sha256:"+hex(l2), "compressed digest mismatch", "sha256:"+hex(l2))
	if s.HasLayer("sha256:" + hex(l2)) {
		t.Error("tampered layer is in the store")
	}
	// A config whose content does not match its name.
	p = mkArchive([]file{{name: "aaa/layer.tar", body: l1}, {name: strings.Repeat("0", 64) + ".json", body: cfgBytes}},
		[]desc{{Config: strings.Repeat("0", 64) + ".json", Layers: []string{"aaa/layer.tar"}}})
	_, err = s.Import(context.Background(), p, nil)
	mustErrContain(t, err, "content digest is sha256:"+cfgHex)
}
